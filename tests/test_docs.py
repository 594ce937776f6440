"""The documentation builds, with every Sphinx warning treated as an error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Seconds the build may take (it takes a few on a laptop).
BUILD_TIMEOUT = 300


def test_docs_build_without_warnings(tmp_path: Path) -> None:
    pytest.importorskip("sphinx")
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "docs", str(tmp_path / "html")]
    result = subprocess.run(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=BUILD_TIMEOUT
    )
    assert result.returncode == 0, f"{' '.join(cmd)} exited with {result.returncode}:\n{result.stdout}"
    for page in ("index", "howto", "design", "failures", "reference"):
        assert (tmp_path / "html" / f"{page}.html").is_file(), f"{page}.html was not built"


def test_reference_covers_the_public_api() -> None:
    import multitables

    reference = (ROOT / "docs" / "reference.rst").read_text()
    documented = {
        line.split("::", 1)[1].strip().rstrip("()")
        for line in reference.splitlines()
        if line.startswith(".. auto") or line.startswith(".. data::")
    }
    missing = sorted(set(multitables.__all__) - documented)
    assert not missing, f"docs/reference.rst does not document {missing}"
