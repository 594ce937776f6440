"""The public faces' parts: the queue and its back ends, training windows, a Reader's
core, requests, stages and futures, argument checks, multitables 2.x names, the proxy.
"""
