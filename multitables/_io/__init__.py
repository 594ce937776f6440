"""Rows into a caller's buffer: node inspection, the engines, the chunk engine and its codecs.

``node``: what a dataset is (dtype, row shape, chunks, filters) and the file's
identity; ``engines``: the ``Source`` protocol and choosing and opening an engine;
``h5py_source`` and ``tables_source``: the h5py and PyTables engines; ``chunks``:
the chunk engine, which learns a dataset's layout and chunk locations from
``storage`` and decodes with ``codecs`` (HDF5 filter pipelines, one module per
filter); ``blocks``: the one loop that reads a block of a stream; ``scattered``:
sorted scattered rows, for random access.
"""
