"""``NeighborLoader``: mini-batches over seed vertices, the way DGL's ``DataLoader`` with a
``NeighborSampler`` and PyG's ``NeighborLoader`` hand them out.

A thin front of the trainer's own data path: the seeds are shuffled and split into batches
as the trainer does (:func:`~distmb.pipeline.plan.shuffled`,
:func:`~distmb.pipeline.plan.split_batches`), a
:class:`~distmb.pipeline.sample.NeighborSampler` samples the blocks and a
:class:`~distmb.pipeline.BatchLoader` gathers the input rows (ahead on a thread with
``prefetch``). Each ``for batch in loader`` is one epoch; the next one reshuffles.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from distmb.core.errors import InputError
from distmb.data.graph import Graph
from distmb.data.local import LocalGraph
from distmb.pipeline.features.memory import ArrayFeatures, PartFeatures
from distmb.pipeline.features.protocol import FeatureSource
from distmb.pipeline.loader import DEFAULT_PREFETCH, BatchLoader
from distmb.pipeline.minibatch import MiniBatch
from distmb.pipeline.plan import shuffled, split_batches
from distmb.pipeline.sample.host import NeighborSampler


class NeighborLoader:
    """Iterate :class:`MiniBatch` objects over ``seeds``.

    Every batch has ``blocks`` (one per layer, ``blocks[0]`` feeding the input layer and
    ``blocks[-1].dst_ids`` equal to ``seeds``), ``x`` float32[blocks[0].n_computed, F] (the
    input rows of block 0's sources), ``labels`` int64[batch] and ``seeds`` int64[batch];
    ``model(batch.blocks, batch.x)`` gives the seeds' logits. On one part of a partition
    (a :class:`LocalGraph` with halo vertices) block 0's halo rows are in ``x_halo`` when
    the partition replicates them (``torch.cat([batch.x, batch.x_halo])``).

    Args:
        graph: a :class:`~distmb.data.Graph` or a :class:`~distmb.data.local.LocalGraph`.
        seeds: the seed vertices: int[n] ids (solid ``VID_p`` of a part) or a bool[num_nodes]
            mask (numpy or torch), e.g. ``graph.train_idx``.
        fanout: neighbours sampled per layer, input layer first (``-1``: all).
        batch_size: seeds per batch at most; the seeds are split into
            ``ceil(n / batch_size)`` batches whose sizes differ by at most one (the
            trainer's split: no ragged last batch).
        shuffle: reshuffle the seeds every epoch (else keep their order).
        seed: the random seed of shuffling and sampling (with the epoch and the batch's
            index it fixes every batch: two loaders with the same arguments agree).
        prefetch: batches sampled and gathered ahead on a background thread (0: none).
        epoch: the first epoch (:meth:`set_epoch` moves it; every iteration advances it).

    Raises:
        InputError: seeds out of range, repeated, not integers or a mask of the wrong
            length; an empty seed set; a bad fan-out or batch size.
    """

    def __init__(
        self,
        graph: Graph | LocalGraph,
        seeds: np.ndarray | torch.Tensor | Sequence[int],
        fanout: Sequence[int],
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        prefetch: int = DEFAULT_PREFETCH,
        epoch: int = 0,
    ) -> None:
        local = graph if isinstance(graph, LocalGraph) else LocalGraph.from_graph(graph)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"NeighborLoader: batch_size must be an int >= 1, got {batch_size!r}")
        if prefetch < 0:
            raise InputError(f"NeighborLoader: prefetch must be >= 0, got {prefetch}")
        self.local = local
        self.seeds = _seed_ids(seeds, local.n_solid)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = epoch
        try:
            self.sampler = NeighborSampler(
                local.indptr, local.indices, local.n_solid, local.n_local, list(fanout), seed
            )
        except ValueError as exc:
            raise InputError(f"NeighborLoader: {exc}") from None
        self.loader = BatchLoader(
            self.sampler, feature_source(local), local.labels, prefetch=prefetch
        )

    @property
    def num_layers(self) -> int:
        """Blocks per batch (the fan-out's length)."""
        return self.sampler.num_layers

    def __len__(self) -> int:
        """Batches per epoch."""
        return -(-self.seeds.size // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (its shuffle and samples)."""
        self.epoch = int(epoch)

    def batches(self, epoch: int) -> list[np.ndarray]:
        """The seeds of every batch of ``epoch``, in order (int64 arrays)."""
        order = shuffled(self.seeds, self.seed, epoch) if self.shuffle else self.seeds
        return split_batches(order, len(self))

    def __iter__(self) -> Iterator[MiniBatch]:
        """One epoch of batches; the epoch counter then advances."""
        epoch = self.epoch
        self.epoch += 1
        return self.loader(self.loader.plan(epoch, self.batches(epoch)))


def feature_source(local: LocalGraph) -> FeatureSource:
    """The local graph's input rows: its features, with the replicated halo rows after them
    when a part has them."""
    solid = ArrayFeatures(local.features)
    if local.halo_features is not None and local.n_local > local.n_solid:
        return PartFeatures(solid, ArrayFeatures(local.halo_features))
    return solid


def _seed_ids(seeds: np.ndarray | torch.Tensor | Sequence[int], n_solid: int) -> np.ndarray:
    """``seeds`` as distinct int64 ids in ``[0, n_solid)`` (a bool mask -> its positions)."""
    if isinstance(seeds, torch.Tensor):
        seeds = seeds.detach().cpu().numpy()
    arr = np.asarray(seeds)
    if arr.dtype == np.bool_:
        if arr.shape != (n_solid,):
            raise InputError(
                f"NeighborLoader: a seed mask must be bool[{n_solid}] (one per vertex), got "
                f"shape {list(arr.shape)}"
            )
        arr = np.flatnonzero(arr)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise InputError(
            f"NeighborLoader: seeds must be a 1-D integer array or a bool mask, got "
            f"{arr.dtype}{list(arr.shape)}"
        )
    arr = arr.astype(np.int64)
    if arr.size == 0:
        raise InputError("NeighborLoader: no seeds")
    if arr.min() < 0 or arr.max() >= n_solid:
        raise InputError(
            f"NeighborLoader: seeds must be vertex ids in [0, {n_solid}), got "
            f"[{arr.min()}, {arr.max()}]"
        )
    if np.unique(arr).size != arr.size:
        raise InputError("NeighborLoader: seeds contain repeated ids")
    return arr
