"""The sampler protocols: what the BatchLoader's sample stage and the samplers' other users
call.

- :class:`BatchSampler`: blocks of one mini-batch from its seeds (the sample stage). Every
  sampler of the data path is one: :class:`~distmb.pipeline.sample.NeighborSampler` (C++),
  :class:`~distmb.pipeline.sample.device.DeviceNeighborSampler` (torch ops / Triton) and
  :class:`~distmb.halo.exact.sampler.ExactBatchSampler` (across ranks).
- :class:`PartSampler`: a :class:`BatchSampler` over one part's local graph, which also draws
  single hops (for samplers that grow a batch across parts) and exact full-neighbour blocks
  (layer-wise evaluation). The C++ and the device sampler are the two.

The block contract every implementation meets is stated in :mod:`distmb.pipeline.sample.host`
and checked for all of them by ``tests/test_sampler_contract.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch

from distmb.pipeline.sample.blocks import Block


class BatchSampler(ABC):
    """The sample stage: the blocks of one mini-batch.

    Attributes:
        uses_collectives: whether :meth:`sample` talks to other ranks; then every rank must
            call it once per iteration, in step order, from the training thread (it cannot
            run on the loader's prefetch thread). False by default: sampling reads this rank's
            part only.
    """

    uses_collectives: bool = False

    @abstractmethod
    def sample(self, seeds: np.ndarray | torch.Tensor, epoch: int, iteration: int) -> list[Block]:
        """The blocks of one mini-batch.

        Args:
            seeds: int64[batch], distinct solid ``VID_p`` of this rank.
            epoch, iteration: with the sampler's seed they fix the random draws: the same
                triple gives the same blocks.

        Returns:
            one block per layer, ``blocks[0]`` feeding the input layer and ``blocks[-1]``
            producing the seeds (its destinations are the seeds, in their order).
        """


class PartSampler(BatchSampler):
    """A :class:`BatchSampler` over one part's local in-edge CSR (solid rows
    ``[0, n_solid)``, sources ``[0, n_local)``, the halo vertices ``[n_solid, n_local)`` being
    leaves).

    Attributes:
        fanouts: per layer, input layer first: a positive count or
            :data:`~distmb.pipeline.sample.FANOUT_ALL`.
        n_solid: vertices with in-edges here (the CSR's rows).
        n_local: solid and halo vertices.
    """

    fanouts: list[int]
    n_solid: int
    n_local: int

    @property
    def num_layers(self) -> int:
        """Blocks per mini-batch (``len(fanouts)``)."""
        return len(self.fanouts)

    @abstractmethod
    def sample_hop(
        self, dst_ids: np.ndarray | torch.Tensor, fanout: int, epoch: int, iteration: int
    ) -> Block:
        """One block: up to ``fanout`` (or ``FANOUT_ALL``) in-neighbours of every ``dst_ids``
        entry (int64[n], distinct solid ``VID_p``), drawn like one layer of :meth:`sample`
        keyed by ``(epoch, iteration)``."""

    @abstractmethod
    def full_block(self, dst_ids: np.ndarray | torch.Tensor) -> Block:
        """One exact block: every in-neighbour of ``dst_ids`` (int64[n], distinct solid
        ``VID_p``), each row in CSR order."""
