"""The feed's record of what is published to its queues and not yet taken (``_train.feed``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from multitables._train.feed import _Published

_RUN = st.tuples(st.integers(0, 2), st.integers(0, 12), st.integers(0, 6))  # epoch, first piece, pieces

_OPS = st.lists(st.one_of(st.tuples(st.just("extend"), _RUN), st.tuples(st.just("take"), st.none()),
                          st.tuples(st.just("clear"), st.none())), max_size=40)


@given(_OPS, st.lists(_RUN, min_size=1, max_size=5))
def test_the_published_pieces_are_those_of_a_list_of_every_key(ops: list, asked: list) -> None:
    # The runs say what a list of (epoch, piece) keys says, in the order published: its length, the next key, and how
    # many keys of what an epoch asks for lead it, whatever was published, taken or cleared before.
    published, keys = _Published(), []
    for op, run in ops:
        if op == "extend":
            epoch, first, n = run
            published.extend(epoch, first, first + n)
            keys += [(epoch, first + i) for i in range(n)]
        elif op == "take" and keys:
            assert published.next() == keys.pop(0)
            published.popleft()
        elif op == "clear":
            published.clear()
            keys.clear()
        assert len(published) == len(keys)
    for epoch, first, n in asked:
        wanted = [(epoch, first + i) for i in range(n)]
        leading = 0
        for have, want in zip(keys, wanted):
            if have != want:
                break
            leading += 1
        assert published.leading(epoch, first, first + n) == leading
