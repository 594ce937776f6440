"""Reader processes: one pool, one reader entry, and the two loops that run in them.

``pool``: start, watch, report and stop readers; ``process``: what every reader does
around its loop; ``failure``: the one report format; ``stream``: the loop that fills a
ring with blocks; ``serve``: the loop that reads requests into stages.
"""
