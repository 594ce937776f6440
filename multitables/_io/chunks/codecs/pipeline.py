"""A dataset's codecs run on one stored chunk at a time, last filter first, skipping those its filter mask skips.

Built by :func:`~multitables._io.chunks.codecs.registry.build_pipeline`; each codec
writes into the next one's input buffer where it can, the last into the
caller's output.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...._sys.spares import spare_bytes
from .base import Codec, FilterSpec, UnsupportedFilter, as_u8, check_size


class Pipeline:
    """Undo a dataset's filters on one stored chunk at a time, into the caller's buffer.

    ``codecs``: one per filter of ``specs``, in the order the filters were
    applied. ``chunk_nbytes``: bytes of one decoded (whole, padded) chunk.
    Not thread-safe: it keeps scratch buffers between calls.
    """

    def __init__(self, specs: Sequence[FilterSpec], codecs: Sequence[Codec], chunk_nbytes: int) -> None:
        self.specs = tuple(specs)
        self.chunk_nbytes = chunk_nbytes
        self._codecs = list(codecs)
        self._scratch: list[np.ndarray] = []
        self._all = (1 << len(self._codecs)) - 1
        self._steps: dict[int, list[tuple[Codec, "int | None"]]] = {}
        for codec, size in self._steps_for(0):
            if size is None and codec.compresses:
                raise UnsupportedFilter(f"{codec.name} applied after another compressor is not decoded here")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self._codecs)

    def is_identity(self, mask: int) -> bool:
        """Whether a chunk with filter ``mask`` is stored as it is (no filters, or all of them skipped)."""
        return mask & self._all == self._all

    def _steps_for(self, mask: int) -> list[tuple[Codec, "int | None"]]:
        """The codecs to run for a chunk with filter ``mask``, last applied first, with each one's decoded size."""
        steps = self._steps.get(mask)
        if steps is None:
            steps = []
            # Undoing filter i gives what filter i was given when writing: the chunk, plus any checksums
            # added before it; unknown (None) once a compressor came before it.
            size: "int | None" = self.chunk_nbytes
            for i, codec in enumerate(self._codecs):
                if not mask >> i & 1:
                    steps.append((codec, size))
                    if codec.compresses:
                        size = None
                    elif codec.name == "fletcher32" and size is not None:
                        size += 4
            steps.reverse()
            self._steps[mask] = steps
        return steps

    def _buffer(self, k: int, size: int) -> np.ndarray:
        while len(self._scratch) <= k:
            self._scratch.append(np.empty(0, np.uint8))
        if len(self._scratch[k]) < size:
            self._scratch[k] = spare_bytes(size)  # NOTE [spare buffers]
        return self._scratch[k][:size]

    @property
    def decodes_parts(self) -> bool:
        """Whether :meth:`decode_part` can decode less than a whole chunk: one filter, whose codec decodes parts."""
        return len(self._codecs) == 1 and hasattr(self._codecs[0], "decode_part")

    def decode_part(self, raw: Any, mask: int, first: int, dst: np.ndarray) -> bool:
        """Bytes ``first .. first + len(dst)`` of the decoded chunk into ``dst`` (uint8), decoding no more than they need:
        where the chunk is stored as it is, or its one filter's codec decodes parts (blosc). False where neither holds
        (the caller decodes the whole chunk)."""
        if self.is_identity(mask):
            stored = as_u8(raw)
            if len(stored) != self.chunk_nbytes:
                return False
            dst[:] = stored[first : first + len(dst)]
            return True
        # decodes_parts: the codec has a decode_part, which Codec does not declare
        return self.decodes_parts and self._codecs[0].decode_part(raw, self.chunk_nbytes, first, dst)  # type: ignore[attr-defined]

    def decode(self, raw: Any, mask: int, out: np.ndarray) -> None:
        """Decode the stored bytes ``raw`` of a chunk with filter ``mask`` into ``out`` (uint8, ``chunk_nbytes``)."""
        steps = self._steps_for(mask)
        if len(steps) == 1 and steps[0][1] is not None and steps[0][0].writes_into:
            # One filter, straight into ``out``: the loop's bookkeeping was an eighth of an 8 KiB blosc tile's decode.
            buf = steps[0][0].decode(raw, steps[0][1], out)
        else:
            buf = self._run(steps, raw, out)
        if buf is not out:
            n = memoryview(buf).nbytes
            check_size("chunk", n, self.chunk_nbytes)
            out[:] = as_u8(buf)

    def _run(self, steps: "list[tuple[Codec, int | None]]", raw: Any, out: np.ndarray) -> Any:
        """Run ``steps`` on ``raw``, the last into ``out`` where it writes into a buffer; returns what the last gave."""
        buf: Any = raw
        held = -1  # which scratch buffer holds ``buf`` (-1: none)
        for pos, (codec, size) in enumerate(steps):
            last = pos == len(steps) - 1
            if size is None or not codec.writes_into:
                dst: "np.ndarray | None" = None
            elif last:
                dst = out
            else:
                dst = self._buffer(1 if held == 0 else 0, size)
            got = codec.decode(buf, size, dst)  # type: ignore[arg-type]  # None for no compressor: __init__
            if dst is not None and got is dst:
                held = -1 if dst is out else (1 if held == 0 else 0)
            elif not isinstance(got, memoryview):
                held = -1  # a buffer of the codec's own
            buf = got
        return buf
