"""What a saved training position was taken on, and a resume on other data refused (NOTE [resumed data]).

NOTE [resumed data]
    A position (``Batches.state_dict()``) names batches by number: batch 7 of
    epoch 2 holds the rows that ``(seed, epoch)`` chose among the rows of the
    files as they were. Loaded into batches over other data (a dataset
    written again, a file of a set replaced, rows appended, another dataset)
    it would give rows of another order, or other rows, silently. So a state
    records the identity of its data, per dataset: its path (and field), its
    rows' type and shape, and each file's rows, bytes and sum in order; a load
    refuses a state whose data differs, naming what differs, before the
    position moves or a reader starts.

    Only what a copy keeps is compared, so a job resumed on a copy of its
    files on a node-local disk (or on a download of the objects it read)
    goes on: a file's identity while it is read (device, inode and times:
    NOTE [file identity] in ``_io.files``) is not its copy's, and names and
    folders may differ (the names are recorded to be shown, not compared).
    The bytes are the file's or object's size (``identity_size``): the same
    rows written again compress to other bytes, mostly. Other values in the
    same bytes (stored uncompressed, or a reshuffle that compresses alike)
    are told by each file's *sum*, of a sample of its stored bytes taken
    once when the batches are made (NOTE [data sums] in ``_io.sums``: what
    it sees and misses; none for an object, which it would download, nor
    for a file that may grow). A file read with ``swmr=True`` may grow, so
    its bytes are not compared. A copy whose bytes differ though its rows do
    not (one repacked, or given another dataset or an attribute) is refused
    too: the error says so. Where data was changed on purpose, a state
    without each dataset's ``sums`` loads with the other checks, and one
    without its ``identity`` loads unchecked, as states saved before the
    sums, or the identity, were recorded do.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any, Sequence
from urllib.parse import urlsplit

from .._io.files import identity_size
from .._io.node import NodeInfo
from .._io.objects.urls import is_url
from .._io.sums import file_sum

#: Differences an error names; the rest are counted.
_SHOWN = 4


def data_identity(nodes: "Sequence[NodeInfo]") -> "list[dict[str, Any]]":
    """The identity of each node's data as a state records it (NOTE [resumed data]): one dict a node, its sequences
    tuples, so that a state can hold shallow copies (JSON and pickle give lists back, which compare the same)."""
    out = []
    for node in nodes:
        if node.parts:
            files = [(p.node, identity_size(p.signature)) for p in node.parts]
        else:
            files = [(node, identity_size(node.remote.identity if node.remote is not None else node.identity))]
        out.append({
            "path": node.path, "field": node.field, "dtype": str(node.dtype), "row_shape": tuple(node.row_shape),
            "rows": tuple(f.n_rows for f, _ in files), "sizes": tuple(size for _, size in files),
            "files": tuple(_name(f.filename) for f, _ in files), "sums": tuple(file_sum(f) for f, _ in files),
        })  # fmt: skip
    return out


def check_identity(saved: Any, mine: "list[dict[str, Any]]", named: str) -> None:
    """Raise ``ValueError`` naming what differs where ``saved`` (a state's ``identity``; None: a state saved before it
    was recorded, not checked) is not the identity ``mine`` of the data of ``named`` (NOTE [resumed data])."""
    if saved is None:
        return
    differ = _differences(saved, mine)
    if differ:
        more = f"; and {len(differ) - _SHOWN} more" if len(differ) > _SHOWN else ""
        raise ValueError(
            f"the state was saved on other data than {named} holds now: {'; '.join(differ[:_SHOWN])}{more}. Its "
            f"batches would hold other rows, or the same in another order. A copy of the same files resumes (names "
            f"and folders may differ); to resume on these files anyway, load the state without its 'identity' (or, "
            f"where only values differ, without each dataset's 'sums': the other checks stay)"
        )


def _differences(saved: Any, mine: "list[dict[str, Any]]") -> "list[str]":
    if not isinstance(saved, list) or not all(isinstance(s, dict) for s in saved):
        return [f"its identity is {saved!r}, not a list of one dict per dataset"]
    if len(saved) != len(mine):
        return [f"{len(mine)} dataset(s), the state's {len(saved)}"]
    differ = []
    for old, new in zip(saved, mine):
        at = new["path"] + (f" field {new['field']!r}" if new["field"] is not None else "")
        for key in ("path", "field", "dtype", "row_shape"):
            was, now = (list(old.get(key) or []), list(new[key])) if key == "row_shape" else (old.get(key), new[key])
            if was != now:
                differ.append(f"{at}: {key} {now!r}, the state's {was!r}")
        rows, sizes, names = list(old.get("rows", [])), list(old.get("sizes", [])), list(old.get("files", []))
        if len(rows) != len(new["rows"]):
            differ.append(f"{at}: {len(new['rows'])} file(s), the state's {len(rows)}")
            continue
        sums = list(old.get("sums") or [])  # none in a state saved before sums were taken: not compared
        sizes, sums = (x + [None] * (len(rows) - len(x)) for x in (sizes, sums))
        names += ["?"] * (len(rows) - len(names))
        for i, (name, n, size, total) in enumerate(zip(new["files"], new["rows"], new["sizes"], new["sums"])):
            if int(rows[i]) != n:
                differ.append(f"{_file(at, i, name, names, rows)} has {n} rows, the state's {int(rows[i])}")
            elif size is not None and sizes[i] is not None and int(sizes[i]) != size:
                differ.append(f"{_file(at, i, name, names, rows)} is {size} bytes, the state's {int(sizes[i])}")
            elif total is not None and sums[i] is not None and int(sums[i]) != total:
                differ.append(f"{_file(at, i, name, names, rows)} holds other values: the sum of its sampled stored "
                              f"bytes is {total:08x}, the state's {int(sums[i]):08x} (NOTE [data sums])")
    return differ


def _file(at: str, i: int, name: str, names: "list[Any]", rows: "list[Any]") -> str:
    """File ``i`` of dataset ``at`` as an error names it: its name now, and the state's where a set has several."""
    return f"{at}: file {i} ({name}, the state's {names[i]})" if len(rows) > 1 else f"{at} ({name})"


def _name(filename: str) -> str:
    """A file's name without its folder (an object's without its query, which may hold a signature)."""
    return posixpath.basename(urlsplit(filename).path) if is_url(filename) else os.path.basename(filename)
