"""Datasets and partitions: everything from files on disk to arrays in memory.

- :class:`Graph`: one in-memory graph (in-edge CSR, features, labels, splits).
- :func:`load_dataset`: ``--dataset SPEC`` -> :class:`Graph`.
- :class:`PartitionStore`: one part of a partition directory, memory-mapped and validated.
- :func:`from_pyg`, :func:`from_dgl`: a PyG ``Data`` / a ``DGLGraph`` -> :class:`Graph`.
"""

from distmb.data.datasets import load_dataset, parse_spec
from distmb.data.datasets.interop import from_dgl, from_pyg
from distmb.data.graph import UNLABELED, Graph
from distmb.data.store.store import PartitionStore, read_meta

__all__ = [
    "Graph",
    "PartitionStore",
    "UNLABELED",
    "from_dgl",
    "from_pyg",
    "load_dataset",
    "parse_spec",
    "read_meta",
]
