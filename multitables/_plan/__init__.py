"""Planning, pure and process-free: which rows go where, and how they are read.

``readers``: how to read a dataset, decided once for every face (readers,
block size, read-ahead; NOTE [read plan]); ``costs``: whether readers pay;
``blocks``: a stream's blocks and the
pieces each is read in; ``epoch``: the shuffled, sharded order of a training
epoch; ``subset``: epochs over some rows or a weighted draw; ``requests``: a
random-access key as rows to read.
"""
