"""HDF5's filter pipeline, run in reverse on one stored chunk: the chunk engine's decoder.

A dataset's filters are applied in order when a chunk is written, so a
reader undoes them last to first. Each chunk records a *filter mask*: bit
``i`` set means filter ``i`` was skipped for that chunk (an optional filter
that failed, as blosc does on incompressible data); those are skipped here too.

Every codec writes into a buffer it is given where its library can (the last
codec writes into the caller's output, which may be the ring slot itself), so
a chunk costs one decode and no copy. The codecs, one module each, chosen by
measurement on 256 KiB chunks of float32 noise, one core (see
:data:`~multitables._io.chunks.codecs.registry.CHOICES`):

* deflate (:mod:`.deflate`): libdeflate through ``imagecodecs.deflate_decode(out=)``,
  2.4x ``zlib.decompress``; ``zlib`` where imagecodecs is missing.
* shuffle (:mod:`.shuffle`): c-blosc2's SIMD ``blosc2_unshuffle`` (from the
  library the ``blosc2`` wheel ships, by ctypes), 3.4x a per-byte numpy copy,
  which is the fall-back.
* fletcher32 (:mod:`.fletcher32`): HDF5's own sum
  (``imagecodecs.h5checksum_fletcher32``, 2.5 GB/s), or an exact numpy
  version (1 GB/s); a mismatch is a :class:`~.base.ChunkDecodeError`.
* blosc (32001, :mod:`.blosc`): c-blosc through imagecodecs
  (``blosc2.decompress`` where it is missing: same speed); blosc2 (32026,
  :mod:`.blosc2`): the ``blosc2`` package's frames, blocks put in C order with numpy.
* bitshuffle (32008, with its lz4 or zstd blocks, :mod:`.bitshuffle`): the
  bitshuffle library in hdf5plugin's own plugin, by ctypes (imagecodecs block
  by block where it cannot be loaded: 2.5x slower).
* lz4 (32004, HDF5's framing), zstd (32015), lzf (32000): imagecodecs
  (:class:`~.base.OutCodec`); bzip2 (307, :mod:`.bzip2`): imagecodecs, ``bz2``
  where it is missing.

:mod:`.base` holds what every codec shares (the filter ids, :class:`~.base.FilterSpec`,
the errors); :mod:`.libraries` finds the codec libraries on first use;
:func:`.registry.build_pipeline` maps a dataset's filters to codecs and
raises :class:`~.base.UnsupportedFilter` for anything else (szip,
scale-offset, n-bit, unknown plugins): the engine then leaves the dataset to
h5py, decided once at open. :class:`.pipeline.Pipeline` runs the codecs on
one chunk at a time.

Import from the defining module; this package re-exports nothing.
"""
