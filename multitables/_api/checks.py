"""Checks of the public faces' plain arguments (ints, flags), shared so each says the same thing."""

from __future__ import annotations

from typing import Any

import numpy as np


def check_int(name: str, value: Any, minimum: int, allow_none: bool = True) -> "int | None":
    """``value`` as an int of at least ``minimum`` (None passes where allowed); ``TypeError``/``ValueError`` naming ``name``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int{' or None' if allow_none else ''}, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a bool (Python's or numpy's); ``TypeError`` naming ``name`` for anything else."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return bool(value)
