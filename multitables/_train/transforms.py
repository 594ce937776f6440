"""Transforms of ``get_batches(transform=)``: checked and described in the consumer, before any reader starts.

See NOTE [transforms] in ``_io.blockread``.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from dataclasses import replace
from typing import Any, Protocol

from .._io.blockread import Transform
from .._io.vlen import vlen_refusal
from .._plan.costs import RATE_SAMPLE_BYTES, RATE_SAMPLE_SHARE
from .._sys.forks import start_method, under_main_guard
from .._stream.options import StreamOptions


class StreamerLike(Protocol):
    """What a transform needs of the streamer: how it opens its file."""

    @property
    def options(self) -> StreamOptions: ...


#: Rows a transform is first called on, to learn its output and time it (``Transform.row_s``).
_SAMPLE_ROWS = 2
#: What its second, timed call aims to take (s): rows enough that a call's own overhead is small beside theirs.
_TIMED_S = 0.02


def infer_transforms(stream: "StreamerLike", paths: list[str], nodes: list[Any], transform: Any, columns: bool) -> list[Any]:
    """Each dataset's :class:`~multitables._io.blockread.Transform` (None: none), learnt and timed on its first rows
    here.

    A node of variable-length rows without one is refused (NOTE [variable-length rows] in ``_io.vlen``)."""
    if transform is None:
        _refuse_vlen(paths, nodes, set())
        return [None] * len(paths)
    if columns:
        raise ValueError("transform= and fields= do not go together: transform the columns after the batch")
    if callable(transform):
        if len(paths) > 1:
            raise ValueError(f"one transform for {len(paths)} paths: give a dict of path to function")
        functions = {paths[0]: transform}
    elif isinstance(transform, dict):
        functions = {os.fspath(p): f for p, f in transform.items()}
        unknown = sorted(set(functions) - set(paths))
        if unknown:
            raise KeyError(f"transform names paths not read: {unknown}; the paths are {paths}")
    else:
        raise TypeError(f"transform must be a function or a dict of path to function, not {type(transform).__name__}")
    _refuse_vlen(paths, nodes, set(functions))
    options = stream.options
    out = []
    for path, node in zip(paths, nodes):
        function = functions.get(path)
        if function is None:
            out.append(None)
            continue
        n = min(_SAMPLE_ROWS, node.n_rows)
        sample = options.read_rows(node, 0, n)
        start = time.perf_counter()
        found = Transform.infer(function, sample, repr(path))
        found = replace(found, row_s=_row_s(options, node, found, (time.perf_counter() - start) / max(n, 1)))
        method = start_method(options.start_method)
        if method != "fork":
            try:  # spawned readers get it pickled: say so now rather than in a reader
                pickle.dumps(function)
            except Exception as exc:
                raise TypeError(
                    f"transform for {path!r} must be picklable for the {method} start method (a module-level "
                    f"function, not a lambda or a local function): {exc}"
                ) from exc
            if _interactive(function):
                raise TypeError(
                    f"transform for {path!r} is defined in an interactive session ({function.__qualname__} in a "
                    f"notebook or at the prompt), which readers started by {method} cannot import: define it in a "
                    f"module (a .py file) and import it, or use start_method='fork'"
                )
            if under_main_guard(function):
                raise TypeError(
                    f"transform for {path!r} ({function.__qualname__}) is defined under 'if __name__ == \"__main__\":', "
                    f"which readers started by {method} do not run (they import the script as another module): define "
                    f"it at the script's top level, before that 'if', or use start_method='fork'"
                )
        out.append(found)
    return out


def _row_s(options: StreamOptions, node: Any, found: Transform, first_row_s: float) -> float:
    """Seconds a row of ``found`` takes (``Transform.row_s``), the first call's ``first_row_s`` a row or a second
    call's, whichever is less (NOTE [transforms]).

    The first call may pay for warm-up that no reader's call does (an import, a cache, a JIT), and a call's own
    overhead, spread over 2 rows, would be priced on every row of an epoch (``r * 2`` on rows of 3 float64: 9 us a
    row on 2 rows, 0.04 in a block of 4096). So the second call, on rows read again (the first may have changed its
    own in place), takes as many as :data:`_TIMED_S` holds at the first call's time a row, within
    ``_plan.costs.RATE_SAMPLE_SHARE`` of the dataset and ``RATE_SAMPLE_BYTES`` as read or as written.
    """
    nbytes = max(found.read_nbytes, found.row_nbytes, 1)
    most = min(int(_TIMED_S / max(first_row_s, 1e-9)), int(node.n_rows * RATE_SAMPLE_SHARE), RATE_SAMPLE_BYTES // nbytes)
    n = min(max(most, _SAMPLE_ROWS), node.n_rows)
    if not n:
        return 0.0
    sample = options.read_rows(node, 0, n)
    start = time.perf_counter()
    found.function(sample)
    return min(first_row_s, (time.perf_counter() - start) / n)


def _refuse_vlen(paths: list[str], nodes: list[Any], transformed: "set[str]") -> None:
    """Refuse the first node of variable-length rows whose path has no transform."""
    for path, node in zip(paths, nodes):
        if node.vlen and path not in transformed:
            raise vlen_refusal(f"{node.path!r} in {node.filename!r}", batches=True)


def _interactive(function: Any) -> bool:
    """Whether ``function`` lives in a ``__main__`` without a file (a notebook's kernel, the prompt, ``python -c``):
    pickled by name, it unpickles in a spawned process only where that process can import its module."""
    main = sys.modules.get("__main__")
    return getattr(function, "__module__", None) == "__main__" and getattr(main, "__file__", None) is None
