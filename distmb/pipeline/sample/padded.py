"""A mini-batch's blocks padded to shapes fixed by the batch size (for CUDA graphs).

A captured CUDA graph replays fixed shapes, but every mini-batch's blocks have their own
sizes. Each size has a **bound** that depends only on the seed count
(:func:`~distmb.pipeline.sample.device_batch.destination_bounds`): ``D_l`` destinations in
layer ``l`` (``n_seeds`` at the top), at most ``E_l = D_l x f_l`` edges (``f_l`` a row), and
the sources of layer ``l`` are at most ``D_{l-1}`` (the layer below's destination bound; for
the input layer ``min(D_0 (1 + f_0), n_solid)``). Padding every block to its bounds gives all
batches of one size the same shapes: one graph per batch size.

**Layout.** Layer ``l``'s destinations are a prefix of its sources, and its sources are the
layer below's destinations (one rank, no halo leaves). The real sources of layer ``l`` that
are not destinations (``k_l = n_src - n_dst`` of them, at most ``K_l = min(D_l f_l,
D_{l-1} - n_seeds)``: every edge brings at most one, and every layer has at least the
``n_seeds`` seeds as destinations) are moved *past* the padded destination rows, so that a
padded destination row is never a real source; each destination space ends with ``R_l``
**sink rows**, which own the padding edges::

    padded destinations of layer l:  [real dst and padding ... | R_l sinks]     P_l rows
    padded sources of layer l:       [the P_l rows above | k_l new real sources | padding |
                                      the R_{l-1} sinks of the layer below]

with ``P_top = n_seeds + R_top`` and ``P_{l-1} = P_l + K_l + R_{l-1}`` (the layer below's
padded destinations are this layer's padded sources; the input layer has ``P_0 + K_0``
sources). Every real row of every layer keeps its position in the layers below (the sources of
layer ``l`` are a prefix of those of the layers below, in both numberings), so one map,
:attr:`PaddedBatch.positions` (int64: the padded position of every real source of the input
layer, increasing), serves every layer. Its pieces are known on the host: the seeds stay where
they are, and layer ``l``'s new sources, real positions ``[n_dst_l, n_src_l)``, go to
``[P_l, P_l + k_l)``.

**Edges.** Layer ``l`` has ``E_l`` edge slots: the real edges first, in their CSR order (the
real rows keep their order), their sources mapped through the positions; the other slots are
**padding edges**. Sink ``j`` of layer ``l`` owns the slots ``[max(nnz, j c_l), max(nnz,
(j + 1) c_l))`` (the last sink up to ``E_l``), ``c_l = PADDING_ROW_FANOUTS x f_l`` and
``R_l = ceil(E_l / c_l)``, and its padding edges read its own row as a source. So no row has
more than ``c_l`` edges and no source more than ``c_l`` padding edges: one row owning every
padding edge (often most of the ``E_l`` slots, since the bounds count repeated vertices)
would make a row-tiled kernel walk them in one tile, in the forward over destinations and in
the backward over the transposed CSR. The other padded destination rows have no edge.

**Why the real rows are exact.** A real destination row reads only real source rows (its
edges, and its own row: destination ``v`` is source ``v``). A padded destination row reads
only padded source rows: its own row, a sink's padding edges, and the self loops a layer adds
(GCN's, GAT's with ``self_loops``) at ``(v, v)``, padding again. So a padded row never enters
a real row's value, nor a real source's out-degree (GCN's ``d_out`` normalisation counts the
edges leaving each source: this is why the new sources are moved past the padded
destinations); the loss reads the real seeds only, so padded rows get a zero gradient, and the
loss and every parameter gradient equal the unpadded ones up to float reassociation (the
matrix products run over more rows). Padded rows hold finite values (zeros at allocation, a
previous batch's rows later), so ``0 x`` their activations stays ``0``. Dropout draws masks
for the padded rows too, so the real rows' masks are not those of an unpadded run with the
same seed.

**Fitted layouts.** The bounds count every sampled neighbour as new, but sampled
neighbourhoods overlap: on the products-shaped benchmark graph (2.4M vertices, fan-out
5,10,15, 1000 seeds) a batch's input layer has 64 % of ``E_0``'s edges and 38 % of ``K_0``'s
new sources, and the next layer about 80 %, within 1 % from batch to batch. A layout whose
``K_l`` and ``E_l`` are capped (``caps``: :func:`fitted_caps`, a batch's sizes with
:data:`FIT_HEADROOM`) has the same structure with fewer padded rows and edges, so the
padded step does less work; a batch that does not fit it (:meth:`PaddedLayout.fits`) needs
another layout. The padding's proof above does not depend on the sizes.

**Refill.** :meth:`PaddedBatch.fill` copies a batch into the buffers allocated once per batch
size, with no host read (the real sizes are the blocks' host ints). Where Triton runs (CUDA
tensors; CPU tensors under its interpreter) in ``L + 1`` launches
(:mod:`~distmb.pipeline.sample.padded_triton`): one kernel per layer, top first, writes the
layer's new sources' positions, its edges' sources and its row pointers, and one kernel
scatters the input rows and copies the labels. Elsewhere (the CPU without the interpreter)
with torch ops, the same values: ``L`` ``arange`` for the positions; per layer an
``index_select`` for the real edges' sources and a ``copy_`` of the padding edges' (static)
sources, the row pointers of the real and padded rows (a ``copy_`` at the top, whose real
destinations are the prefix; below it a ``searchsorted`` and an ``index_select``: padded row
``q`` starts where the first real row at or after ``q`` starts) and a ``clamp`` for the
sinks' (none with one sink); an ``index_copy_`` of the input rows and a ``copy_`` of the
labels: ``6 L + 1`` launches for ``L`` layers. :meth:`PaddedBatch.launches` counts either.

**Memory** grows with the bounds, like the one-read sampler's
(:mod:`~distmb.pipeline.sample.device_batch`): the input layer has ``n_seeds + sum_l (K_l +
R_l)`` padded rows, about ``D_{-1} (1 + 1 / PADDING_ROW_FANOUTS)`` while no bound reaches
``n_solid``; where the bounds are capped by ``n_solid`` (small graphs, big batches) up to
about ``L`` times ``n_solid``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from distmb.pipeline.sample import padded_triton
from distmb.pipeline.sample.blocks import Block
from distmb.pipeline.sample.device_batch import destination_bounds
from distmb.pipeline.sample.idmap import BACKENDS, resolve_backend

#: A sink row owns at most this many fan-outs' worth of padding edges (``c_l = 16 f_l``):
#: ``R_l = ceil(D_l / 16)`` sinks per layer, 6 % more destination rows than the bound.
PADDING_ROW_FANOUTS = 16
#: A fitted layout's room above the batch it is fitted to (:func:`fitted_caps`), so that the
#: next batches of the size fit it too: 10 % more new sources and edges per layer, and at
#: least :data:`FIT_SPREADS` times the square root of the count (a count's spread between
#: batches if it were Poisson: small batches vary relatively more). On the products-shaped
#: benchmark graph a layer's sizes vary by about 1 % between batches of 1000 seeds.
FIT_HEADROOM = 0.1
FIT_SPREADS = 4.0
#: :class:`PaddedBatch`'s refill back ends, resolved as Fused-Map's
#: (:func:`~distmb.pipeline.sample.idmap.resolve_backend`): ``"auto"`` is ``"triton"`` where
#: Triton runs on the buffers' device, else ``"torch"``.
REFILL_BACKENDS = BACKENDS


@dataclass(frozen=True)
class PaddedLayout:
    """The padded shapes of one batch size (module docstring; index: the layer, input first).

    Attributes:
        n_seeds: the batch size: the top layer's real destinations.
        dst_rows: ``P_l``, padded destination rows of layer ``l`` (its sinks last).
        src_rows: padded source rows of layer ``l`` (``dst_rows[l - 1]`` for ``l >= 1``);
            ``src_rows[0]`` is the input rows.
        new_sources: ``K_l``, the most real sources of layer ``l`` that are not its
            destinations.
        edges: ``E_l = D_l x f_l``, padded edge slots of layer ``l``.
        sinks: ``R_l``, the sink rows of layer ``l`` (the last of its destinations).
        sink_edges: ``c_l``, the most padding edges a sink of layer ``l`` owns.
    """

    n_seeds: int
    dst_rows: tuple[int, ...]
    src_rows: tuple[int, ...]
    new_sources: tuple[int, ...]
    edges: tuple[int, ...]
    sinks: tuple[int, ...]
    sink_edges: tuple[int, ...]

    @property
    def num_layers(self) -> int:
        return len(self.dst_rows)

    @property
    def input_rows(self) -> int:
        """Padded input rows (the input layer's sources)."""
        return self.src_rows[0]

    def first_sink(self, layer: int) -> int:
        """The position of ``layer``'s first sink row."""
        return self.dst_rows[layer] - self.sinks[layer]

    def fits(self, blocks: Sequence[Block]) -> bool:
        """Whether a batch with these blocks (input layer first, its seeds this layout's)
        has at most ``K_l`` new sources and ``E_l`` edges in every layer (host ints)."""
        return len(blocks) == self.num_layers and all(
            self.layer_fits(layer, block) for layer, block in enumerate(blocks)
        )

    def layer_fits(self, layer: int, block: Block) -> bool:
        """Whether ``block`` has at most ``K_layer`` new sources and ``E_layer`` edges."""
        new = block.n_src - block.n_dst
        return new <= self.new_sources[layer] and block.num_edges <= self.edges[layer]


def padded_layout(
    n_seeds: int,
    fanouts: Sequence[int],
    n_solid: int,
    caps: Sequence[tuple[int, int]] | None = None,
) -> PaddedLayout:
    """The padded shapes of batches of ``n_seeds`` seeds with ``fanouts`` (input layer
    first) on a part of ``n_solid`` solid vertices (module docstring): the bounds', which
    every batch of that size fits, or with ``caps`` a smaller layout fitted to observed
    batches (module docstring, "Fitted layouts").

    Args:
        caps: per layer, input first, ``(new sources, edges)``: ``K_l`` and ``E_l`` at most
            these (:func:`fitted_caps`); the bounds still cap them.

    Raises:
        ValueError: a fan-out below 1 (``FANOUT_ALL`` has no bound), ``n_seeds`` outside
            ``[1, n_solid]``, or ``caps`` not one pair of a non-negative new-source count
            and a positive edge count per layer.
    """
    if any(f < 1 for f in fanouts):
        raise ValueError(
            f"padded blocks need positive fan-outs (a layer of all neighbours has no bound), "
            f"got {list(fanouts)}"
        )
    if not 1 <= n_seeds <= n_solid:
        raise ValueError(f"{n_seeds} seeds: expected 1 to n_solid={n_solid}")
    bounds = destination_bounds(n_seeds, fanouts, n_solid)
    n_layers = len(fanouts)
    source_bounds = [
        bounds[layer - 1] if layer else min(bounds[0] * (1 + fanouts[0]), n_solid)
        for layer in range(n_layers)
    ]
    new_sources = [
        min(bounds[layer] * fanouts[layer], source_bounds[layer] - n_seeds)
        for layer in range(n_layers)
    ]
    edges = [b * f for b, f in zip(bounds, fanouts, strict=True)]
    if caps is not None:
        if len(caps) != n_layers or any(k < 0 or e < 1 for k, e in caps):
            raise ValueError(
                f"caps must be one (new sources >= 0, edges >= 1) pair per layer for "
                f"{n_layers} layers, got {list(caps)}"
            )
        new_sources = [min(bound, cap) for bound, (cap, _) in zip(new_sources, caps, strict=True)]
        edges = [min(bound, cap) for bound, (_, cap) in zip(edges, caps, strict=True)]
    sink_edges = [PADDING_ROW_FANOUTS * f for f in fanouts]
    sinks = [-(-e // c) for e, c in zip(edges, sink_edges, strict=True)]
    dst_rows = [0] * n_layers
    rows = n_seeds  # above the top: the seeds, then each layer's sinks and new sources
    for layer in range(n_layers - 1, -1, -1):
        dst_rows[layer] = rows + sinks[layer]
        rows = dst_rows[layer] + new_sources[layer]
    return PaddedLayout(
        n_seeds=n_seeds,
        dst_rows=tuple(dst_rows),
        src_rows=(rows, *dst_rows[:-1]),  # the input layer's: P_0 + K_0
        new_sources=tuple(new_sources),
        edges=tuple(edges),
        sinks=tuple(sinks),
        sink_edges=tuple(sink_edges),
    )


def fitted_caps(blocks: Sequence[Block], fanouts: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """:func:`padded_layout`'s ``caps`` for batches like ``blocks`` (input layer first): per
    layer its new sources and edges with room above them (:func:`with_headroom`), and edges
    for at least one sink row's ``c_l`` (module docstring, "Fitted layouts")."""
    return tuple(
        (
            with_headroom(block.n_src - block.n_dst),
            max(with_headroom(block.num_edges), PADDING_ROW_FANOUTS * fanout),
        )
        for block, fanout in zip(blocks, fanouts, strict=True)
    )


def with_headroom(count: int) -> int:
    """``count`` plus :data:`FIT_HEADROOM` of it, or :data:`FIT_SPREADS` square roots of it
    where that is more, rounded up."""
    return count + math.ceil(max(FIT_HEADROOM * count, FIT_SPREADS * math.sqrt(count)))


class PaddedBatch:
    """The static buffers of one batch size, refilled in place by :meth:`fill` (module
    docstring).

    Args:
        layout: the batch size's shapes (:func:`padded_layout`).
        feat_dim: the input rows' width.
        dtype: the input rows' dtype.
        device: where the buffers live (the training device).
        backend: the refill's (:data:`REFILL_BACKENDS`); both fill the same values.

    Attributes:
        backend: ``"triton"`` or ``"torch"``, the refill's.
        positions: int64[input_rows], the padded position of every real input-layer source
            in its first ``blocks[0].n_src`` entries (the first ``n_seeds`` never change).
        indptr: per layer, int64[P_l + 1]; ``indptr[l][P_l] = E_l`` always.
        indices: per layer, int64[E_l].
        x: the input rows, [input_rows, feat_dim] in ``dtype`` (zeros at allocation; rows no
            real source occupies keep a previous batch's finite values).
        labels: int64[n_seeds], the seeds' labels.
        src_ids: int64[input_rows] of zeros: the padded blocks' ``src_ids`` (prefixes of it).
            They are not the batch's vertex ids: nothing on the padded path reads them (the
            input rows are copied after the gather, and one rank has no halo leaves).

    Raises:
        ValueError: an unknown ``backend``, or ``"triton"`` where Triton cannot run on
            ``device``.
    """

    def __init__(
        self,
        layout: PaddedLayout,
        feat_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        backend: str = "auto",
    ) -> None:
        self.layout = layout
        self.backend = resolve_backend(backend, device, "refill back end")
        rows = layout.input_rows
        index = dict(dtype=torch.int64, device=device)
        self.positions = torch.arange(rows, **index)
        self.indptr: list[torch.Tensor] = []
        self.indices: list[torch.Tensor] = []
        for layer in range(layout.num_layers):
            indptr = torch.zeros(layout.dst_rows[layer] + 1, **index)
            indptr[-1] = layout.edges[layer]
            self.indptr.append(indptr)
            self.indices.append(_sink_sources(layout, layer, device))
        self.x = torch.zeros(rows, feat_dim, dtype=dtype, device=device)
        self.labels = torch.zeros(layout.n_seeds, **index)
        self.src_ids = torch.zeros(rows, **index)
        if self.backend == "torch":  # the torch ops' static operands
            widest = max(layout.dst_rows)
            self._ramp = torch.arange(widest + 1, **index)  # the padded rows, searched for
            self._first_real = torch.empty(widest + 1, **index)  # the searchsorted's output
            #: Per layer, int64[E_l]: the source of every slot as a padding edge.
            self._sink_sources = [t.clone() for t in self.indices]
            #: Per layer, int64[R_l - 1]: the start of sinks 1.. before clamping (``j c_l``).
            self._sink_starts = [
                torch.arange(1, layout.sinks[layer], **index) * layout.sink_edges[layer]
                for layer in range(layout.num_layers)
            ]

    def launches(self) -> int:
        """The launches of one :meth:`fill`, as the op census counts them: with Triton one
        per layer and one for the input rows and labels; with torch ops ``L`` aranges, per
        layer 2 for the edges, 1 (the top) or 2 for the real rows' pointers and 1 for the
        sinks' where there are several, the input rows and the labels."""
        layout = self.layout
        if self.backend == "triton":
            return padded_triton.launches(layout.num_layers)
        per_layer = sum(4 + (layout.sinks[layer] > 1) for layer in range(layout.num_layers))
        return layout.num_layers + per_layer - 1 + 2

    def check(self, blocks: Sequence[Block], x: torch.Tensor, labels: torch.Tensor) -> None:
        """Refuse a batch that does not fit the layout (host ints only).

        Raises:
            ValueError: naming the layer and the size that does not fit.
        """
        layout = self.layout
        if len(blocks) != layout.num_layers:
            raise ValueError(f"{len(blocks)} blocks, the layout has {layout.num_layers} layers")
        if blocks[-1].n_dst != layout.n_seeds or int(labels.shape[0]) != layout.n_seeds:
            raise ValueError(
                f"a batch of {blocks[-1].n_dst} seeds ({labels.shape[0]} labels) padded to "
                f"the layout of {layout.n_seeds}"
            )
        for layer, block in enumerate(blocks):
            if block.n_halo:
                raise ValueError(f"layer {layer}: padded blocks have no halo leaves (one rank)")
            if layer + 1 < len(blocks) and blocks[layer + 1].n_src != block.n_dst:
                raise ValueError(
                    f"layer {layer}: {block.n_dst} destinations but layer {layer + 1} has "
                    f"{blocks[layer + 1].n_src} sources"
                )
            if not layout.layer_fits(layer, block):
                new, edges = block.n_src - block.n_dst, block.num_edges
                raise ValueError(
                    f"layer {layer}: {new} new sources and {edges} edges exceed the layout's "
                    f"{layout.new_sources[layer]} and {layout.edges[layer]} (a batch beyond "
                    "a fitted layout, or fan-outs or n_solid other than the layout's?)"
                )
        if tuple(x.shape) != (blocks[0].n_src, self.x.shape[1]):
            raise ValueError(
                f"input rows of shape {tuple(x.shape)}, expected ({blocks[0].n_src}, "
                f"{self.x.shape[1]})"
            )
        if x.dtype != self.x.dtype or x.device != self.x.device:
            raise ValueError(
                f"input rows in {x.dtype} on {x.device}, the buffers hold {self.x.dtype} on "
                f"{self.x.device}"
            )

    def fill(self, blocks: Sequence[Block], x: torch.Tensor, labels: torch.Tensor) -> None:
        """Copy a batch into the buffers: ``blocks`` (input layer first, one rank), ``x``
        [blocks[0].n_src, feat_dim] its input rows (the buffers' dtype), ``labels``
        int64[n_seeds]. No host read; :meth:`launches` launches (module docstring).

        Raises:
            ValueError: the batch does not fit the layout (:meth:`check`).
        """
        self.check(blocks, x, labels)
        if self.backend == "triton":
            self._fill_triton(blocks, x, labels)
            return
        layout, top = self.layout, len(blocks) - 1
        for layer in range(top, -1, -1):  # layer l's new sources go to [P_l, P_l + k_l)
            block, start = blocks[layer], layout.dst_rows[layer]
            new = block.n_src - block.n_dst
            torch.arange(start, start + new, out=self.positions[block.n_dst : block.n_src])
        for layer, block in enumerate(blocks):
            self._fill_layer(layer, block)
        self.x.index_copy_(0, self.positions[: blocks[0].n_src], x)
        self.labels.copy_(labels)

    def _fill_triton(self, blocks: Sequence[Block], x: torch.Tensor, labels: torch.Tensor) -> None:
        """:meth:`fill` in Triton kernels: the layers top first (each reads the positions
        the layers above wrote), then the input rows and labels."""
        layout = self.layout
        for layer in range(len(blocks) - 1, -1, -1):
            block = blocks[layer]
            padded_triton.fill_layer(
                self.positions, block.indptr, block.indices, self.indptr[layer],
                self.indices[layer], n_dst=block.n_dst, n_src=block.n_src,
                dst_rows=layout.dst_rows[layer], first_sink=layout.first_sink(layer),
                sink_edges=layout.sink_edges[layer],
            )  # fmt: skip
        padded_triton.fill_rows(self.x, x, self.positions, self.labels, labels)

    def _fill_layer(self, layer: int, block: Block) -> None:
        """Layer ``layer``'s edges and row pointers."""
        layout, nnz = self.layout, block.num_edges
        indices = self.indices[layer]
        torch.index_select(self.positions, 0, block.indices, out=indices[:nnz])
        indices[nnz:].copy_(self._sink_sources[layer][nnz:])
        indptr, first_sink = self.indptr[layer], layout.first_sink(layer)
        if layer == layout.num_layers - 1:  # the seeds: real rows [0, n_seeds), in place
            indptr[: first_sink + 1].copy_(block.indptr)
        else:  # row q starts where the first real row at or after q starts (nnz at a sink)
            first_real = self._first_real[: first_sink + 1]
            real_rows = self.positions[: block.n_dst]
            torch.searchsorted(real_rows, self._ramp[: first_sink + 1], out=first_real)
            torch.index_select(block.indptr, 0, first_real, out=indptr[: first_sink + 1])
        if layout.sinks[layer] > 1:  # sink j starts at max(nnz, j c_l)
            starts = indptr[first_sink + 1 : layout.dst_rows[layer]]
            torch.clamp(self._sink_starts[layer], min=nnz, out=starts)

    def blocks(self) -> list[Block]:
        """The padded blocks over the buffers (input layer first). New :class:`Block` objects
        on every call: kernels cache a block's transposed CSR on the object, keyed by its
        tensors' versions, and a graph capture must build its own."""
        layout = self.layout
        return [
            Block(
                n_dst=layout.dst_rows[layer],
                n_src=layout.src_rows[layer],
                n_halo=0,
                indptr=self.indptr[layer],
                indices=self.indices[layer],
                src_ids=self.src_ids[: layout.src_rows[layer]],
            )
            for layer in range(layout.num_layers)
        ]


def _sink_sources(layout: PaddedLayout, layer: int, device: torch.device) -> torch.Tensor:
    """int64[E_l]: every edge slot's source as a padding edge: its sink's row (slot ``e``
    belongs to sink ``e // c_l``)."""
    slots = torch.arange(layout.edges[layer], dtype=torch.int64, device=device)
    return layout.first_sink(layer) + torch.div(
        slots, layout.sink_edges[layer], rounding_mode="floor"
    )
