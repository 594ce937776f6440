"""The training face's parts (:class:`~multitables.batches.Batches`): windows cut into batches, the next epoch's
draw made ahead, mixing several sources, transforms checked in the consumer."""
