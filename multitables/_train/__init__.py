"""The training face's parts (:class:`~multitables.batches.Batches`): windows cut into batches, mixing several
sources, transforms checked in the consumer."""
