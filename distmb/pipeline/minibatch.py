"""One training iteration's data: seeds, blocks, inputs by role, labels, features."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from distmb.pipeline.rows import IndexedRows, materialized
from distmb.pipeline.sample.blocks import Block
from distmb.pipeline.streams import EventSpan


@dataclass
class MiniBatch:
    """What the BatchLoader produces for one batch, and the halo scheme completes.

    Attributes:
        epoch: the epoch the batch belongs to.
        index: the batch's identity, its position in the epoch's plan: with the seed and the
            epoch it fixes the batch's random stream, so a batch holds the same vertices and
            edges whatever order the loader produces batches in.
        seeds: int64[batch], the seed vertices (``VID_p``, solid).
        blocks: one per layer, ``blocks[0]`` feeding the input layer.
        labels: int64[batch], the seeds' labels.
        x: float32[blocks[0].n_computed, F], input features of block 0's computed (solid)
            sources; None until the gather stage ran. With the loader's ``in_place``, the
            same rows as :class:`~distmb.pipeline.rows.IndexedRows` (read where they are; a consumer
            that needs a tensor calls :meth:`input_rows`).
        x_halo: float32[blocks[0].n_halo, F], input features of block 0's halo leaves when
            the feature source holds them (replicated halo features), else None: the halo
            scheme supplies those rows.
        halo_rows: per layer, float32[blocks[l].n_halo, dim_l], the halo leaves' input rows;
            filled by the halo scheme before the forward pass.
        sample_s, gather_s: host (wall-clock) seconds the sample and gather stages took on
            whichever thread ran them; with device stages on a GPU, the time to launch their
            work (and to wait for their host reads), not the GPU's time.
        sample_span, gather_span: on a CUDA loader, the stages' device work between timing
            events (:class:`~distmb.pipeline.streams.EventSpan`, read once per epoch by the
            trainer's timer); None elsewhere.
        sample_cpu_s, gather_cpu_s: CPU seconds of the thread that ran each stage
            (``time.thread_time``: the stage's whole cost with one thread per rank, see
            :mod:`distmb.engine.timers`).
        buffer: the flat storage behind ``x`` when the loader recycles buffers, else None.
    """

    epoch: int
    index: int
    seeds: np.ndarray
    blocks: list[Block]
    labels: torch.Tensor
    x: torch.Tensor | IndexedRows | None = None
    x_halo: torch.Tensor | None = None
    halo_rows: list[torch.Tensor] = field(default_factory=list)
    sample_s: float = 0.0
    gather_s: float = 0.0
    sample_cpu_s: float = 0.0
    gather_cpu_s: float = 0.0
    sample_span: EventSpan | None = field(default=None, repr=False)
    gather_span: EventSpan | None = field(default=None, repr=False)
    buffer: torch.Tensor | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        """Number of seeds."""
        return int(self.seeds.size)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> MiniBatch:
        """Move the blocks, labels, input rows and halo rows to ``device``, in place; returns
        the batch. ``non_blocking`` copies from pinned host memory overlap with the caller
        (the copy is ordered on the device's current stream). ``seeds`` stay a host array,
        and so does ``buffer``: the device copies do not alias it, so its owner (the
        BatchLoader's to-device stage) may recycle it at once."""
        device = torch.device(device)
        self.blocks = [block.to(device, non_blocking) for block in self.blocks]
        self.labels = self.labels.to(device, non_blocking=non_blocking)
        if isinstance(self.x, IndexedRows) and self.x.device != device:
            self.x = self.x.materialize()
        if self.x is not None and self.x.device != device:
            self.x = self.x.to(device, non_blocking=non_blocking)
        if self.x_halo is not None and self.x_halo.device != device:
            self.x_halo = self.x_halo.to(device, non_blocking=non_blocking)
        self.halo_rows = [rows.to(device, non_blocking=non_blocking) for rows in self.halo_rows]
        return self

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the batch holds for its consumer, on whatever device: each block's
        ``indptr``, ``indices`` and ``src_ids``, ``labels``, ``x`` (or the table, ids and head
        of rows read in place), ``x_halo`` and ``halo_rows`` (not ``buffer``, the loader's
        host storage behind ``x``)."""
        held = [t for b in self.blocks for t in (b.indptr, b.indices, b.src_ids)]
        held.append(self.labels)
        if isinstance(self.x, IndexedRows):
            held.extend(t for t in (self.x.table, self.x.ids, self.x.head) if t is not None)
        elif self.x is not None:
            held.append(self.x)
        if self.x_halo is not None:
            held.append(self.x_halo)
        held.extend(self.halo_rows)
        return held

    def input_rows(self) -> torch.Tensor | None:
        """``x`` as a tensor (rows read in place are gathered now)."""
        return materialized(self.x) if self.x is not None else None

    def solid_ids(self, layer: int) -> torch.Tensor:
        """int64[n_computed]: ids of ``blocks[layer]``'s computed (solid) sources."""
        block = self.blocks[layer]
        return block.src_ids[: block.n_computed]

    def halo_ids(self, layer: int) -> torch.Tensor:
        """int64[n_halo]: ids of ``blocks[layer]``'s halo leaves."""
        block = self.blocks[layer]
        return block.src_ids[block.n_computed :]
