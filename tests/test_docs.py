"""The documentation builds, with every Sphinx warning treated as an error, and its first examples run as written."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
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


# The examples a new user runs first (the README's two, which go on from one another, the index page's and each
# guide's opening one) run as written against small files of the shapes the text describes; placeholders the text
# leaves to the reader (``do_something``, ``model``) are stand-ins. What an example says it computes is checked.
#: (page, how many of its first Python examples run, in one namespace)
_FIRST_EXAMPLES = [("README.md", 2), ("docs/index.rst", 1), ("docs/howto.rst", 1), ("docs/random_access.rst", 1),
                   ("docs/training.rst", 1), ("docs/failures.rst", 1)]


def _python_blocks(page: str) -> list[str]:
    """The Python examples of ``page`` (a README's fenced blocks or reST code blocks), dedented, in order."""
    lines, blocks = (ROOT / page).read_text().splitlines(), []
    for i, line in enumerate(lines):
        if line.startswith("```python"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            blocks.append("\n".join(lines[i + 1 : end]))
        elif re.fullmatch(r"\s*\.\. code-block:: python\s*", line):
            indent, body = len(line) - len(line.lstrip()), []
            for following in lines[i + 1 :]:
                if following.strip() and len(following) - len(following.lstrip()) <= indent:
                    break
                body.append(following)
            blocks.append(textwrap.dedent("\n".join(body)).strip("\n"))
    return blocks


def _example_files(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """``data.h5`` (``/data`` and a PyTables ``/table`` with ``col_A``) and ``train.h5`` (``/X``, ``/y``) in
    ``folder``; returns ``/data`` and ``/table``'s rows."""
    import h5py
    import tables

    rng = np.random.default_rng(0)
    # 12 MiB in chunks of 256 KiB: default blocks of 4 MiB (1,024 rows) leave a remainder of 952 rows
    data = rng.integers(0, 100, (3000, 1024)).astype(np.float32)
    records = np.zeros(300, [("col_A", "<f8"), ("col_B", "<i4")])
    records["col_A"], records["col_B"] = rng.random(300), np.arange(300)
    with tables.open_file(str(folder / "data.h5"), "w") as f:
        f.create_carray("/", "data", obj=data, chunkshape=(64, 1024), filters=tables.Filters(3, "zlib", shuffle=True))
        f.create_table("/", "table", obj=records)
    with h5py.File(folder / "train.h5", "w") as f:
        f.create_dataset("X", data=rng.random((1000, 3)), chunks=(250, 3), compression="gzip")
        f.create_dataset("y", data=rng.integers(0, 10, 1000))
    return data, records


@pytest.mark.parametrize(("page", "count"), _FIRST_EXAMPLES, ids=[page for page, _ in _FIRST_EXAMPLES])
def test_first_examples_run_as_written(page: str, count: int, tmp_path: Path, monkeypatch, no_leaks) -> None:
    data, records = _example_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    done: list[np.ndarray] = []
    scope = {"__name__": "__main__", "do_something": lambda block: done.append(block.copy()),
             "model": lambda x, y: float(x.sum())}
    for k, example in enumerate(_python_blocks(page)[:count]):
        exec(compile(example, f"{page}, example {k + 1}", "exec"), scope)
    if page == "README.md":
        # direct access, then the remainder: every row once
        assert scope["total"] == pytest.approx(data.sum(dtype=np.float64), rel=1e-5)
        # the established loop: blocks of 1024 rows, the remainder left out; then a column's rows 30..34
        assert sum(map(len, done)) == len(data) // 1024 * 1024 and {len(b) for b in done} == {1024}
        assert np.array_equal(scope["rows"], records["col_A"][30:35])
    if page == "docs/random_access.rst":
        assert np.array_equal(scope["rows"], data[[3, 17, 900]])


def test_the_empty_batch_warning_points_at_the_section_that_explains_it(tmp_path: Path) -> None:
    """A warning's pointer into the docs leads to the words it promises."""
    import multitables

    _example_files(tmp_path)
    stream = multitables.Streamer(str(tmp_path / "train.h5"))
    with pytest.warns(UserWarning, match="empty") as warned:  # 1000 rows, 3 ranks of 333: 1 row for the last step
        stream.get_batches("/y", 333, rank=0, world_size=3, n_procs=0).close()
    cited = re.search(r"\((docs/\w+\.rst), '([^']+)'\)", str(warned[0].message))
    assert cited, f"the warning names no section of the docs: {warned[0].message}"
    assert "empty" in _section(*cited.groups())


def _section(page: str, title: str) -> str:
    """The text of section ``title`` of ``page`` (up to the next heading of any level), or an AssertionError."""
    lines = (ROOT / page).read_text().splitlines()
    heading = re.compile(r"([=\-^~\"'`#*+])\1{2,}")
    starts = [i for i in range(len(lines) - 1) if lines[i].strip() and heading.fullmatch(lines[i + 1])]
    for k, i in enumerate(starts):
        if lines[i].strip() == title:
            return "\n".join(lines[i : starts[k + 1] if k + 1 < len(starts) else len(lines)])
    raise AssertionError(f"{page} has no section {title!r}")


def test_sections_cited_by_messages_exist() -> None:
    """Messages of the package that send the reader to ``(docs/page.rst, 'Section')`` name a section there."""
    cited = [(path, m.groups()) for path in sorted((ROOT / "multitables").rglob("*.py"))
             for m in re.finditer(r"\((docs/\w+\.rst),[\s\"]*'([^']+)'\)", path.read_text())]
    assert cited, "no citation found: the pattern no longer matches how messages cite the docs"
    for path, (page, title) in cited:
        _section(page, title)  # raises, naming the page and the title
