"""The partition format on disk (docs/partition-format.md): its file names and dtypes
(:mod:`~distmb.data.store.format`), one part opened and validated
(:class:`~distmb.data.store.store.PartitionStore`), the out-of-core row files
(:mod:`~distmb.data.store.rowfile`) and neighbour files (:mod:`~distmb.data.store.neighborfile`),
and ``.npz`` members read in place (:mod:`~distmb.data.store.npzmember`)."""
