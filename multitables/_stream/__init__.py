"""The streaming face's parts (:class:`~multitables.Streamer`'s queues and generator): the queue and its guards,
the generator's row iterator, and the two back ends a queue reads through, reader processes or this process."""
