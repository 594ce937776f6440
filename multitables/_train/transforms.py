"""Transforms of ``get_batches(transform=)``: checked and described in the consumer, before any reader starts.

See NOTE [transforms] in ``_io.blockread``.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import sys
import time
import types
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from .._io.blockread import Transform
from .._io.vlen import vlen_refusal
from .._plan.costs import RATE_SAMPLE_BYTES, RATE_SAMPLE_SHARE
from .._sys.forks import start_method, under_main_guard
from .._stream.options import StreamOptions


class StreamerLike(Protocol):
    """What a transform needs of the streamer: how it opens its file."""

    @property
    def options(self) -> StreamOptions: ...


#: Rows a transform is first called on, to learn its output (and what that call took: ``Transform.first_s``).
_SAMPLE_ROWS = 2
#: What its rows' time aims at in a larger, timed call (s): enough that a call's own time is small beside theirs.
_TIMED_S = 0.02


def infer_transforms(stream: "StreamerLike", paths: list[str], nodes: list[Any], transform: Any,
                     columns: bool) -> "list[Transform | None]":
    """Each dataset's :class:`~multitables._io.blockread.Transform` (None: none), learnt by one call on its first
    rows here, which is timed (:func:`price` goes on from it where the plan needs to).

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
    out: "list[Transform | None]" = []
    for path, node in zip(paths, nodes):
        function = functions.get(path)
        if function is None:
            out.append(None)
            continue
        sample = options.read_rows(node, 0, min(_SAMPLE_ROWS, node.n_rows))
        start = time.perf_counter()
        found = Transform.infer(function, sample, repr(path))
        found = replace(found, first_s=time.perf_counter() - start)
        method = start_method(options.start_method)
        if method != "fork":
            interactive = _interactive_names(function)
            if interactive:  # before pickling: a lambda there would be told to become what fails the same way
                raise TypeError(
                    f"transform for {path!r} is defined in an interactive session ({', '.join(interactive)} in a "
                    f"notebook or at the prompt), which readers started by {method} cannot import: define it in a "
                    f"module (a .py file) and import it, or use start_method='fork'"
                )
            try:  # spawned readers get it pickled: say so now rather than in a reader
                pickle.dumps(function)
            except Exception as exc:
                raise TypeError(
                    f"transform for {path!r} must be picklable for the {method} start method (a module-level "
                    f"function, not a lambda or a local function): {exc}"
                ) from exc
            if under_main_guard(function):
                raise TypeError(
                    f"transform for {path!r} ({function.__qualname__}) is defined under 'if __name__ == \"__main__\":', "
                    f"which readers started by {method} do not run (they import the script as another module): define "
                    f"it at the script's top level, before that 'if', or use start_method='fork'"
                )
        out.append(found)
    return out


def price(options: StreamOptions, node: Any, found: Transform, stake: "float | None", n_rows: int,
          n_blocks: int) -> "tuple[float, float]":
    """Seconds a call of ``found`` takes beyond its rows' and seconds a row takes (``DatasetShape.transform_call_s``,
    ``transform_row_s``), priced for an epoch of ``n_rows`` rows in ``n_blocks`` blocks whose readers pay where its
    work exceeds ``stake`` seconds (``_plan.readers.transform_stake``; None: where no price changes the plan, the
    first call's time, as rows', and no call). NOTE [transforms] says which calls it takes.

    A line through its first call, on :data:`_SAMPLE_ROWS` rows, and a call on more prices a call and a row: ``r *
    2`` on rows of 3 float64 costs 9 us a call, a sleep of 1 ms a call 1 ms, whatever their rows. The larger call's
    rows aim at :data:`_TIMED_S` by the first call's time a row (by the line's, where that was mostly its call's, in
    one call more), within ``_plan.costs.RATE_SAMPLE_SHARE`` of the dataset and ``RATE_SAMPLE_BYTES`` as read or as
    written, and no more than a warm call needs to show that readers pay at twice that price a row (their work then
    exceeds ``stake`` at any split between calls and rows: no call more). One shorter than :data:`_TIMED_S` is
    timed twice, the lesser standing (a busy machine only adds time: a sleep of 1 ms took 3 to 7 ms in one call of
    four here, beside other work). The first call may pay for warm-up that no reader's call does (an import, a
    cache, a JIT): where it was short, or no cheaper than the larger, the small call is timed again, warm, and the
    lesser stands. Noise that tilts the line down (the larger call no dearer) prices calls only, and a small call no
    dearer a row than the larger prices rows only.
    """
    n_first = min(_SAMPLE_ROWS, node.n_rows)
    if not n_first:
        return 0.0, 0.0
    first = found.first_s
    if stake is None:
        return 0.0, first / n_first
    nbytes = max(found.read_nbytes, found.row_nbytes, 1)
    most = max(min(node.n_rows, max(int(node.n_rows * RATE_SAMPLE_SHARE), n_first), RATE_SAMPLE_BYTES // nbytes), n_first)
    rows = options.read_rows(node, 0, most)  # read once: each call gets a copy (a call may change its rows in place)

    def pays(seconds: float, n: int) -> bool:  # a warm call's time shows readers pay, however it splits
        return seconds * min(max(n_blocks, 1), n_rows / n) > stake

    n, large, row_guess = n_first, first, first / n_first
    for _ in range(2):
        # Rows for pays() at twice row_guess (the first call's holds its own overhead and its warm-up); at least twice
        # the first call's, for a line that a few ms of noise do not tilt.
        enough = int(2 * stake / (max(n_blocks, 1) * max(row_guess, 1e-12))) + 1
        want = min(most, n_first + max(n_first, int(_TIMED_S / max(row_guess, 1e-9))), max(enough, n_first + 1))
        if want <= n:
            break
        n, large = want, _time_call(found, rows, want)
        if large < _TIMED_S:  # short enough for a busy machine's delay to count: the lesser of two
            large = min(large, _time_call(found, rows, want))
        if pays(large, n) or large - first >= _TIMED_S / 2:  # decided, or the line steep enough to read
            break
        row_guess = (large - first) / (n - n_first)
    small = first
    if not (n > n_first and pays(large, n)) and (first < _TIMED_S or large <= first):  # warm-up: costs little, or shows
        small = min(first, _time_call(found, rows, n_first))
    if n == n_first or small / n_first <= large / n:  # no call's cost seen: rows only
        return 0.0, min(small / n_first, large / n)
    if large <= small:  # the larger call no dearer: calls only, at the lesser time
        return large, 0.0
    row_s = (large - small) / (n - n_first)
    return small - row_s * n_first, row_s


def _time_call(found: Transform, rows: np.ndarray, n: int) -> float:
    """Seconds a call of ``found`` on a copy of the first ``n`` of ``rows`` takes."""
    sample = copy.deepcopy(rows[:n]) if rows.dtype.hasobject else rows[:n].copy()
    start = time.perf_counter()
    found.function(sample)
    return time.perf_counter() - start


def _refuse_vlen(paths: list[str], nodes: list[Any], transformed: "set[str]") -> None:
    """Refuse the first node of variable-length rows whose path has no transform."""
    for path, node in zip(paths, nodes):
        if node.vlen and path not in transformed:
            raise vlen_refusal(f"{node.path!r} in {node.filename!r}", batches=True)


def _interactive_names(function: Any) -> list[str]:
    """The functions and classes of a ``__main__`` without a file (a notebook's kernel, the prompt, ``python -c``)
    that a pickle of ``function`` names: itself, the function a ``functools.partial`` wraps, a callable object's
    class. Pickled by name, they unpickle in a spawned process only where it can import their module; the reader
    died there, its error on the kernel's stderr."""
    if getattr(sys.modules.get("__main__"), "__file__", None) is not None:
        return []
    found: list[str] = []

    class Looking(pickle.Pickler):
        def persistent_id(self, obj: Any) -> None:  # called on every object pickled, a lambda before it fails
            if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
                found.append(obj.__qualname__)

    try:
        Looking(io.BytesIO()).dump(function)
    except Exception:  # noqa: BLE001 - what cannot be pickled is said by the check that follows
        pass
    return list(dict.fromkeys(found))
