"""What every package may need and that knows nothing of GNNs: error types
(:mod:`~distmb.core.errors`), atomic file writes (:mod:`~distmb.core.atomic`), the writers'
temporaries (:mod:`~distmb.core.temporaries`), units, counter-based random streams
(:mod:`~distmb.core.rng`), progress meters (:mod:`~distmb.core.progress`), facts about the
machine (:mod:`~distmb.core.machine`), the allocator's settings (:mod:`~distmb.core.malloc`),
the figures' conventions (:mod:`~distmb.core.plotting`) and the counted device-to-host reads
(:mod:`~distmb.core.host_reads`). The lowest layer: imports nothing of distmb."""
