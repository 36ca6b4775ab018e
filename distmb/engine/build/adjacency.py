"""``--graph-layout``: where a rank's sampler reads in-neighbour lists from."""

from __future__ import annotations

import numpy as np

from distmb.config.train import TrainConfig
from distmb.core.errors import InputError
from distmb.core.machine import check_fits
from distmb.data.local import LocalGraph
from distmb.data.store.neighborfile import NeighborFile


def open_adjacency(local: LocalGraph, config: TrainConfig) -> np.ndarray | NeighborFile:
    """The ``indices`` argument of the rank's samplers: the part's (memory-mapped) array for
    ``--graph-layout mmap``, or a :class:`NeighborFile` over its ``indices.npy`` with a static
    cache of ``--neighbor-cache-mb`` filled in ``--neighbor-cache-order`` for ``ooc``.

    Raises:
        InputError: ``--graph-layout ooc`` without a partition (``--part-dir``).
    """
    if config.graph_layout != "ooc":
        return local.indices
    if local.store is None:
        raise InputError(
            "--graph-layout ooc reads a partition's indices.npy: give --part-dir (a 1-part "
            "partition for one rank: distmb-partition --parts 1)"
        )
    lists_bytes = int(local.indptr[-1]) * np.dtype(local.indices.dtype).itemsize
    need = min(int(config.neighbor_cache_mb * 2**20), lists_bytes)
    check_fits("--neighbor-cache-mb", config.neighbor_cache_mb, need)
    return NeighborFile.from_store(
        local.store, cache_mb=config.neighbor_cache_mb, priority=config.neighbor_cache_order
    )


def describe_adjacency(adjacency: np.ndarray | NeighborFile, config: TrainConfig) -> str:
    """The run header's part about the neighbour lists: empty when they are in memory."""
    if not isinstance(adjacency, NeighborFile):
        return ""
    return (
        f"; neighbour lists: ooc ({'O_DIRECT' if adjacency.direct else 'buffered'}), cache "
        f"{adjacency.cache_vertices} lists, {adjacency.cache_bytes / 2**20:.1f} MiB "
        f"({config.neighbor_cache_order})"
    )


def neighbor_cache_stats(adjacency: NeighborFile) -> dict[str, float]:
    """This epoch's counters of ``--graph-layout ooc``'s neighbour-list cache, under the
    names every cache reports (:func:`distmb.engine.stats.cache_record`)."""
    c = adjacency.counters()
    return {
        "lookups": float(c["lists_requested"]),
        "hits": float(c["cache_hits"]),
        "rows_read": float(c["lists_read"]),
        "bytes_read": float(c["bytes_read"]),
        "read_time": float(c["read_seconds"]),
        "inspect_time": 0.0,
        "memory_bytes": float(c["cache_bytes"]),
    }
