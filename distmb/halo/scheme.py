"""The halo-scheme seam: how one rank treats the halo leaves of its mini-batches.

A :class:`HaloScheme` is given to the trainer, which calls it at named points of every
iteration, on every rank in the same order:

1. :meth:`HaloScheme.after_sample` (training thread, before the forward pass): fill
   ``MiniBatch.halo_rows`` (and drop the edges of halo leaves that have no row);
2. :meth:`HaloScheme.layer_input` (per layer, during the forward pass): the layer's input
   rows, computed sources first, then the halo leaves;
3. :meth:`HaloScheme.end_iteration`;

and, around them, :meth:`begin_epoch`, :meth:`stats`, :meth:`state` / :meth:`restore`
(checkpoints). A scheme may also replace the loader's sample and gather stages
(:meth:`batch_sampler`, :meth:`feature_source`): the exact baseline does.

This base class is the scheme of a part without halo leaves to fill from other ranks (one
rank), and holds what every scheme shares: layer 0's halo rows come from the replicated
halo features when the partition has them (``MiniBatch.x_halo``); other halo leaves go to
:meth:`_fill`, which subclasses override.
"""

from __future__ import annotations

import numpy as np
import torch

from distmb.core.units import row_message_bytes
from distmb.pipeline.features.protocol import FeatureSource
from distmb.pipeline.minibatch import MiniBatch
from distmb.pipeline.sample.blocks import Block
from distmb.pipeline.sample.host import NeighborSampler
from distmb.pipeline.sample.protocol import BatchSampler

#: Per-layer counters every scheme reports (summed over ranks): cache lookups and hits, rows
#: and bytes pushed to peers and received from them, and the bytes an exact pull of the halo
#: rows would have moved.
LAYER_COUNTERS = (
    "lookups",
    "hits",
    "rows_pushed",
    "bytes_pushed",
    "rows_received",
    "bytes_received",
    "bytes_needed",
)
#: Per-rank seconds every scheme reports (float64[1] each, not summed over ranks): wall
#: seconds waiting for pushes to arrive, and wall and training-thread CPU seconds inside the
#: pushes' MPI calls (:class:`~distmb.halo.hec.transport.PushStats`).
SECOND_COUNTERS = ("comm_wait", "comm_mpi", "comm_mpi_cpu")


class HaloScheme:
    """No halo leaves to fill (one rank); the base of every scheme (module docstring)."""

    #: Name in logs and records.
    name = "local"
    #: Whether :meth:`state` has anything to checkpoint.
    stateful = False
    #: Whether :meth:`layer_input` reads layer 0's rows themselves (not only appends halo
    #: rows): then the loader must gather them (no :class:`~distmb.pipeline.rows.IndexedRows`).
    reads_input_rows = False

    def __init__(self) -> None:
        self.layer_dims: list[int] = []
        self.epoch = 0
        self.rows_needed: list[int] = []

    def setup(self, layer_dims: list[int]) -> None:
        """Called once by the trainer with every layer's input width."""
        self.layer_dims = list(layer_dims)
        self.rows_needed = [0] * len(layer_dims)

    @property
    def num_layers(self) -> int:
        return len(self.layer_dims)

    def describe(self) -> str:
        """One line for the run's header: what happens to halo leaves."""
        return "none to fill (one rank)"

    def schedule_warning(self, num_steps: int) -> str | None:
        """A warning when an epoch of ``num_steps`` iterations defeats the scheme, else
        None (the trainer logs it once)."""
        return None

    # -- the loader's stages -------------------------------------------------------------------
    def batch_sampler(self, local: NeighborSampler) -> BatchSampler:
        """The sample stage (default: this part's sampler)."""
        return local

    def feature_source(self, local: FeatureSource) -> FeatureSource:
        """The gather stage's features (default: this part's)."""
        return local

    # -- an iteration ----------------------------------------------------------------------------
    def begin_epoch(self, epoch: int) -> None:
        """Start of an epoch: counters restart."""
        self.epoch = epoch
        self.reset_stats()

    def after_sample(self, batch: MiniBatch, step: int, num_steps: int) -> None:
        """Fill ``batch.halo_rows`` (one float32[n_halo, dim] per layer) and replace blocks
        whose halo leaves got no row by blocks without those edges."""
        batch.halo_rows = []
        for layer, block in enumerate(batch.blocks):
            dim = self.layer_dims[layer]
            self.rows_needed[layer] += block.n_halo
            if block.n_halo == 0:
                rows = torch.empty((0, dim))
            elif layer == 0 and batch.x_halo is not None:
                rows = batch.x_halo
            else:
                block, rows = self._fill(layer, block, step)
                batch.blocks[layer] = block
            batch.halo_rows.append(rows)

    def _fill(self, layer: int, block: Block, step: int) -> tuple[Block, torch.Tensor]:
        """The halo rows of ``block`` (layer ``layer``) and the block to use."""
        raise RuntimeError(
            f"layer {layer}: {block.n_halo} halo leaves but the {self.name!r} scheme has no "
            "source for their rows (a multi-part partition on one rank?)"
        )

    def layer_input(
        self, batch: MiniBatch, layer: int, h: torch.Tensor, step: int, num_steps: int
    ) -> torch.Tensor:
        """float32[n_src, dim]: layer ``layer``'s input, ``h`` (the computed sources' rows)
        followed by the halo rows."""
        halo = batch.halo_rows[layer]
        return torch.cat([h, halo]) if halo.shape[0] else h

    def end_iteration(self) -> None:
        """After the optimizer step."""

    # -- statistics ------------------------------------------------------------------------------
    def stats(self) -> dict[str, np.ndarray]:
        """This rank's counters since :meth:`begin_epoch`: each of :data:`LAYER_COUNTERS`
        as int64[num_layers], ``bytes_exact_remote`` int64[1], each of
        :data:`SECOND_COUNTERS` as float64[1] (seconds)."""
        out = {key: np.zeros(self.num_layers, dtype=np.int64) for key in LAYER_COUNTERS}
        out["bytes_needed"] = np.array(
            [
                n * row_message_bytes(d)
                for n, d in zip(self.rows_needed, self.layer_dims, strict=True)
            ],
            dtype=np.int64,
        )
        out["bytes_exact_remote"] = np.zeros(1, dtype=np.int64)
        for key in SECOND_COUNTERS:
            out[key] = np.zeros(1, dtype=np.float64)
        return out

    def reset_stats(self) -> None:
        self.rows_needed = [0] * self.num_layers

    # -- checkpoints -------------------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """Arrays to checkpoint (taken between epochs)."""
        return {}

    def state_keys(self) -> set[str]:
        """The names :meth:`state` returns."""
        return set()

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`state`."""


class DropHalo(HaloScheme):
    """``--no-hec``: halo leaves without replicated features lose their edges (the
    communication-free lower bound)."""

    name = "drop"

    def describe(self) -> str:
        return "dropped (--no-hec)"

    def _fill(self, layer: int, block: Block, step: int) -> tuple[Block, torch.Tensor]:
        """The block without its halo leaves' edges and zero rows, where the block lives
        (the training device on the GPU path)."""
        keep = torch.ones(block.n_src, dtype=torch.bool, device=block.device)
        keep[block.n_computed :] = False
        rows = torch.zeros((block.n_halo, self.layer_dims[layer]), device=block.device)
        return block.drop_sources(keep), rows
