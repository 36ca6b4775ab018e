"""Sampling: mini-batch blocks from a part's local graph (or, exact, across parts).

- :class:`Block`: one layer of a mini-batch (bipartite CSR, sources by role).
- :class:`NeighborSampler`: the thread-parallel C++ neighbour sampler of one part.
- :class:`~distmb.pipeline.sample.device.DeviceNeighborSampler`: the same contract on a torch
  device.
- :class:`~distmb.halo.exact.sampler.ExactBatchSampler`: DistDGL-like exact blocks across parts.

Every batch sampler is a :class:`BatchSampler` (``sample(seeds, epoch, iteration) ->
list[Block]`` and ``uses_collectives``: whether a call talks to other ranks, so it must run on
the training thread, in step order); a sampler of one part's graph is a :class:`PartSampler`
(also ``sample_hop`` and ``full_block``). :mod:`distmb.pipeline.sample.protocol` declares
both.
"""

from distmb.pipeline.sample.blocks import Block
from distmb.pipeline.sample.host import FANOUT_ALL, NeighborSampler
from distmb.pipeline.sample.protocol import BatchSampler, PartSampler

__all__ = ["FANOUT_ALL", "BatchSampler", "Block", "NeighborSampler", "PartSampler"]
