"""Shared memory: named segments, the ring of block slots, request stages and inboxes.

``segment``: create, attach, unlink and account for segments; ``ring``: the slots a
stream's readers fill and its consumer lends out; ``stage``: a request stage's layout
and typed header; ``inbox``: the request readers' inboxes.
"""
