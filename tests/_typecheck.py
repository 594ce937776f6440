"""What a user's type checker says of code: ``mypy --strict`` run on a snippet, against marks in its lines.

mypy is no test dependency: without it these tests skip, and the overloads' own tests (``typing.get_overloads``
read in tests/test_batches.py and tests/test_torch.py) still hold the keywords and the kinds of batch.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import multitables


_CACHE: "list[str]" = []


def _cache_dir() -> str:
    """One mypy cache for this session's runs: the package is analysed once (~20 s cold), not once a test; made
    afresh each session (nothing stale), removed at exit."""
    if not _CACHE:
        _CACHE.append(tempfile.mkdtemp(prefix="multitables-mypy-"))
        atexit.register(shutil.rmtree, _CACHE[0], True)
    return _CACHE[0]


def mypy_says(code: str, tmp_path: Path) -> "tuple[dict[int, str], dict[int, str]]":
    """``mypy --strict`` on ``code`` with the package as installed (its ``py.typed`` read): ``(revealed, errors)``, each
    by line, numpy's and the package's module names left out of the types."""
    pytest.importorskip("mypy", reason="mypy is not installed (the overloads' run-time tests hold without it)")
    (tmp_path / "user.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(Path(multitables.__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir", _cache_dir(), "--no-error-summary",
                          "--hide-error-context", "user.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300).stdout
    out = re.sub(r"numpy\.ndarray\[tuple\[Any, \.\.\.\], numpy\.dtype\[Any\]\]", "ndarray", out)
    out = re.sub(r"multitables\.[\w.]*\.(?=[A-Z])|torch\._tensor\.", "", out)
    revealed = {int(n): t for n, t in re.findall(r'^user\.py:(\d+): note: Revealed type is "(.*)"$', out, re.M)}
    errors: dict[int, str] = {}
    for n, code_ in re.findall(r"^user\.py:(\d+): error: .*\[([\w-]+)\]$", out, re.M):
        errors.setdefault(int(n), code_)
    return revealed, errors


def expected_of(code: str) -> "tuple[dict[int, str], dict[int, str]]":
    """The ``# reveal: TYPE`` and ``# error: CODE`` marks of ``code``, by line."""
    lines = enumerate(code.splitlines(), 1)
    marks = [(n, *m.groups()) for n, line in lines if (m := re.search(r"# (reveal|error): (.*)$", line))]
    return {n: t for n, k, t in marks if k == "reveal"}, {n: t for n, k, t in marks if k == "error"}
