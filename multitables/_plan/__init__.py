"""Planning, pure and process-free: which rows go where.

``blocks``: a stream's blocks and the pieces each is read in; ``chunkgrid``: a
dataset's chunk grid and the chunks a row range touches; ``epoch``: the shuffled,
sharded order of a training epoch; ``requests``: a random-access key as rows to read.
"""
