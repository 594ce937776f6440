"""Variable-length rows: read only where a transform makes them rows of one size.

NOTE [variable-length rows]
    An h5py vlen dataset (``h5py.vlen_dtype(np.uint8)``: one encoded image a
    row; vlen ``str`` or ``bytes``: one text a row) or a PyTables ``VLArray``
    holds rows of different sizes, which fit no fixed-size slot or stage.
    h5py reads them into an object array, each row an ndarray (bytes, for
    strings) of its own. ``get_batches(transform=)`` reads them: its readers
    read each block into a private object array (the transform's scratch
    buffer, NOTE [transforms] in ``_io.blockread``), and the transform's rows,
    of one dtype and shape, go into the slot as any transform's do. Streams
    and the Reader do not read them, nor batches without a transform for the
    node: the node is refused when it is described, before any process
    starts (:func:`vlen_refusal`). Only h5py reads them (the chunk engine and
    PyTables read elements of one size: :data:`VLEN_PROBLEM`), so ``auto``
    takes h5py and ``engine="tables"`` is refused; ``engine="chunks"`` falls
    back to h5py, as it does for any node it cannot read.
    HDF5's conversion writes each row's object over what the buffer held
    without releasing it (a block's rows would stay alive for ever), so the
    buffer is emptied first (:func:`read_objects`); the ``None`` it then
    writes over keeps one reference a row, as h5py's own reads do (``None``
    is immortal from Python 3.12). A row's pointer says nothing of its
    bytes: the plan takes, as for any transform, the larger of a delivered
    row and a row as read, here the mean of the first rows
    (:func:`row_payload`; NOTE [read plan] in ``_plan.readers``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import NodeTypeError

#: Why the chunk engine and PyTables do not read a vlen node (their ``problem``).
VLEN_PROBLEM = "its rows are variable-length, which the h5py engine alone reads (NOTE [variable-length rows])"


def vlen_refusal(where: str, batches: bool = False) -> NodeTypeError:
    """The error for the variable-length node ``where`` read without a transform: by batches (``batches``), or by a
    stream or a Reader, which never read one."""
    what = (f"{where} holds variable-length rows (an h5py vlen dataset, a PyTables VLArray), which fit no slot of "
            f"one size")
    how = ("a function of a block's rows (an object array, each row an ndarray, or bytes for strings, as h5py gives "
           "it) that returns an array of rows of one dtype and shape, such as decoded images (docs/training.rst, "
           "'Variable-length rows')")
    if batches:
        return NodeTypeError(f"{what}: give get_batches a transform= for it, {how}")
    return NodeTypeError(
        f"{what}: streams (get_queue, get_generator) and the Reader do not read them. get_batches(..., transform=) "
        f"does, with {how}; or read them with h5py directly (dataset[i])"
    )


def row_dtype(node: Any) -> str:
    """``node``'s dtype as a file set compares and names it (NOTE [file sets] in ``_io.fileset``): of variable-length
    rows, with their base type (``object (vlen uint8)``, ``object (vlen str)``), which object dtypes do not compare."""
    if not node.vlen:
        return str(node.dtype)
    import h5py

    base = h5py.check_vlen_dtype(node.dtype)
    return f"{node.dtype} (vlen {base.__name__ if isinstance(base, type) else np.dtype(base)})"


def read_objects(dsid: Any, fspace: Any, mtype: Any, n: int, out: np.ndarray) -> None:
    """HDF5's read of the ``n`` rows selected in ``fspace`` (of dataset ``dsid``) into ``out``, an object array, as
    h5py's reads give them (``mtype``: the memory type); what ``out`` held is let go first (NOTE [variable-length
    rows]). A memory space a read: 2-3 us, where a block's rows are objects made one by one."""
    import h5py

    out[...] = None
    dsid.read(h5py.h5s.create_simple((n,) + out.shape[1:]), fspace, out, mtype)


def row_payload(rows: np.ndarray) -> int:
    """Mean bytes of a row of ``rows`` (an object array as :func:`read_objects` fills it): arrays' and bytes' own."""
    if not len(rows):
        return 0
    total = sum(x.nbytes if isinstance(x, np.ndarray) else len(x) if isinstance(x, (bytes, str)) else 8
                for x in rows.reshape(-1))
    return -(-total // len(rows))
