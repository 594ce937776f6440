"""Module locks in a forked child: made anew, since a thread of the parent may have held one at the fork.

A reader forked while another thread of the consumer held a module's lock would
find it held for ever: the child has no such thread to release it. Python 3.12
warns of this at every fork from a process with threads; a test holds every
module-level lock of the package while a process forks
(``tests/test_reader_process.py``).
"""

from __future__ import annotations

import os
import threading
from typing import Any


def renew_lock_in_children(scope: "dict[str, Any]", name: str) -> None:
    """Make ``scope[name]`` (a module's ``globals()``, a lock it holds) a new lock in every child this process forks."""

    def renew() -> None:
        scope[name] = threading.Lock()

    os.register_at_fork(after_in_child=renew)
