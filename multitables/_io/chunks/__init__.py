"""The chunk engine: HDF5's stored chunks found, read and decoded by the library itself.

``engine``: the engine as the registry holds it (what it reads, where ``auto``
prefers it); ``storage``: what the file says about a dataset's storage, and
where each chunk lies (``btree``: HDF5's B-tree read ourselves; ``hdf5lib``:
the few HDF5 calls h5py lacks); ``grid``: which chunks a row range covers and
where each part lands; ``source``: the engine's source, decoding the stored
bytes (``codecs``) straight into the block, keeping decoded chunks for a
request reader (``decoded``); ``transport``: how the bytes are
reached, a protocol with one module per way (``pread``: a local file, its
descriptor shared in the process: ``descriptors``).
"""
