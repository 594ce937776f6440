"""Placeholder replaced by the benchmark issue."""


def main() -> None:
    raise SystemExit("not yet")
