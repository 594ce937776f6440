"""The internals of ``multitables-benchmark`` (the command is ``multitables_benchmark.py``); not part of the library.

Modules, top to bottom (each imports only those below it):

* ``cli``: the command line, and running what it asks for;
* ``sections``: the training and random-access sections, with ``training``
  (shards, PyTorch's DataLoader and MosaicML streaming side by side);
* ``scaling_report`` over ``scaling`` over ``scaling_passes``: the scaling
  section (n_procs 1, 2, 4 ... beside plain h5py processes and PyTorch's
  DataLoader, each pass in a fresh process), with ``counters`` (minor faults
  and context switches per GiB, in the readers and the consumer);
* ``userdata``: ``--read``, the main section's jobs on a user's own datasets
  (described and checked before any pass), beside ``read_report``: their tables,
  over ``report``;
* ``passes``: timing one pass of one reader, and which jobs a run times;
* ``plot`` over ``report``: the report, from the passes and their context;
* ``readers``: the ways of reading a whole file (O_DIRECT, one process, multitables);
* ``cache_modes``: the ``--cache`` modes: the page cache before each pass;
* ``diskmodel`` (with ``diskmodel.c``): a spinning disk or a RAID 0 of two,
  modelled under every reader process (``--disk-model``); ``diskmodel_fidelity``
  measures how faithful it is;
* ``files``, ``cache``, ``machine``, ``records``: writing the files, page-cache
  control (eviction, residency, O_DIRECT reads, memory settling, the
  direct-driver probe), describing the machine, and the records and
  constants everything shares.
"""
