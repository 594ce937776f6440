"""Checks of the public faces' arguments (ints, flags, table columns), shared so each says the same thing."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Literal, overload

import numpy as np


class EstablishedValueError(ValueError, RuntimeError):
    """A bad value that the established (2.x) API refused with ``RuntimeError``: both, so either ``except`` holds."""


@overload
def check_int(name: str, value: Any, minimum: int, allow_none: Literal[False], established: bool = False) -> int: ...
@overload
def check_int(name: str, value: Any, minimum: int, allow_none: bool = True, established: bool = False) -> "int | None": ...
def check_int(name: str, value: Any, minimum: int, allow_none: bool = True, established: bool = False) -> "int | None":
    """``value`` as an int of at least ``minimum`` (None passes where allowed); ``TypeError``/``ValueError`` naming
    ``name`` (``established``: a value too small is also a ``RuntimeError``, as 2.x raised it)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int{' or None' if allow_none else ''}, not {type(value).__name__}")
    if value < minimum:
        raise (EstablishedValueError if established else ValueError)(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a bool: Python's or numpy's, or an int 0 or 1 (2.x and PyTorch take any truthy value, and a
    flag from ``argparse(type=int)`` or a config file is an int); ``TypeError`` naming ``name`` for anything else
    (a string ``"False"`` would be true)."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name} must be True or False (or 1 or 0), not {value!r}")


def check_fields(
    paths: list[str], single: bool, field: Any, fields: Any
) -> "tuple[str | None, list[str] | None]":
    """``(field, columns)`` as given, checked: at most one of them, and only with one path."""
    if field is None and fields is None:
        return None, None
    if field is not None and fields is not None:
        raise ValueError("give field= (one column, as an array) or fields= (columns, as a dict), not both")
    if not single:
        raise ValueError(
            f"field= and fields= select columns of one table; give one path (a string), not {len(paths)} paths"
        )
    if field is not None:
        if not isinstance(field, str):
            raise TypeError(f"field must be a str naming a column, not {type(field).__name__}")
        return field, None
    if isinstance(fields, str) or not all(isinstance(f, str) for f in fields):
        raise TypeError(f"fields must be a sequence of column names (str), not {fields!r}")
    columns = list(fields)
    if not columns:
        raise ValueError("fields is empty; give at least one column")
    if len(set(columns)) != len(columns):
        raise ValueError(f"fields names a column twice: {columns}")
    return None, columns


def check_same_rows(paths: "list[str]", n_rows: "list[int]") -> None:
    """``ValueError`` unless the datasets at ``paths``, read together, have the same number of rows."""
    if len(set(n_rows)) > 1:
        listing = ", ".join(f"{p!r} has {n}" for p, n in zip(paths, n_rows))
        raise ValueError(f"datasets read together need the same number of rows: {listing}")


def rank_and_world(rank: Any, world_size: Any) -> tuple[int, int]:
    """The rank and world size given, else torch.distributed's when it is initialised, else (0, 1)."""
    if rank is None and world_size is None:
        dist = sys.modules.get("torch.distributed")  # never import torch here: it is optional
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
        launched = os.environ.get("WORLD_SIZE", "1")
        if launched.isdigit() and int(launched) > 1:  # torchrun (or another launcher) started ranks, not yet joined
            warnings.warn(
                f"WORLD_SIZE={launched} and RANK={os.environ.get('RANK', '?')} in the environment, but torch.distributed "
                f"is not initialised: these batches are rank 0 of 1, and every process reads every row. Call "
                f"torch.distributed.init_process_group() first, or give rank= and world_size=", stacklevel=4)
        return 0, 1
    if rank is None or world_size is None:
        raise ValueError("give both rank and world_size, or neither (then torch.distributed's are used when initialised)")
    world = check_int("world_size", world_size, 1, allow_none=False)
    rank = check_int("rank", rank, 0, allow_none=False)
    assert world is not None and rank is not None
    if rank >= world:
        raise ValueError(f"rank must be in [0, world_size={world}), got {rank}")
    return rank, world
