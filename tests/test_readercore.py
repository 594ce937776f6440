"""What a Reader's datasets, stages and futures share (``_access/readercore``): its stages freed once, whoever frees them."""

from __future__ import annotations

from typing import Any

from multitables._access.readercore import ReaderCore


class Pool:
    filename = "f.h5"

    def close(self) -> None:
        pass


class Stage:
    def __init__(self, core: ReaderCore, closes: list[int], stage_id: int, gives_back: "int | None" = None) -> None:
        self.core, self.closes, self.stage_id, self.gives_back = core, closes, stage_id, gives_back

    def close(self) -> None:
        self.closes.append(self.stage_id)
        if self.gives_back is not None:  # the consumer's thread, meanwhile: a future gives its stage back
            self.core.give_back(self.gives_back)


def test_a_stage_given_back_while_the_reader_shuts_down_is_freed_once() -> None:
    """close(wait=False) shuts down in a thread of its own while the consumer's futures give their stages back: a
    stage held when the shut-down began, given back before it was reached, raised KeyError in that thread."""
    pool: Any = Pool()
    core = ReaderCore("f.h5", "h5py", {}, pool, max_stages=2, notify=None)
    closes: list[int] = []
    core.stages = {0: Stage(core, closes, 0, gives_back=1), 1: Stage(core, closes, 1)}  # type: ignore[dict-item]
    core.held = {1}
    core.shutdown()
    assert closes == [0, 1] and core.stages == {}
