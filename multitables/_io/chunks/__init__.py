"""The chunk engine: HDF5's stored chunks found, read and decoded by the library itself.

``storage``: what the file says about a dataset's storage, and where each chunk lies
(``btree``: HDF5's B-tree read ourselves; ``hdf5lib``: the few HDF5 calls h5py lacks);
``grid``: which chunks a row range covers and where each part lands; ``source``: the
engine's source, reading the stored bytes and decoding them (``codecs``) straight into
the block.
"""
