"""``--read FILE:DATASET ...``: the main section's passes on a user's own datasets instead of generated files.

Each dataset is described and checked (:func:`check_read`) before any
pass, then measured as the main section measures a generated file
(:func:`passes.main_jobs`, :func:`passes.run_jobs`): the O_DIRECT read of its
file (once per file), the single-process readers, multitables at each
n_procs. The user's files are only ever opened read-only; a cold pass drops
their pages from the page cache (``POSIX_FADV_DONTNEED``), which leaves
their bytes and times as they were.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from multitables_bench.files import h5py_with_filters
from multitables_bench.passes import main_jobs, run_jobs
from multitables_bench.readers import engine_can_read
from multitables_bench.records import READ_DATA, USER_ENGINES, Codec, Dataset, Pass, Settings, Target

#: HDF5's filter id of deflate (zlib), whose level the report gives.
DEFLATE = 1


def parse_spec(spec: str) -> tuple[str, str]:
    """``FILE:DATASET`` as (file, dataset path with its leading ``/``), split at the last colon; ValueError if not one."""
    file, colon, path = spec.rpartition(":")
    if not colon or not file or not path.strip("/"):
        raise ValueError(f"--read {spec}: give FILE:DATASET, a dataset path inside the file after a colon, such as "
                         f"{file or spec or 'data.h5'}:/images")
    return file, "/" + path.lstrip("/")


def filters_of(ds: Any) -> str:
    """The dataset's HDF5 filters in pipeline order as HDF5 names them, ``+``-joined; deflate with its level."""
    dcpl = ds.id.get_create_plist()
    names = []
    for i in range(dcpl.get_nfilters()):
        code, _flags, values, name = dcpl.get_filter(i)
        text = name.decode(errors="replace").split()[0] if name else f"filter {code}"
        names.append(f"{text}({values[0]})" if code == DEFLATE and values else text)
    return "+".join(names) or "none"


def describe(spec: str) -> tuple[Dataset, Target]:
    """The dataset ``spec`` names, as the report shows it and as passes read it.

    Raises what multitables raises for a dataset it cannot stream (no such
    file, not HDF5, no such node, a scalar, an empty or variable-length
    dataset: each message names the file and the node), or ValueError for a
    malformed ``spec``.
    """
    from multitables._io.node import inspect_node

    file, path = parse_spec(spec)
    node = inspect_node(file, path)  # opens it read-only; raises with the file and node named
    with h5py_with_filters().File(file, "r") as f:
        ds = f[path]
        chunks = tuple(ds.chunks) if ds.chunks else None
        stored, filters = ds.id.get_storage_size(), filters_of(ds)
    key = f"{file}:{path}"
    target = Target(key, os.path.abspath(file), Codec(filters, 0), node.n_rows, chunks[0] if chunks else None,
                    READ_DATA, path, tuple(node.row_shape), node.dtype, stored)
    dataset = Dataset(key, file, path, (node.n_rows, *node.row_shape), str(node.dtype), stored, target.data_nbytes,
                      filters, chunks)
    return dataset, target


def read_targets(specs: Sequence[str]) -> list[tuple[Dataset, Target]]:
    """Each spec described (:func:`describe`), in order, the same one once."""
    return [describe(spec) for spec in dict.fromkeys(specs)]


def check_read(settings: Settings) -> "str | None":
    """What stops a ``--read`` run before its first pass, naming the file and dataset, or None.

    Every spec must name a dataset multitables streams, and one engine at
    least (of ``--engines``, or a user's single-process reader) must decode it here.
    """
    for spec in dict.fromkeys(settings.read):
        try:
            _, target = describe(spec)
        except Exception as exc:  # multitables' errors name the file and node: NoSuchNodeError, NodeTypeError ...
            return _problem(spec, exc)
        engines = list(dict.fromkeys([*settings.engines, *USER_ENGINES]))
        problems = {engine: engine_can_read(target, engine) for engine in engines}
        if all(problems.values()):
            why = "; ".join(f"{engine}: {problem}" for engine, problem in problems.items())
            return f"--read {spec}: no engine decodes {target.node} in {target.path} here ({why})"
    return None


def _problem(spec: str, exc: Exception) -> str:
    """The error of a spec :func:`describe` refused; for a missing node, the datasets the file has."""
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)  # a KeyError's str is quoted
    if text.startswith("--read"):
        return text
    if isinstance(exc, KeyError):
        text += f" (its datasets: {', '.join(_datasets_in(parse_spec(spec)[0])) or 'none'})"
    return f"--read {spec}: {text}"


def _datasets_in(file: str, most: int = 10) -> list[str]:
    """The paths of the first ``most`` datasets in ``file``, ``...`` after them if there are more."""
    h5py = h5py_with_filters()
    found: list[str] = []
    with h5py.File(file, "r") as f:
        f.visititems(lambda name, obj: found.append("/" + name) if isinstance(obj, h5py.Dataset) else None)
    return found[:most] + (["..."] if len(found) > most else [])


def measure_read(
    settings: Settings, targets: Sequence[Target], cache: str, notes: list[str], log: Callable[[str], None],
    passes: list[Pass],
) -> None:
    """Every job of the main section on each dataset in turn; the O_DIRECT read on the first dataset of each file."""
    files: set[str] = set()
    for target in targets:
        real = os.path.realpath(target.path)
        jobs = main_jobs(target, settings, cache, notes, odirect=real not in files)
        files.add(real)
        run_jobs(jobs, cache, settings.repeats, settings.cycles, log, passes)
