"""Sampling: mini-batch blocks from a part's local graph (or, exact, across parts).

- :class:`Block`: one layer of a mini-batch (bipartite CSR, sources by role).
- :class:`NeighborSampler`: the thread-parallel C++ neighbour sampler of one part.
- :class:`~distmb.halo.exact.sampler.ExactBatchSampler`: DistDGL-like exact blocks across parts.

Every batch sampler has ``sample(seeds, epoch, iteration) -> list[Block]`` and
``uses_collectives`` (whether a call talks to other ranks, so it must run on the training
thread, in step order).
"""

from distmb.pipeline.sample.blocks import Block
from distmb.pipeline.sample.host import FANOUT_ALL, NeighborSampler

__all__ = ["FANOUT_ALL", "Block", "NeighborSampler"]
