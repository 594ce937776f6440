"""The HDF5 files the installed wheels ship (PyTables' and h5py's test data): real inputs, made by others.

Every dataset in them is read by every engine (in every mode, the first of
each kind of rows in a file), as h5py reads it (``ds[()]``; PyTables' ``node[:]`` where h5py cannot read it), or refused
up front with a MultitablesError; ``auto`` refuses only what no engine reads,
and then every engine refuses it the same way. The files are found at test
time in the installed distributions, never copied here.
"""

from __future__ import annotations

import importlib.metadata
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import tables

import multitables
from _guards import hang_guard
from _readall import ENGINES, MODES, Got, Table, read

SUFFIXES = {".h5", ".hdf5", ".hdf", ".he5", ".nc"}
#: Guards against a hang only (a file takes well under a second to read).
FILE_GUARD = 60.0


def _corpus() -> list[tuple[str, Path]]:
    """(path relative to site-packages, file) for every HDF5 file an installed distribution lists."""
    found: dict[str, Path] = {}
    for dist in importlib.metadata.distributions():
        for entry in dist.files or ():
            if entry.suffix.lower() in SUFFIXES:
                path = Path(dist.locate_file(entry))
                if path.is_file() and h5py.is_hdf5(path):
                    found.setdefault(entry.as_posix(), path)
    return sorted(found.items())


CORPUS = _corpus()


@dataclass
class Target:
    """One dataset and what the reference libraries read from it."""

    name: str
    ref: "np.ndarray | None"  # None: neither h5py nor PyTables reads it
    strict: bool  # the reference is h5py's: the delivered dtype must be its dtype
    source: str  # which library the reference comes from, or why there is none
    columns: dict[str, "np.ndarray | None"] = field(default_factory=dict)


def _targets(path: Path) -> list[Target]:
    """Every dataset h5py finds (visititems), and the leaves only PyTables finds."""
    names: list[str] = []
    h5 = tf = None
    try:
        try:
            h5 = h5py.File(path, "r")
            h5.visititems(lambda name, obj: names.append("/" + name) if isinstance(obj, h5py.Dataset) else None)
        except Exception:
            h5 = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PyTables warns of flavors and types it does not know
            try:
                tf = tables.open_file(path, "r")
                names += [leaf._v_pathname for leaf in tf.walk_nodes("/", classname="Leaf") if leaf._v_pathname not in names]
            except Exception:
                pass
            return [_target(h5, tf, name) for name in names]
    finally:
        if tf is not None:
            tf.close()
        if h5 is not None:
            h5.close()


def _target(h5: Any, tf: Any, name: str) -> Target:
    why = []
    if h5 is not None:
        try:
            ds = h5[name]
            ref = np.asarray(ds[()])
            columns = {col: np.asarray(ds.fields(col)[()]) for col in ds.dtype.names or ()}
            return Target(name, ref, True, "h5py", _nested(columns) if len(ref) else {})
        except Exception as exc:
            why.append(f"h5py: {type(exc).__name__}: {' '.join(str(exc).split())[:150]}")
    if tf is not None:
        try:
            # np.asarray: a leaf of the old "python" flavor reads as lists
            ref = np.asarray(tf.get_node(name)[:])
            columns = {col: ref[col] for col in ref.dtype.names or ()}
            return Target(name, ref, False, "PyTables", _nested(columns) if len(ref) else {})
        except Exception as exc:
            why.append(f"PyTables: {type(exc).__name__}: {' '.join(str(exc).split())[:150]}")
    return Target(name, None, False, "none (" + "; ".join(why) + ")")


def _nested(columns: "dict[str, np.ndarray]") -> "dict[str, np.ndarray]":
    """``columns`` and, for each column that is itself a compound, each of its columns by PyTables' path
    (``'outer/inner'``), as deep as they go."""
    out = dict(columns)
    for col, values in columns.items():
        if values.dtype.names:
            out.update(_nested({f"{col}/{sub}": np.ascontiguousarray(values[sub]) for sub in values.dtype.names}))
    return out


class _Readers:
    """One Reader per engine for the whole file, opened when first needed."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._open: dict[str, Any] = {}

    def read(self, name: str, engine: str) -> Got:
        reader = self._open.get(engine)
        if reader is None:
            try:
                reader = self._open[engine] = multitables.Reader(self._path, n_procs=1, engine=engine)
            except Exception as exc:
                self._open[engine] = exc
                return Got(error=exc, phase="opening the Reader")
        if isinstance(reader, Exception):
            return Got(error=reader, phase="opening the Reader")
        return read(self._path, name, engine, "reader", reader=reader)

    def close(self) -> None:
        for reader in self._open.values():
            if isinstance(reader, multitables.Reader):
                reader.close(wait=True)


def test_the_corpus_is_there() -> None:
    ids = [i for i, _ in CORPUS]
    assert len(ids) >= 40, f"only {len(ids)} HDF5 files found in the installed distributions: {ids}"
    assert any(i.startswith("tables/") for i in ids) and any(i.startswith("h5py/") for i in ids), ids


@pytest.mark.parametrize("path", [p for _, p in CORPUS], ids=[i for i, _ in CORPUS])
def test_reads_as_h5py_or_refuses(path: Path, no_leaks: None) -> None:
    results: list[Table] = []
    with hang_guard(FILE_GUARD, str(path)):
        readers = _Readers(path)
        kinds: set[object] = set()
        try:
            for t in _targets(path):
                table = Table(f"{t.name} [ref: {t.source}]")
                kind = t.name if t.ref is None else (t.ref.dtype, t.ref.shape[1:], t.strict)
                # A kind of rows this file showed already: read once more in direct mode (the path every other
                # mode shares: describing, planning, decoding), not by every mode again.
                modes = ("direct",) if kind in kinds else MODES
                kinds.add(kind)
                for engine in ENGINES:
                    for mode in modes:
                        got = readers.read(t.name, engine) if mode == "reader" else read(path, t.name, engine, mode)
                        table.add(engine, mode, got, t.ref, t.strict)
                results.append(table)
                # Columns: each in direct mode, and the first also from a generator.
                for i, (col, ref) in enumerate(t.columns.items()):
                    table = Table(f"{t.name}[{col!r}] [ref: {t.source}]")
                    for engine in ENGINES:
                        for mode in ("direct", "generator") if i == 0 else ("direct",):
                            table.add(engine, mode, read(path, t.name, engine, mode, field=col), ref, t.strict)
                    results.append(table)
        finally:
            readers.close()
    failures = [line.replace(str(path), "<file>") for table in results for line in table.failures()]
    assert not failures, f"in {path} (<file>):\n" + "\n".join(failures)


@pytest.mark.parametrize("path", [p for _, p in CORPUS], ids=[i for i, _ in CORPUS])
def test_a_file_twice_is_a_set_of_its_rows_twice(path: Path, no_leaks: None) -> None:
    """A set (NOTE [file sets]) of the file listed twice reads each dataset's rows twice, or refuses as the file does."""
    failures: list[str] = []
    kinds: set[object] = set()
    with hang_guard(FILE_GUARD, str(path)):
        for t in _targets(path):
            if t.ref is None or t.ref.ndim == 0:
                continue
            twice = np.concatenate([t.ref, t.ref], dtype=t.ref.dtype)  # numpy would make it native-endian
            table = Table(f"{t.name} twice [ref: {t.source}]")
            kind = (t.ref.dtype, t.ref.shape[1:], t.strict)
            for mode in ("direct",) if kind in kinds else ("direct", "reader"):  # as above
                got = read([path, path], t.name, "auto", mode)
                if got.refusal is not None:
                    alone = read(path, t.name, "auto", mode)
                    if alone.refusal is None or type(alone.refusal) is not type(got.refusal):
                        failures.append(f"{t.name}: the set refuses ({got.refusal!r}) but the file alone does not")
                table.add("auto", mode, got, twice, t.strict)
            kinds.add(kind)
            failures += table.failures(auto_rule=False)
    failures = [line.replace(str(path), "<file>") for line in failures]
    assert not failures, f"in {path} (<file>):\n" + "\n".join(failures)
