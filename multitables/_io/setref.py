"""A node of a set named in a few bytes for the readers, who find it again in the Reader's files (NOTE [file sets]).

NOTE [growing sets]
    A set read with ``swmr=True`` may have files that an SWMR writer appends
    to (NOTE [file identity] in ``files``): between the Reader's look at a
    node and its readers' look, a file may have grown, so the readers find
    other sizes and more rows than the Reader did, and a file that had no
    rows may have some. So a :class:`SetRef` of such a node carries, for
    each file of the set, the rows and the size the Reader saw (packed, a
    few bytes a file), and its readers open the files that had rows (with
    ``swmr=True``, as HDF5 requires while a writer holds the file) and take
    each file's first rows, as many as the Reader saw: the node read is the
    node the Reader described. Its fingerprint holds what growth leaves as
    it was (each file's device and inode, the rows taken, their offsets,
    dtype and shape). A file smaller than the Reader saw is cut short, one
    with fewer rows than it saw is refused too: each a
    :class:`~multitables.errors.FileChangedError`. Each file's size at the
    readers' look is then the least its reads allow (NOTE [file identity]).

NOTE [set descriptions]
    A Reader's readers start before its ``get_dataset``, so they have not
    seen a set's node, and inspecting the set again opens every file with
    HDF5 in each reader at the dataset's first request (~0.4 ms a file: over
    a second for 3,000). So ``get_dataset`` hands the readers the node the
    consumer described, once: pickled into a segment of its own, which each
    reader maps, copies and unmaps at a ``LEARN`` item of its inbox (NOTE
    [request protocol] in ``_procs.serve``), and whose name the consumer
    unlinks once every reader said so, as a stage's (NOTE [segment
    lifetime]). A reader keeps the last ``LEARNED`` nodes it was handed
    (:class:`Learned`), each under its :class:`SetRef` (the fingerprint of
    the files alone would not tell two nodes of one set apart); the consumer
    keeps the refs, in the same order, and hands over only nodes whose ref
    is not among them. A ref whose node its reader holds is that node, with
    no open. The checks lose nothing: each part holds its file's
    identity at the consumer's look, which the set's source compares at
    each open of the file and after each read (NOTE [file identity] in
    ``files``), so a file changed since ``get_dataset`` fails each read of
    it, named. A set read with ``swmr=True`` is inspected by its readers as
    before: their own look is what its reads are checked against (NOTE
    [growing sets]). With ``n_procs=0`` the node stays in the process.
    A node of one file whose description a stage header cannot hold (a
    table of a few hundred columns: its dtype) is handed over the same way,
    under a :class:`NodeRef`, and handed again at a request where the
    readers have dropped it since.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import FileChangedError
from .files import GrowingFile, check_same_file
from .fileset import describe_files, inspect_files, set_node
from .node import NodeInfo, Part
from .objects.config import Store


@dataclass(frozen=True)
class SetRef:
    """A node of a set named in a few bytes, for a Reader's stage header: resolved by a reader that has the files.

    A stage header holds a few KiB and a set's node (every file's
    description) grows with the files; the readers get the Reader's files
    once, at start, and the node by another way (NOTE [set descriptions]),
    or else inspect the set themselves on its first request.
    ``fingerprint`` (of every part's file, identity and rows) names the node
    and makes sure they found what the consumer checked. ``grown``: for a set read with
    ``swmr=True``, each file's rows and size as the consumer saw them
    (NOTE [growing sets]); empty otherwise.
    """

    path: str
    field: "str | None"
    fingerprint: str
    grown: bytes = b""

    @classmethod
    def of(cls, node: NodeInfo, files: "tuple[str, ...]") -> "SetRef":
        """``node``, a node of the set ``files``."""
        grown = b""
        if any(isinstance(p.signature, GrowingFile) for p in node.parts):
            seen = np.zeros((len(files), 2), np.int64)  # rows, bytes; (0, 0): no rows then
            i = 0
            for p in node.parts:  # in the files' order
                while files[i] != p.node.filename:
                    i += 1
                assert isinstance(p.signature, GrowingFile)
                seen[i] = p.node.n_rows, p.signature.signature[2]
                i += 1
            grown = zlib.compress(seen.tobytes())
        return cls(node.path, node.field, _fingerprint(node), grown)

    def resolve(self, files: "tuple[str, ...]", store: "Store | None" = None, swmr: bool = False,
                locking: Any = None, learned: "Learned | None" = None) -> NodeInfo:
        """The node this names: the consumer's, where ``learned`` holds it (NOTE [set descriptions]), else inspected
        now; :class:`FileChangedError` if a file changed since the consumer's inspection."""
        known = learned.get(self) if learned is not None and not self.grown else None
        if known is not None:
            return known
        since = f"between the Reader's look at {self.path!r} and its readers': the rows asked for may no longer be there"
        if self.grown:
            node = self._grown_node(files, store, locking, since)
        else:
            node = inspect_files(files, self.path, self.field, store, swmr, locking=locking)
        if _fingerprint(node) != self.fingerprint:
            raise FileChangedError(f"a file of {node.filename!r} changed {since}")
        return node

    def _grown_node(self, files: "tuple[str, ...]", store: "Store | None", locking: Any, since: str) -> NodeInfo:
        """The node of a set read with ``swmr=True``: each file's rows as the consumer saw them (NOTE [growing sets])."""
        seen = np.frombuffer(zlib.decompress(self.grown), np.int64).reshape(len(files), 2)
        parts: "list[Part]" = []
        offset = 0
        for name, (n_rows, size) in zip(files, seen.tolist()):
            if not n_rows:
                continue
            node = inspect_files(name, self.path, self.field, store, swmr=True, allow_empty=True, locking=locking)
            now = node.identity
            assert isinstance(now, GrowingFile)
            # No smaller than the consumer saw it, and still one an SWMR writer holds, if any.
            check_same_file(name, now.signature, GrowingFile(now.signature[:2] + (size,) + now.signature[3:]), since)
            if node.n_rows < n_rows:
                raise FileChangedError(f"{name!r} has {node.n_rows} rows of {self.path!r} now, fewer than the "
                                       f"{n_rows} it had {since}")
            parts.append(Part(replace(node, n_rows=n_rows), offset, now))
            offset += n_rows
        return set_node(describe_files(files), parts[0].node, parts, offset)


@dataclass(frozen=True)
class NodeRef:
    """A node whose description a stage header does not hold (a table of a few hundred columns or more: its dtype),
    named by its path, column and the digest of its pickle; its readers are handed the node first, as a set's (NOTE
    [set descriptions]), and hold it, or are handed it again, whenever a request names it."""

    path: str
    field: "str | None"
    digest: str

    @classmethod
    def of(cls, node: NodeInfo, pickled: bytes) -> "NodeRef":
        return cls(node.path, node.field, hashlib.sha256(pickled).hexdigest())

    def resolve(self, learned: "Learned") -> NodeInfo:
        """The node handed over under this ref; ``RuntimeError`` where it was not (a bug: each request hands it)."""
        node = learned.get(self)
        if node is None:
            raise RuntimeError(f"the reader was not handed the description of {self.path!r} (column {self.field!r})")
        return node


#: Sets' nodes a reader keeps (NOTE [set descriptions]): those of the last datasets of sets its Reader made.
LEARNED = 16


class Learned:
    """The last ``LEARNED`` sets' nodes handed to a reader, each under its ref, in the order handed (NOTE [set
    descriptions]); the consumer's copy keeps the refs alone (nodes None), so it knows which a reader holds."""

    def __init__(self) -> None:
        self._nodes: "dict[SetRef | NodeRef, NodeInfo | None]" = {}

    def __contains__(self, ref: "SetRef | NodeRef") -> bool:
        return ref in self._nodes

    def get(self, ref: "SetRef | NodeRef") -> "NodeInfo | None":
        return self._nodes.get(ref)

    def add(self, ref: "SetRef | NodeRef", node: "NodeInfo | None" = None) -> None:
        self._nodes.pop(ref, None)
        self._nodes[ref] = node
        while len(self._nodes) > LEARNED:
            del self._nodes[next(iter(self._nodes))]


def _fingerprint(node: NodeInfo) -> str:
    parts = [(p.node.filename, _kept(p), p.offset, p.node.n_rows) for p in node.parts]
    return hashlib.sha256(repr(parts).encode("utf-8", "surrogateescape")).hexdigest()


def _kept(part: Part) -> Any:
    """What of ``part``'s file a fingerprint holds: its identity; of a file that may grow, what growth keeps."""
    if isinstance(part.signature, GrowingFile):
        return part.signature.signature[:2], part.node.dtype.descr, part.node.row_shape
    return part.signature
