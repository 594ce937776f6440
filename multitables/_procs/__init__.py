"""Worker processes: one pool, one worker entry, and the two loops that run in them.

``pool``: start, watch, report and stop workers; ``worker``: what every worker does
around its loop; ``failure``: the one report format; ``stream``: the loop that fills a
ring with blocks; ``serve``: the loop that reads requests into stages.
"""
