"""The one-read mini-batch sampler replayed from CUDA graphs: one replay a batch.

:func:`~distmb.pipeline.sample.device_batch.launch_batch` sizes every layer of a batch by
bounds that depend on the seed count and the fan-outs only, and launches its kernels (five a
layer and one a batch on the Triton path) without reading the host. So for one batch shape,
``(n_seeds, fanouts)``, the launches are the same every batch, only their inputs differ: the
seeds and the layers' random keys. :class:`SamplerGraphs` captures them once per shape into a
:class:`torch.cuda.CUDAGraph` whose inputs are two static device buffers, and then samples a
batch as

1. the seeds copied into the static ``seeds`` buffer (one device copy), the layers' keys
   (:func:`~distmb.pipeline.sample.choose_triton.layer_key`, signed words) into the static
   ``keys`` buffer from page-locked memory (one asynchronous host-to-device copy: the layer
   kernel reads its key from the device, ``choose_layer(key=<tensor>)``);
2. one replay;
3. the batch's one host read of every layer's counts, the errors raised as the eager path
   raises them (:func:`~distmb.pipeline.sample.device_batch.batch_blocks`);
4. the blocks' arrays copied out of the graph's memory in one ``torch.cat`` (the next replay
   overwrites it), each block's ``indptr``, ``indices`` and ``src_ids`` views of that one
   buffer.

Four launches a batch where the eager path makes sixteen Triton launches (a 3-layer batch),
and none of the Python work around them. The blocks are the eager path's bit for bit (same
keys, same seeds, same kernels).

**Fitted bounds.** The full bounds count every sampled neighbour as new; sampled
neighbourhoods overlap, so a batch's lower layers hold far fewer destinations (on the
products-shaped benchmark graph the input layer's rows are about two thirds of their
bound), and the launches over the unused rows are work all the same. A shape's graph is
launched with bounds fitted to its eager batches: each layer's destinations with
:func:`~distmb.pipeline.sample.padded.with_headroom`'s room, at most the full bounds. A
replayed batch that needs more rows in a layer samples a prefix of them (the layer above
caps the count it hands down, ``n_next``, so nothing is read or written past the
buffers); its read shows it (:class:`~distmb.pipeline.sample.device_batch.BoundExceeded`),
and the batch is sampled again eagerly with the full bounds (the same blocks: a row's
random words depend on its index only), the shape's bounds are refitted to it and its graph
captured again at its next batch; after :data:`MAX_REFITS` refits with the full bounds.

**When.** A shape's first batch runs eagerly (its warm-up, which fits its bounds; again
while none has succeeded); at the next, its graph is captured, after one more eager launch
from the static buffers (it compiles the key-from-device kernels outside the capture), on a
stream of its own with
``capture_error_mode="thread_local"`` and no device-wide synchronisation (the BatchLoader's
producer thread samples while the training thread runs, and may capture its own step).
Captures and replays hold :data:`~distmb.core.graph_lock.GRAPH_LOCK`, as the training step
does around its random ops, captures and replays: while any graph is captured, PyTorch's
default CUDA generator refuses every use outside the capture, a replay's included.
At most :data:`MAX_SAMPLER_GRAPHS` shapes are captured (an epoch has two:
the batch size and the last batch's); batches of any other shape run eagerly. Each graph
holds its layers' buffers, sized by its bounds (about 60 to 100 bytes a Fused-Map key,
:func:`~distmb.pipeline.sample.device_batch.fits_one_read`), for the sampler's lifetime.

Off CUDA (the tests' stand-in) there is no graph: a "replay" launches the batch eagerly from
the static buffers and copies every output into the first launch's buffers, so the blocks
are cut from memory that the next batch overwrites, as on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from distmb.core.graph_lock import GRAPH_LOCK
from distmb.core.host_reads import host_values
from distmb.core.rng import to_signed
from distmb.pipeline.sample.blocks import Block
from distmb.pipeline.sample.choose_triton import layer_key
from distmb.pipeline.sample.device_batch import (
    BoundExceeded,
    LaunchedBatch,
    batch_blocks,
    destination_bounds,
    launch_batch,
)
from distmb.pipeline.sample.idmap import Backend
from distmb.pipeline.sample.padded import with_headroom

#: Batch shapes ``(n_seeds, fanouts)`` that get a graph; batches of other shapes run eagerly.
MAX_SAMPLER_GRAPHS = 2
#: Refits of a shape's bounds after batches that exceed them; at the next, its graph takes
#: the full bounds (:func:`~distmb.pipeline.sample.device_batch.destination_bounds`).
MAX_REFITS = 2

Shape = tuple[int, tuple[int, ...]]


@dataclass
class _ShapeGraph:
    """One batch shape's graph and its static buffers.

    Attributes:
        seeds: int64[n_seeds], the graph's seeds (written before each replay).
        keys: int64[n_layers], the layers' keys as signed words (index: the layer).
        bounds: every layer's destination rows (index: the layer), fitted.
        launched: the captured launch's layers and counts, in the graph's memory.
        graph: the ``torch.cuda.CUDAGraph``; None off CUDA (the stand-in).
    """

    seeds: torch.Tensor
    keys: torch.Tensor
    bounds: list[int]
    launched: LaunchedBatch
    graph: Any = None


@dataclass
class SamplerGraphs:
    """The graphs of one sampler's one-read batches (module docstring).

    Args:
        csr_indptr, csr_indices: the part's CSR on the device, as the sampler holds it.
        n_solid: rows of the CSR.
        backend: Fused-Map's back end (the sampler's; ``"triton"`` on the one-read path).
    """

    csr_indptr: torch.Tensor
    csr_indices: torch.Tensor
    n_solid: int
    backend: Backend
    _graphs: dict[Shape, _ShapeGraph] = field(default_factory=dict)
    #: Per shape, the bounds fitted to its eager batches, and its refits so far.
    _fitted: dict[Shape, list[int]] = field(default_factory=dict)
    _refits: dict[Shape, int] = field(default_factory=dict)
    #: Graph replays (stand-in launches off CUDA), captures, and replayed batches that
    #: exceeded their graph's bounds (sampled again eagerly) so far.
    replays: int = 0
    captures: int = 0
    overflows: int = 0
    #: The stream graphs are captured on (CUDA; made at the first capture).
    _stream: Any = None

    def sample(
        self,
        seeds: torch.Tensor,
        fanouts: Sequence[int],
        batch: int,
        raise_bad_seed: Callable[[torch.Tensor], None],
    ) -> list[Block]:
        """The blocks of one batch, as
        :func:`~distmb.pipeline.sample.device_batch.sample_one_read` makes them (same
        arguments and errors), from a graph where the shape has one."""
        shape = (int(seeds.shape[0]), tuple(int(f) for f in fanouts))
        keys = [layer_key(batch, layer) for layer in range(len(fanouts))]
        entry = self._graphs.get(shape)
        if entry is None:
            if len(self._graphs) >= MAX_SAMPLER_GRAPHS:  # no room: nothing kept for it
                return self._read(seeds, self._launch(seeds, fanouts, keys), raise_bad_seed)
            if shape not in self._fitted:  # its warm-up (again, if one failed)
                return self._eager(shape, seeds, keys, raise_bad_seed)
            with GRAPH_LOCK:  # no other thread's random op or replay during the capture
                entry = self._capture(seeds, fanouts, self._fitted[shape])
            self._graphs[shape] = entry
        entry.seeds.copy_(seeds)
        _upload(keys, entry.keys)
        with GRAPH_LOCK:  # a replay checks the CUDA generator's mode (distmb.core.graph_lock)
            self._replay(entry, fanouts)
        try:
            blocks = self._read(seeds, entry.launched, raise_bad_seed)
        except BoundExceeded:
            # Refit to this batch too; the graph is captured again at the shape's next batch.
            self.overflows += 1
            self._refits[shape] = self._refits.get(shape, 0) + 1
            del self._graphs[shape]
            return self._eager(shape, seeds, keys, raise_bad_seed)
        return _owned(blocks)

    def bounds(self, n_seeds: int, fanouts: Sequence[int]) -> list[int] | None:
        """The bounds of the graph of ``(n_seeds, fanouts)`` (index: the layer), or None
        while it has none."""
        entry = self._graphs.get((n_seeds, tuple(fanouts)))
        return None if entry is None else list(entry.bounds)

    def _eager(
        self,
        shape: Shape,
        seeds: torch.Tensor,
        keys: Sequence[int],
        raise_bad_seed: Callable[[torch.Tensor], None],
    ) -> list[Block]:
        """A batch launched with the full bounds, and the shape's bounds fitted to it:
        every layer's destinations with headroom (:func:`~distmb.pipeline.sample.padded.
        with_headroom`), at least the earlier fits', at most the full bounds (the full
        bounds after :data:`MAX_REFITS` refits)."""
        n_seeds, fanouts = shape
        blocks = self._read(seeds, self._launch(seeds, fanouts, keys), raise_bad_seed)
        full = destination_bounds(n_seeds, fanouts, self.n_solid)
        if self._refits.get(shape, 0) > MAX_REFITS:
            self._fitted[shape] = full
            return blocks
        fitted = [min(b, with_headroom(block.n_dst)) for b, block in zip(full, blocks, strict=True)]
        earlier = self._fitted.get(shape, fitted)
        self._fitted[shape] = [max(a, b) for a, b in zip(fitted, earlier, strict=True)]
        return blocks

    def _launch(
        self,
        seeds: torch.Tensor,
        fanouts: Sequence[int],
        keys: Sequence[int] | torch.Tensor,
        bounds: Sequence[int] | None = None,
    ) -> LaunchedBatch:
        return launch_batch(
            self.csr_indptr, self.csr_indices, seeds, fanouts, keys, self.n_solid, self.backend,
            bounds,
        )  # fmt: skip

    @staticmethod
    def _read(
        seeds: torch.Tensor,
        launched: LaunchedBatch,
        raise_bad_seed: Callable[[torch.Tensor], None],
    ) -> list[Block]:
        values = host_values(launched.stats)  # the batch's one read
        return batch_blocks(seeds, launched, values, raise_bad_seed)

    def _capture(
        self, seeds: torch.Tensor, fanouts: Sequence[int], bounds: list[int]
    ) -> _ShapeGraph:
        """The shape's static buffers and graph, launched with ``bounds`` (its inputs
        written by the caller)."""
        static_seeds = torch.empty_like(seeds)
        static_keys = torch.zeros(len(fanouts), dtype=torch.int64, device=seeds.device)
        static_seeds.copy_(seeds)
        # The key-from-device kernels compile here, outside any capture.
        launched = self._launch(static_seeds, fanouts, static_keys, bounds)
        graph = None
        if seeds.device.type == "cuda":
            # Captured on a stream of this sampler's (``torch.cuda.graph``'s default capture
            # stream is shared with the training step's captures, which the training thread
            # may run meanwhile) and without its device-wide synchronisation.
            if self._stream is None:
                self._stream = torch.cuda.Stream(seeds.device)
            current = torch.cuda.current_stream(seeds.device)
            self._stream.wait_stream(current)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(self._stream):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    launched = self._launch(static_seeds, fanouts, static_keys, bounds)
                finally:
                    graph.capture_end()
            current.wait_stream(self._stream)
        self.captures += 1
        return _ShapeGraph(static_seeds, static_keys, list(bounds), launched, graph)

    def _replay(self, entry: _ShapeGraph, fanouts: Sequence[int]) -> None:
        self.replays += 1
        if entry.graph is not None:
            entry.graph.replay()
            return
        # The stand-in: the same launches, their outputs written over the first launch's.
        fresh = self._launch(entry.seeds, fanouts, entry.keys, entry.bounds)
        entry.launched.stats.copy_(fresh.stats)
        for old, new in zip(entry.launched.layers, fresh.layers, strict=True):
            for name in ("indptr", "indices", "src_ids", "keys", "first"):
                getattr(old, name).copy_(getattr(new, name))


def _upload(keys: Sequence[int], static_keys: torch.Tensor) -> None:
    """``keys`` (uint64 Python ints) into ``static_keys`` (int64 on the device, as signed
    words): from page-locked memory,
    without a host wait, on CUDA."""
    host = torch.tensor([to_signed(k) for k in keys], dtype=torch.int64)
    if static_keys.device.type == "cuda":
        static_keys.copy_(host.pin_memory(), non_blocking=True)
    else:
        static_keys.copy_(host)


def _owned(blocks: list[Block]) -> list[Block]:
    """``blocks`` with their arrays copied out of the graph's memory in one ``torch.cat``:
    each block's ``indptr``, ``indices`` and ``src_ids`` become views of the copy."""
    parts = [t for b in blocks for t in (b.indptr, b.indices, b.src_ids)]
    flat = torch.cat(parts)
    pieces = iter(torch.split(flat, [int(t.shape[0]) for t in parts]))
    return [
        Block(b.n_dst, b.n_src, b.n_halo, next(pieces), next(pieces), next(pieces)) for b in blocks
    ]
