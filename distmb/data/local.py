"""What one rank trains on: a part's local graph (or the whole graph on a single rank)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from distmb.data.graph import Graph
from distmb.data.store.store import PartitionStore


@dataclass
class LocalGraph:
    """The local view of one rank, in VID_p: solid vertices ``[0, n_solid)``, then halo.

    Attributes:
        indptr: int64[n_solid + 1], in-edge CSR of the solid vertices.
        indices: int32 or int64[num_edges], sources as VID_p (may be memory-mapped).
        n_solid, n_local: vertex counts (``n_local - n_solid`` halo vertices).
        features: float32[n_solid, feat_dim] (may be memory-mapped).
        labels: int64[n_solid].
        train_idx, val_idx, test_idx: int64 VID_p of solid vertices.
        num_classes: number of classes.
        identity: what identifies the graph (name, sizes, sha256), for checkpoints.
        halo_features: float32[n_local - n_solid, feat_dim] replicated halo rows, or None.
        store: the part this view was opened from (send lists, owners), or None for a whole
            graph.
    """

    indptr: np.ndarray
    indices: np.ndarray
    n_solid: int
    n_local: int
    features: np.ndarray
    labels: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    num_classes: int
    identity: dict[str, Any]
    halo_features: np.ndarray | None = None
    store: PartitionStore | None = None

    @property
    def feat_dim(self) -> int:
        return int(self.features.shape[1])

    @classmethod
    def from_graph(cls, graph: Graph) -> LocalGraph:
        """The whole graph as one rank's view (no halo vertices)."""
        ident = graph.identity()
        return cls(
            indptr=graph.indptr,
            indices=graph.indices,
            n_solid=graph.num_nodes,
            n_local=graph.num_nodes,
            features=graph.features,
            labels=graph.labels,
            train_idx=graph.train_idx,
            val_idx=graph.val_idx,
            test_idx=graph.test_idx,
            num_classes=graph.num_classes,
            identity={
                "graph_name": ident["name"],
                "graph_sha256": ident["sha256"],
                "num_nodes": ident["num_nodes"],
                "num_edges": ident["num_edges"],
                "feat_dim": ident["feat_dim"],
                "num_classes": ident["num_classes"],
            },
        )

    @classmethod
    def from_store(cls, store: PartitionStore) -> LocalGraph:
        """One part of a partition directory (arrays stay memory-mapped)."""
        return cls(
            indptr=store.indptr,
            indices=store.indices,
            n_solid=store.n_solid,
            n_local=store.n_local,
            features=store.features,
            labels=np.asarray(store.labels),
            train_idx=np.asarray(store.train_idx),
            val_idx=np.asarray(store.val_idx),
            test_idx=np.asarray(store.test_idx),
            num_classes=store.num_classes,
            identity=store.graph_identity(),
            halo_features=store.halo_features,
            store=store,
        )
