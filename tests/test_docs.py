"""The documentation builds, with every Sphinx warning treated as an error."""

from __future__ import annotations

import inspect
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


def test_napoleon_reads_no_attribute_docstring_as_a_type() -> None:
    """Napoleon takes the first line of a property's or attribute's docstring, up to a colon, for its type: "Rows an
    epoch holds: each dataset's" showed as "Type: Rows an epoch holds". The public classes' first lines have none."""
    pytest.importorskip("sphinx")
    from sphinx.ext.napoleon import Config, NumpyDocstring
    from sphinx.pycode import ModuleAnalyzer

    import multitables

    config = Config(napoleon_use_ivar=True, napoleon_preprocess_types=True)  # as docs/conf.py
    typed = []
    for name in multitables.__all__:
        cls = getattr(multitables, name)
        if not inspect.isclass(cls):
            continue
        docs = {k: inspect.getdoc(v) or "" for k, v in vars(cls).items() if isinstance(v, property)}
        for (owner, attribute), lines in ModuleAnalyzer.for_module(cls.__module__).find_attr_docs().items():
            if owner == cls.__qualname__:  # ``#:`` comments of attributes
                docs[attribute] = "\n".join(lines)
        for attribute, doc in docs.items():
            parsed = NumpyDocstring(doc, config, what="attribute", name=f"{name}.{attribute}")
            if not attribute.startswith("_") and ":type:" in str(parsed):
                typed.append(f"{name}.{attribute}: {doc.splitlines()[0]}")
    assert not typed, "napoleon shows these as types (the words before the colon):\n" + "\n".join(typed)
