"""Every dotted name, file path and NOTE the code and the docs refer to exists.

A docstring that names ``_io.blockread.read_block`` is code too: when a move
leaves it behind, a reader follows it to nothing. This walker finds, in the
package's sources (docstrings and comments) and in the documentation:

* dotted names of the package, absolute (``multitables._plan.blocks.ahead``)
  or from its folders (``_io.node.NodeInfo``), which must import and resolve
  attribute by attribute;
* paths of its files (``multitables/_shm/ring.py``), which must exist;
* ``NOTE [name] in module``, whose module must hold that NOTE, and every
  ``NOTE [name]``, which must be written somewhere in the package.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "multitables"
BENCH = ROOT / "multitables_bench"
#: What is read: the package's and the benchmark's sources, and the documentation (BENCHMARKS.md is a log of
#: past runs, left as written).
TEXTS = sorted(PACKAGE.rglob("*.py")) + sorted(BENCH.rglob("*.py")) + sorted((ROOT / "docs").glob("*.rst")) + [ROOT / "README.md"]
FOLDERS = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name.startswith("_") and p.name != "__pycache__")

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"(?<![\w./-])(multitables(?:_bench)?(?:\.{_IDENT})+|(?:{'|'.join(map(re.escape, FOLDERS))})(?:\.{_IDENT})+)")
#: A private dotted name quoted as code (````_node.open_node````): the package's, so it must resolve too.
_QUOTED_PRIVATE = re.compile(rf"``(_{_IDENT}(?:\.{_IDENT})+)``")
_PATH = re.compile(r"(?<![\w])(?:\.\./)?(multitables(?:_bench)?/[\w/]+\.(?:py|c))\b")
_NOTE_IN = re.compile(r"NOTE \[([^\]]+)\]\s+in\s+(?:the\s+)?``([^`]+)``")
_NOTE = re.compile(r"NOTE \[([^\]]+)\]")


def _resolve(dotted: str) -> bool:
    """Whether ``dotted`` names a module, or an attribute reached from one."""
    name = dotted if dotted.startswith("multitables") else f"multitables.{dotted}"
    parts = name.split(".")  # multitables_bench.x too
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError as exc:
            missing = exc if isinstance(exc, ModuleNotFoundError) else exc.__cause__
            if isinstance(missing, ModuleNotFoundError) and not (missing.name or "multitables").startswith("multitables"):
                return True  # there, but needs an optional dependency not installed (PyTorch): its names go unchecked
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _module_path(dotted: str, citing: Path) -> "Path | None":
    """The file of module ``dotted``: absolute, from the package, or beside the citing module (``in pool``)."""
    if dotted.startswith("multitables"):
        bases = [ROOT]
    else:
        bases = ([citing.parent] if citing.is_relative_to(PACKAGE) else []) + [PACKAGE]
    for base in bases:
        rel = Path(*dotted.removeprefix("multitables.").split(".")) if base != ROOT else Path(*dotted.split("."))
        for candidate in (base / rel.with_suffix(".py"), base / rel / "__init__.py"):
            if candidate.exists():
                return candidate
    return None


def _mentions(pattern: "re.Pattern[str]", across_lines: bool = False) -> "list[tuple[str, int, tuple[str, ...]]]":
    """Each match of ``pattern`` in the texts: (file, line, groups). ``across_lines``: a match may wrap
    (a line break, the indent and a comment's ``#`` after it read as one space, as in ``NOTE [creation\n    span]``)."""
    found = []
    for path in TEXTS:
        text = path.read_text()
        if not across_lines:
            for lineno, line in enumerate(text.splitlines(), 1):
                for m in pattern.finditer(line):
                    found.append((str(path.relative_to(ROOT)), lineno, m.groups()))
            continue
        pieces, lines = [], []  # the joined text, and the line each of its characters came from
        for lineno, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if line.startswith("#"):
                line = line.lstrip("#:").strip()
            pieces.append(line + " ")
            lines.extend([lineno] * (len(line) + 1))
        joined = "".join(pieces)
        for m in pattern.finditer(joined):
            found.append((str(path.relative_to(ROOT)), lines[m.start()], m.groups()))
    return found


def _written_notes() -> dict[str, set[str]]:
    """Every NOTE written in the sources (a line that starts ``NOTE [name]``, alone or with a colon), by module file."""
    notes: dict[str, set[str]] = {}
    for path in [*PACKAGE.rglob("*.py"), *BENCH.rglob("*.py")]:
        for line in path.read_text().splitlines():
            m = re.match(r"\s*NOTE \[([^\]]+)\](?::|\s*$)", line)
            if m:
                notes.setdefault(m.group(1), set()).add(str(path))
    return notes


def test_every_dotted_name_resolves() -> None:
    broken = []
    for where, lineno, (dotted,) in _mentions(_DOTTED):
        dotted = dotted.rstrip(".")
        if not _resolve(dotted):
            broken.append(f"{where}:{lineno}: {dotted}")
    for where, lineno, (dotted,) in _mentions(_QUOTED_PRIVATE):
        if dotted.endswith((".py", ".c", ".rst")):  # a file's name, checked as a path
            continue
        if not _resolve(dotted):
            broken.append(f"{where}:{lineno}: {dotted}")
    assert not broken, "names that do not resolve:\n" + "\n".join(sorted(set(broken)))


def test_every_file_named_exists() -> None:
    missing = [f"{where}:{lineno}: {rel}" for where, lineno, (rel,) in _mentions(_PATH) if not (ROOT / rel).exists()]
    assert not missing, "files that do not exist:\n" + "\n".join(missing)


def test_every_note_cited_is_written_where_it_is_said_to_be() -> None:
    written = _written_notes()
    wrong = []
    for where, lineno, (note,) in _mentions(_NOTE, across_lines=True):
        if note not in written:
            wrong.append(f"{where}:{lineno}: NOTE [{note}] is written nowhere")
    for where, lineno, (note, module) in _mentions(_NOTE_IN, across_lines=True):
        path = _module_path(module.removesuffix(".py").replace("/", "."), ROOT / where)
        if path is None:
            wrong.append(f"{where}:{lineno}: NOTE [{note}] in {module}: no such module")
        elif note in written and str(path) not in written[note]:
            wrong.append(f"{where}:{lineno}: NOTE [{note}] is not in {module} but in {sorted(written[note])}")
    assert not wrong, "\n".join(sorted(set(wrong)))


@pytest.mark.parametrize("dotted", ["multitables._plan.blocks.BlockPlan", "_io.node.NodeInfo", "multitables.Streamer.get_queue"])
def test_the_walker_resolves_what_exists(dotted: str) -> None:
    assert _resolve(dotted)


@pytest.mark.parametrize("dotted", ["multitables._request", "_io.node.NoSuchThing", "multitables.Streamer.no_such_method"])
def test_the_walker_refuses_what_does_not(dotted: str) -> None:
    assert not _resolve(dotted)


def test_every_public_error_is_exported() -> None:
    """``errors.__all__`` and ``multitables.__all__`` name every public exception class of ``multitables.errors``."""
    import multitables
    from multitables import errors

    classes = {name for name, obj in vars(errors).items() if isinstance(obj, type) and issubclass(obj, BaseException)}
    public = {name for name in classes if not name.startswith("_") and getattr(errors, name).__module__ == errors.__name__}
    assert public <= set(errors.__all__)
    assert public <= set(multitables.__all__)


def test_the_design_page_names_every_module() -> None:
    """docs/design.rst's layout table lists every module by its path in the package (a folder of codecs as one)."""
    table = (ROOT / "docs" / "design.rst").read_text()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" or "/codecs/" in rel:
            continue
        if f"``{rel}``" not in table:
            missing.append(rel)
    assert "``_io/chunks/codecs/``" in table
    assert not missing, f"docs/design.rst does not name: {missing}"


def _annotated(module: object) -> "list[tuple[str, object]]":
    """Each public class of ``module.__all__``, the functions and properties it defines (public ones and dunders,
    inherited ones included), and each public function: what a tool that reads annotations at run time asks."""
    import inspect

    found: list[tuple[str, object]] = []
    for name in module.__all__:  # type: ignore[attr-defined]
        obj = getattr(module, name)
        if inspect.isfunction(obj):
            found.append((name, obj))
        if not inspect.isclass(obj):
            continue
        found.append((name, obj))
        for klass in obj.__mro__:
            if not klass.__module__.startswith("multitables"):
                continue
            for attr, member in vars(klass).items():
                if attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__")):
                    continue
                member = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                if inspect.isfunction(member):
                    found.append((f"{name}.{attr}", member))
    return found


@pytest.mark.parametrize("module_name", ["multitables", "multitables.torch"])
def test_every_public_annotation_resolves_at_run_time(module_name: str) -> None:
    """``typing.get_type_hints`` resolves the annotations of every public class, method and function.

    pydantic, typeguard, beartype, Sphinx's ``autodoc_typehints`` and IDEs evaluate them; a name imported only
    under ``TYPE_CHECKING`` (one from a module above, which imports this one) must be bound at run time too
    (NOTE [annotations from above] in ``multitables/__init__.py``).
    """
    import typing

    if module_name == "multitables.torch":
        pytest.importorskip("torch")
    module = importlib.import_module(module_name)
    found = _annotated(module)
    assert len(found) > len(module.__all__)  # the walk found the methods too
    broken = []
    for label, obj in found:
        try:
            typing.get_type_hints(obj)
        except Exception as exc:  # NameError for an unbound name; anything else is as bad
            broken.append(f"{module_name}.{label}: {type(exc).__name__}: {exc}")
    assert not broken, "annotations that do not resolve:\n" + "\n".join(broken)
