"""The library's own object client under the name the measurement calls it by: ``open_object(url, options)``.

``measure_clients.py`` was first run against a prototype of this client
(BENCHMARKS.md, "Object storage: the client"); the prototype became
``multitables._io.objects``, and this maps the measurement's options to it:
``merge_cap`` is the client's ``part_size``.
"""

from __future__ import annotations

from typing import Any

from multitables._io.objects.config import make_store
from multitables._io.objects.reader import ObjectReader


def open_object(url: str, options: "dict[str, Any]") -> ObjectReader:
    opts = dict(options)
    if "merge_cap" in opts:
        opts["part_size"] = max(64 << 10, opts.pop("merge_cap"))
    return ObjectReader(url, make_store(opts))
