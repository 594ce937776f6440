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
(NOTE [object cache]).

Why our own client and not obstore or s3fs: ``BENCHMARKS.md``, "Object
storage: the client".
"""
