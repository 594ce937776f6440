"""Whether anything beyond its container references an object, counted against a baseline measured here.

The in-process back end reuses a block buffer, and the generator its private
copies and lent slots, only where no row of them is alive: every row is a
view holding a reference to its buffer, so the buffer's reference count
tells. But ``sys.getrefcount`` also counts references the interpreter holds
while it runs, and how many depends on the version: from Python 3.14 a local
name passed to a call may be borrowed rather than counted (gh-130704), so a
constant fitted to one version would take a held buffer for a free one on
another, and overwrite rows the caller kept. So every check counts through
:func:`item_refs`, and :data:`ALONE` is what it counts, in this interpreter,
for an item only its container holds.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence


def item_refs(items: Sequence[Any], i: int) -> int:
    """``sys.getrefcount`` of ``items[i]``, counted here (the interpreter's own references included)."""
    item = items[i]
    return sys.getrefcount(item)


#: :func:`item_refs` of an item that nothing but its container references.
ALONE = item_refs([object()], 0)


def held_elsewhere(items: Sequence[Any], i: int) -> bool:
    """Whether something beyond ``items`` references ``items[i]``: a name bound to it, a view of it (an array's row).

    The caller must not hold ``items[i]`` in a name of its own while it asks.
    """
    return item_refs(items, i) > ALONE
