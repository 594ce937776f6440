"""The package's layout: its folders are its data path, and imports only go down it.

Layers, bottom to top: ``errors`` and ``_sys`` (what everything may use),
``_plan`` (pure planning), ``_io`` (rows into a caller's buffer), ``_shm``
(shared memory), ``_procs`` (reader processes), then the public faces' parts,
grouped by the face they serve: ``_stream`` (the streamer's queue), above it
``_train`` (batches, built on queues) beside ``_access`` (random access), and
the public faces at the top level. A module imports from its own layer or
below, never from a folder beside its own on the same layer, never a private
name from beside or above it, and no module takes part in an import cycle
(imports under ``TYPE_CHECKING`` are for annotations only and do not count).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "multitables"
#: Bottom to top; the folders of one entry share a layer and may not import each other.
LAYERS: "list[tuple[str, ...]]" = [("errors",), ("_sys",), ("_plan",), ("_io",), ("_shm",), ("_procs",), ("_stream",), ("_train", "_access")]
FOLDERS = [name for layer in LAYERS for name in layer]
FACES = len(LAYERS)  # the top-level public modules
#: Most lines a module may have: one idea per module, readable in one sitting.
MAX_LINES = 500


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return FACES  # multitables itself
    for i, layer in enumerate(LAYERS):
        if parts[1] in layer:
            return i
    return FACES


def _folder(module: str) -> "str | None":
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FOLDERS else None


def _resolve(module: str, is_package: bool, level: int, target: "str | None") -> str:
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _runtime_imports(path: Path) -> "list[tuple[str, list[str]]]":
    """(module imported, names taken from it) for each import in ``path`` outside ``if TYPE_CHECKING:``."""
    module = _module_name(path)
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for sub in node.body for n in ast.walk(sub))
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            target = _resolve(module, path.name == "__init__.py", node.level, node.module)
            found.append((target, [a.name for a in node.names]))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("multitables"):
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((a.name, []) for a in node.names if a.name.startswith("multitables"))
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))
NAMES = {_module_name(p) for p in MODULES}


def _target_module(target: str, name: str) -> str:
    """The module an ``from target import name`` takes ``name`` from (a submodule, if it is one)."""
    return f"{target}.{name}" if f"{target}.{name}" in NAMES else target


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _module_name(p))
def test_imports_go_down_the_data_path(path: Path) -> None:
    module = _module_name(path)
    if module == "multitables":
        return  # the package gathers its public names from every face
    mine = _layer(module)
    for target, names in _runtime_imports(path):
        for name in names or [""]:
            source = _target_module(target, name) if name else target
            if not source.startswith("multitables"):
                continue
            assert _layer(source) <= mine, f"{module} imports {source} (a layer above it)"
            if _layer(source) == mine and mine < FACES:
                assert _folder(source) == _folder(module), f"{module} imports {source}, a folder beside its own"
            if name.startswith("_") and source != f"{target}.{name}":
                assert _layer(source) < mine, f"{module} takes the private name {name} from {source}, beside it"


def test_no_module_takes_part_in_an_import_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        module = _module_name(path)
        edges = graph.setdefault(module, set())
        for target, names in _runtime_imports(path):
            for name in names or [""]:
                source = _target_module(target, name) if name else target
                if source in NAMES and source != module and not module.startswith(source + "."):
                    edges.add(source)
    # A package importing its own submodules is how packages are built; not a cycle.
    seen: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        seen[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if seen.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in seen:
                visit(nxt)
        stack.pop()
        seen[node] = 2

    for node in sorted(graph):
        if node not in seen:
            visit(node)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _module_name(p))
def test_a_module_fits_in_one_reading(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{_module_name(path)} has {lines} lines; split it where the ideas part"


def test_the_top_level_holds_only_the_public_faces() -> None:
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == ["__init__", "__main__", "batches", "errors", "reader", "streamer", "torch"]
    import multitables

    # What a user's tab completion shows: the API, and the package's own modules (2.x's module names among them).
    shown = {n: getattr(multitables, n) for n in dir(multitables) if not n.startswith("_") and n not in multitables.__all__}
    stray = sorted(n for n, v in shown.items() if getattr(v, "__name__", "") != f"multitables.{n}")
    assert not stray, f"multitables shows {stray}, neither its API nor its modules"
    assert sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("__")) == sorted(FOLDERS[1:])


@pytest.mark.parametrize("path", sorted((PACKAGE / "_plan").glob("*.py")), ids=lambda p: _module_name(p))
def test_planning_starts_no_thread(path: Path) -> None:
    """``_plan`` decides; what runs beside the caller (a draw made ahead, a copy) lives in the layers above it."""
    tree = ast.parse(path.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
    assert not imported & {"threading", "concurrent", "_thread"}, f"{_module_name(path)} imports {imported & {'threading', 'concurrent', '_thread'}}"


def test_the_package_says_it_is_typed() -> None:
    """PEP 561: without ``py.typed`` in the installed package, a user's mypy or pyright sees every name as ``Any``."""
    root = PACKAGE
    assert (root / "py.typed").is_file()
    pyproject = (root.parent / "pyproject.toml").read_text()
    data = pyproject.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    assert 'multitables = ["py.typed"]' in data  # shipped in the wheel, not only present in the checkout
