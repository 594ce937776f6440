"""The random-access face's parts (:class:`~multitables.Reader`): its shared state, requests, stages, futures, the
proxy, and the 2.x names of its classes and modules."""
