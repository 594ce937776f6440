"""Read one dataset with each engine of multitables, in each mode, and say how it went.

Shared by ``test_real_files`` and ``test_corpus``. Every read ends in one of:

* a read: the rows as delivered, to compare with a reference (h5py's ``ds[()]``,
  or PyTables' ``node[:]`` where h5py cannot read the node);
* a refusal: a :class:`multitables.MultitablesError` raised before reading
  (by ``get_queue``, ``get_generator`` and its first ``next()``, or ``get_dataset``);
  a :class:`multitables.ReaderError` is a failed read, never a refusal;
* an error: anything else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np
import psutil

import multitables

ENGINES = ("auto", "chunks", "h5py", "tables")
#: direct: the queue's blocks (in-process for small datasets); generator: rows from one
#: reader process; reader: random access (all rows, then rows [n-1, 0]) from a Reader.
MODES = ("direct", "generator", "reader")
MissingFilterError = getattr(multitables, "MissingFilterError", multitables.MultitablesError)


# -- reading -------------------------------------------------------------------


@dataclass
class Got:
    """What one read gave: ``data`` (or ``rows`` from a generator), or ``refusal``, or ``error``."""

    data: "np.ndarray | None" = None
    rows: "list[Any] | None" = None
    picked: "np.ndarray | None" = None  # reader mode: rows [n-1, 0]
    engine: "str | None" = None  # the engine that really read (direct mode)
    refusal: "BaseException | None" = None
    error: "BaseException | None" = None
    phase: str = ""


def is_refusal(exc: BaseException) -> bool:
    return isinstance(exc, multitables.MultitablesError) and not isinstance(exc, multitables.ReaderError)


def _before_reading(exc: Exception, phase: str = "before reading") -> Got:
    return Got(refusal=exc) if is_refusal(exc) else Got(error=exc, phase=phase)


def read_direct(path: Any, name: str, engine: str, field: "str | None" = None) -> Got:
    """Every block of ``get_queue`` (default n_procs, ordered, remainder included), concatenated."""
    try:
        queue = multitables.Streamer(path, engine=engine).get_queue(name, ordered=True, remainder=True, field=field)
    except Exception as exc:
        return _before_reading(exc)
    try:
        with queue:
            blocks = []
            for guard in queue.iter():
                with guard as block:
                    blocks.append(block.copy())
    except Exception as exc:
        return Got(error=exc, phase="while reading blocks")
    if not blocks:
        return Got(rows=[], engine=queue.engine)  # right only for an empty dataset
    dtypes = {block.dtype for block in blocks}
    if len(dtypes) > 1:
        return Got(error=TypeError(f"blocks of several dtypes: {sorted(map(str, dtypes))}"), phase="after reading")
    # dtype=: numpy's own choice would make a compound native-endian and drop its padding
    return Got(data=np.concatenate(blocks, dtype=blocks[0].dtype), engine=queue.engine)


def read_generator(path: Any, name: str, engine: str, field: "str | None" = None) -> Got:
    """Every row of ``get_generator`` with one reader process."""
    end = object()
    try:
        gen = multitables.Streamer(path, engine=engine).get_generator(name, n_procs=1, ordered=True, field=field)
    except Exception as exc:
        return _before_reading(exc)
    try:
        first = next(gen, end)
    except Exception as exc:
        gen.close()
        return _before_reading(exc, "at the first next()")
    try:
        rows = [] if first is end else [first, *gen]
        return Got(rows=rows)
    except Exception as exc:
        return Got(error=exc, phase="while reading rows")
    finally:
        gen.close()


def read_random(reader: "multitables.Reader", name: str, field: "str | None" = None) -> Got:
    """All rows (``ds[:]``) and rows ``[n-1, 0]`` (a coordinate request) through ``reader``."""
    try:
        ds = reader.get_dataset(name)
    except Exception as exc:
        return _before_reading(exc)
    try:
        n = len(ds)
        if n == 0:
            return Got(rows=[])  # nothing to request (a stage holds at least one row)
        whole = ds if field is None else ds.col(field)
        with ds.create_stage(n) as stage:
            data = np.asarray(reader.request(whole[:], stage).get()).copy()
            picked = np.asarray(reader.request(whole[np.array([n - 1, 0])], stage).get()).copy()
        return Got(data=data, picked=picked)
    except Exception as exc:
        return Got(error=exc, phase="while reading requests")


def read(path: Any, name: str, engine: str, mode: str, field: "str | None" = None, reader: Any = None) -> Got:
    """Read ``name`` (column ``field``) of ``path`` with ``engine`` in ``mode``; ``reader``: an open Reader to reuse."""
    if mode == "direct":
        return read_direct(path, name, engine, field)
    if mode == "generator":
        return read_generator(path, name, engine, field)
    if mode == "reader":
        if reader is not None:
            return read_random(reader, name, field)
        try:
            own = multitables.Reader(path, n_procs=1, engine=engine)
        except Exception as exc:
            return Got(error=exc, phase="opening the Reader")
        with own:
            return read_random(own, name, field)
    raise ValueError(f"mode={mode!r} is not one of {MODES}")


def live_children() -> "set[int]":
    """Live child processes, multiprocessing's resource tracker aside (it lives as long as this process): the same
    before and after a refusal, which starts no reader."""
    kids = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline()):
                kids.add(child.pid)
        except psutil.Error:
            pass
    return kids


def h5py_reference(path: Any, name: str, field: "str | None" = None) -> np.ndarray:
    """What h5py reads: ``ds[()]``, or the column ``ds.fields(field)[()]``; a column of a nested compound
    (``'outer/inner'``, PyTables' path) is taken out of its outer column as numpy does."""
    with h5py.File(path, "r") as f:
        ds = f[name]
        if field is None:
            return np.asarray(ds[()])
        outer, *inner = field.split("/")
        column = np.asarray(ds.fields(outer)[()])
        for part in inner:
            column = column[part]
        return np.ascontiguousarray(column)


def read_all(
    path: Any, name: str, ref: "np.ndarray | None", *, strict: bool = True, field: "str | None" = None, label: str = ""
) -> "Table":
    """Read ``name`` with every engine in every mode (a Reader of its own each time), judged against ``ref``."""
    table = Table(label or (name if field is None else f"{name}[{field!r}]"))
    for engine in ENGINES:
        for mode in MODES:
            table.add(engine, mode, read(path, name, engine, mode, field), ref, strict)
    return table


# -- judging -------------------------------------------------------------------


def value_mismatch(got: np.ndarray, ref: np.ndarray, where: str = "") -> "str | None":
    """Why ``got`` does not hold ``ref``'s values (None: it does).

    Compounds are compared field by field (same names, same order); each element
    type must have the reference's kind and size, in either byte order; NaNs equal NaNs.
    """
    if got.shape != ref.shape:
        return f"{where}shape {got.shape}, expected {ref.shape}"
    if ref.dtype.names is not None:
        if got.dtype.names != ref.dtype.names:
            return f"{where}fields {got.dtype.names}, expected {ref.dtype.names}"
        for name in ref.dtype.names:
            problem = value_mismatch(got[name], ref[name], f"{where}field {name!r}: ")
            if problem:
                return problem
        return None
    g, r = got.dtype, ref.dtype
    if (g.kind, g.itemsize) != (r.kind, r.itemsize):
        return f"{where}element type {g.str}, expected {r.str} (kind and size)"
    if r.kind == "V":  # opaque: the bytes
        same = np.array([a.tobytes() == b.tobytes() for a, b in zip(got.ravel(), ref.ravel())], bool).reshape(ref.shape)
    else:
        same = np.asarray(got == ref, bool)
        if r.kind in "fc":
            same |= np.isnan(got) & np.isnan(ref)
    if same.all():
        return None
    bad = np.argwhere(~same)
    first = tuple(int(i) for i in bad[0])
    return f"{where}{len(bad)} of {same.size} values differ; first at {first}: got {got[first]!r}, expected {ref[first]!r}"


def mismatch(got: np.ndarray, ref: np.ndarray, strict: bool) -> "str | None":
    """Why ``got`` is not ``ref``; ``strict``: the dtype must also be ``ref.dtype`` (h5py's mapping)."""
    if got.shape != ref.shape:
        return f"shape {got.shape}, expected {ref.shape}"
    if strict and got.dtype != ref.dtype:
        return f"delivered dtype {got.dtype}, h5py's is {ref.dtype}"
    return value_mismatch(got, ref)


def rows_mismatch(rows: list[Any], ref: np.ndarray, strict: bool) -> "str | None":
    """As :func:`mismatch`, for a generator's rows.

    Rows of a 1-d dataset are numpy scalars: their values count, not their
    scalar types' byte order (nor a string scalar's length); compound rows
    (``np.void``) and array rows keep the delivered dtype, which must be h5py's.
    """
    if len(rows) != len(ref):
        return f"{len(rows)} rows, expected {len(ref)}"
    if not rows:
        return None
    if all(isinstance(row, (np.ndarray, np.void)) for row in rows):
        dtypes = {row.dtype for row in rows}
        if len(dtypes) > 1:
            return f"rows of several dtypes: {sorted(map(str, dtypes))}"
        (dtype,) = dtypes
        if strict and dtype != ref.dtype:
            return f"rows of dtype {dtype}, h5py's is {ref.dtype}"
        got = np.array(rows, dtype=dtype) if isinstance(rows[0], np.void) else np.stack(rows, dtype=dtype)
    else:
        got = np.array(rows)
        if got.dtype.kind in "SU" and got.dtype.kind == ref.dtype.kind and got.dtype.itemsize <= ref.dtype.itemsize:
            got = got.astype(ref.dtype)  # a string scalar is as long as its value
    return value_mismatch(got, ref)


def judge(got: Got, ref: "np.ndarray | None", strict: bool) -> "str | None":
    """None where ``got`` is a correct read of ``ref`` or a refusal; else what went wrong."""
    if got.refusal is not None:
        return None
    if got.error is not None:
        return describe(got)
    if ref is None:
        return "read, but neither h5py nor PyTables reads it, so nothing can check the values"
    if got.rows is not None:
        return rows_mismatch(got.rows, ref, strict)
    assert got.data is not None
    problem = mismatch(got.data, ref, strict)
    if problem is None and got.picked is not None and len(ref):
        problem = mismatch(got.picked, ref[[len(ref) - 1, 0]], strict)
        if problem:
            problem = f"rows [n-1, 0]: {problem}"
    return problem


def describe(got: Got, problem: "str | None" = None) -> str:
    """One line: what happened."""
    if got.refusal is not None:
        return f"refused: {type(got.refusal).__name__}: {_short(got.refusal)}"
    if got.error is not None:
        return f"ERROR {got.phase}: {type(got.error).__name__}: {_short(got.error)}"
    by = f" (by {got.engine})" if got.engine else ""
    return f"WRONG{by}: {problem}" if problem else f"read{by}"


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split("\n\nOriginal traceback")[0].split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class Table:
    """Outcomes of one dataset (or column) for every engine and mode, and the checks on them."""

    label: str
    lines: dict[tuple[str, str], str] = field(default_factory=dict)
    gots: dict[tuple[str, str], Got] = field(default_factory=dict)
    problems: dict[tuple[str, str], "str | None"] = field(default_factory=dict)

    def add(self, engine: str, mode: str, got: Got, ref: "np.ndarray | None", strict: bool) -> None:
        problem = judge(got, ref, strict)
        self.gots[engine, mode] = got
        self.problems[engine, mode] = problem
        self.lines[engine, mode] = describe(got, problem)

    def failures(self, auto_rule: bool = True) -> list[str]:
        """Wrong reads and errors; with ``auto_rule``, an ``auto`` refusal where some engine reads, or refuses otherwise,
        in the same mode (a stream refuses a node of no rows, which random access takes)."""
        out = self._grouped([key for key, problem in self.problems.items() if problem])
        refused = {m for (e, m), g in self.gots.items() if e == "auto" and g.refusal is not None}
        if auto_rule and refused:
            kinds = {(m, type(g.refusal).__name__ if g.refusal is not None else "a read")
                     for (_, m), g in self.gots.items() if m in refused}
            if len(kinds) > len(refused):
                out.append(f"{self.label}: auto refuses, but not every engine refuses the same way:")
                out += ["    " + line for line in self._grouped(list(self.gots), label=False)]
        return out

    def _grouped(self, keys: list[tuple[str, str]], label: bool = True) -> list[str]:
        """One line per distinct outcome: which engine/mode pairs had it (all of them: "every engine, mode")."""
        by_line: dict[str, list[str]] = {}
        for engine, mode in keys:
            by_line.setdefault(self.lines[engine, mode], []).append(f"{engine}/{mode}")
        head = f"{self.label}: " if label else ""
        return [
            f"{head}{'every engine, mode' if len(pairs) == len(self.lines) > 1 else ', '.join(pairs)}: {line}"
            for line, pairs in by_line.items()
        ]

    def not_read(self, may_refuse: tuple[str, ...] = (), naming: str = "") -> list[str]:
        """Every outcome that is not a correct read, but refusals by ``may_refuse`` engines whose message names ``naming``."""
        keys = []
        for (engine, mode), got in self.gots.items():
            refusal = got.refusal
            excused = refusal is not None and engine in may_refuse and naming in str(refusal)
            if self.problems[engine, mode] or (refusal is not None and not excused):
                keys.append((engine, mode))
        return self._grouped(keys)
