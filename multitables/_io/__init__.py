"""Rows into a caller's buffer: node inspection, file sets, the engines, the one block-read loop.

``node``: what a dataset is (dtype, row shape, chunks, filters) and the file's
identity; ``fileset``: several files as one node; ``engines``: the engine
registry, its protocols (``Engine``, ``Source``, ``Rows``), choosing an engine
and opening it; ``h5py_engine`` and ``tables_engine``: the h5py and PyTables
engines; ``chunks``: the chunk engine, a folder of its own; ``blockread``: the
one loop that reads a block of a stream; ``scattered``: sorted scattered rows,
for random access; ``prefork``: what the consumer does before it forks a
process that reads.
"""
