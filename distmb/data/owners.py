"""Who owns which vertex: ``VID_o`` -> owning part, and this part's ``VID_o`` -> ``VID_p``."""

from __future__ import annotations

import numpy as np

from distmb.data.store.store import PartitionStore


class VertexOwners:
    """The partition-wide owner table and this part's solid ``VID_o -> VID_p`` map.

    Attributes:
        rank: this part.
        node_part: int32[num_nodes], owning part of every ``VID_o`` (memory-mapped).
        orig_ids: int64[n_local], ``VID_o`` of every local vertex.
    """

    def __init__(self, store: PartitionStore) -> None:
        self.rank = store.part
        self.node_part = store.node_part()
        self.orig_ids = np.asarray(store.orig_ids, dtype=np.int64)
        solid = self.orig_ids[: store.n_solid]
        self._by_orig = np.argsort(solid, kind="stable")  # VID_p sorted by VID_o
        self._sorted_orig = solid[self._by_orig]

    def owner(self, orig: np.ndarray) -> np.ndarray:
        """int32[n]: the part owning each ``VID_o``."""
        return self.node_part[orig]

    def local(self, orig: np.ndarray) -> np.ndarray:
        """int64[n]: ``VID_p`` of vertices given as ``VID_o``; they must be solid here.

        Raises:
            RuntimeError: some vertex is not owned by this part (``node_part.npy`` disagrees
                with the part's ``orig_ids``).
        """
        pos = np.searchsorted(self._sorted_orig, orig)
        pos = np.minimum(pos, max(self._sorted_orig.size - 1, 0))
        if orig.size and not np.array_equal(self._sorted_orig[pos], orig):
            raise RuntimeError(
                f"rank {self.rank} was asked for vertices it does not own: node_part.npy "
                "disagrees with the part's orig_ids"
            )
        return self._by_orig[pos]
