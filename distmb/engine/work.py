"""Per-rank work counters of an epoch: the sizes of the blocks the rank trained on.

What a rank computes per iteration is fixed by its mini-batch's blocks: layer ``l`` reads
``n_src`` input rows (``n_halo`` of them halo leaves filled by the halo scheme), aggregates
over the block's edges and updates ``n_dst`` rows. Summed over an epoch these are the
rank's work, the inputs of a cost model (``benchmarks/scaling.py``): GEMM FLOPs grow with
``n_dst`` and the widths, aggregation bytes with the edges.
"""

from __future__ import annotations

import numpy as np

from distmb.pipeline.sample.blocks import Block

#: Per-layer counters of :class:`BlockWork`, int64[num_layers] each.
WORK_COUNTERS = ("block_dst", "block_src", "block_halo", "block_edges_sampled", "block_edges")


class BlockWork:
    """Sums of block sizes per layer since the last :meth:`reset`.

    ``block_edges_sampled`` counts the edges the sampler drew; ``block_edges`` the edges the
    model aggregated over, after the halo scheme dropped the edges of halo leaves it had no
    row for (HEC misses, ``--no-hec``).

    Args:
        num_layers: blocks per mini-batch.
    """

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.counts = {key: np.zeros(num_layers, dtype=np.int64) for key in WORK_COUNTERS}

    def reset(self) -> None:
        for values in self.counts.values():
            values[:] = 0

    def _check(self, blocks: list[Block]) -> None:
        if len(blocks) != self.num_layers:
            raise ValueError(f"{len(blocks)} blocks, expected {self.num_layers} (one per layer)")

    def add_sampled(self, blocks: list[Block]) -> None:
        """Count a mini-batch's blocks as sampled (before the halo scheme)."""
        self._check(blocks)
        for layer, block in enumerate(blocks):
            self.counts["block_dst"][layer] += block.n_dst
            self.counts["block_src"][layer] += block.n_src
            self.counts["block_halo"][layer] += block.n_halo
            self.counts["block_edges_sampled"][layer] += block.num_edges

    def add_used(self, blocks: list[Block]) -> None:
        """Count the edges of the blocks the model ran on (after the halo scheme)."""
        self._check(blocks)
        for layer, block in enumerate(blocks):
            self.counts["block_edges"][layer] += block.num_edges

    def as_dict(self) -> dict[str, list[int]]:
        """Every counter of :data:`WORK_COUNTERS` as a list of ints, input layer first."""
        return {key: [int(v) for v in values] for key, values in self.counts.items()}
