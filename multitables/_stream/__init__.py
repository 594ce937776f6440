"""The streaming face's parts (:class:`~multitables.Streamer`'s queues and generator): the queue and its guards,
and the two back ends a queue reads through, reader processes or this process."""
