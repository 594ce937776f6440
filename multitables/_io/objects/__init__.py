"""Objects in S3-compatible stores and on HTTP servers, read by byte ranges: a small client of our own.

``urls``: telling a URL from a path, showing one safely; ``config``:
``storage_options`` resolved into a :class:`~multitables._io.objects.config.Store`
(endpoint, region, tuning, the local cache); ``credentials``: where they come
from and how they reach readers (NOTE [credentials]); ``identity``: what an
object was when looked at; ``sigv4``: signing;
``http``: connections, one request, what an answer means, retries;
``reader``: an object's byte ranges, merged, in flight, checked against what
the object was (NOTE [object identity]); ``listing``: the objects a pattern
names; ``fileobj``: a file object for h5py; ``cache``: the local cache
(NOTE [object cache]); ``hdf5``: what HDF5's side calls for an object.

NOTE [objects on demand]
    Only URLs need the client: ``http``, ``reader``, ``listing``,
    ``fileobj``, ``cache`` and the chunk engine's ``ranged`` bring in
    ``http.client``, ``ssl``, ``email`` and ``xml.etree``, about 20 ms of
    CPU that ``import multitables`` would pay in every process (each spawned
    reader, each DataLoader worker, a command line) for files that are all
    local. So the layers above import, at their top, only the light modules
    (``urls``, ``config``, ``identity``, and ``hdf5``, which imports the rest
    inside its functions), and the others inside the branches that have a
    URL. Once a URL was read, a fork server started then imports them once
    for all its readers (``_io.prefork.READING_LIBRARIES``).
    ``tests/test_objects.py`` checks what ``import multitables`` leaves out.

Why our own client and not obstore or s3fs: ``BENCHMARKS.md``, "Object
storage: the client".
"""
