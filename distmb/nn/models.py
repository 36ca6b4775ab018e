"""Multi-layer GraphSAGE, GAT, GCN and GIN models over a list of blocks.

Common interface (:class:`BlockModel`):

- ``forward(blocks, x, halo_inputs=None, *, layer_input=None)``: the one layer loop; layer
  ``l`` consumes ``blocks[l]``. Layer ``l``'s
  output has ``blocks[l].n_dst`` rows, the computed (solid) sources of ``blocks[l + 1]``; if
  ``blocks[l + 1]`` has halo leaves, their input rows come from ``halo_inputs(l + 1, block)``
  (the historical embedding cache) and are appended below. ``x`` holds all sources of
  ``blocks[0]`` (halos included).
- ``layers``, ``num_layers``, ``layer_dims()`` (each layer's input width) and
  ``forward_layer(l, block, x_src)`` (one layer, for layer-wise full-neighbour inference).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import Tensor, nn

from distmb.nn.gat import GATConv
from distmb.nn.gcn import GCNConv
from distmb.nn.gin import GINConv
from distmb.nn.sage import SAGEConv, fusable_pair, fused_pair_forward
from distmb.pipeline.rows import IndexedRows
from distmb.pipeline.sample import Block

#: ``halo_inputs(l, block) -> float[block.n_halo, layer_dims()[l]]``: input rows of the halo
#: leaves of ``block`` (the block of layer ``l >= 1``).
HaloInputs = Callable[[int, Block], Tensor]

#: ``layer_input(l, block, h) -> float[block.n_src, layer_dims()[l]]``: the whole input of
#: layer ``l`` given its computed sources' rows ``h`` (a halo scheme's per-layer hook).
LayerInput = Callable[[int, Block, Tensor], Tensor]

#: The built-in models: the names :func:`build_model` accepts, which ``--model`` takes besides a
#: user's ``package.module:Class``. Defined here only (:mod:`distmb.config` imports it; its
#: ``DEFAULT_LR`` has a learning rate for each).
MODELS: tuple[str, ...] = ("sage", "gat", "gcn", "gin")


def stack_widths(
    in_dim: int, hidden: int, num_classes: int, num_layers: int
) -> list[tuple[int, int]]:
    """``(input width, output width)`` of each layer of a stack ``in_dim -> hidden -> ... ->
    num_classes`` of ``num_layers`` layers (input layer first)."""
    _check_num_layers(num_layers)
    dims = [in_dim] + [hidden] * (num_layers - 1)
    return list(zip(dims, dims[1:] + [num_classes], strict=True))


class BlockModel(nn.Module):
    """A stack of block layers: subclasses append one module per layer to :attr:`layers`
    (each called as ``layer(block, x_src)``) and give every layer's input width, here or by
    setting :attr:`_dims`.

    Args:
        layer_dims: the input width of every layer (``[in_dim, hidden, ...]``).
    """

    layers: nn.ModuleList

    def __init__(self, layer_dims: Sequence[int] = ()) -> None:
        super().__init__()
        self.layers = nn.ModuleList()
        self._dims: list[int] = [int(d) for d in layer_dims]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def _stack(
        self,
        widths: Sequence[tuple[int, int]],
        make_layer: Callable[[int, int, bool], nn.Module],
    ) -> None:
        """Append ``make_layer(d_in, d_out, last)`` for every ``(d_in, d_out)`` of ``widths``
        (:func:`stack_widths`); the input widths become :meth:`layer_dims`."""
        self._dims = [d_in for d_in, _ in widths]
        for l, (d_in, d_out) in enumerate(widths):
            self.layers.append(make_layer(d_in, d_out, l == len(widths) - 1))

    def layer_dims(self) -> list[int]:
        """Input width of every layer (``[in_dim, ...]``, one entry per layer)."""
        return list(self._dims)

    @property
    def reads_input_in_place(self) -> bool:
        """Whether the first layer reads :class:`~distmb.pipeline.rows.IndexedRows` through their
        ids (a layer with a true ``reads_in_place``, e.g. :class:`SAGEConv`); for any other
        :meth:`forward` gathers them first."""
        return bool(self.layers) and bool(getattr(self.layers[0], "reads_in_place", False))

    def forward_layer(self, l: int, block: Block, x_src: Tensor) -> Tensor:
        """Apply layer ``l``: ``x_src`` float[block.n_src, layer_dims()[l]] ->
        float[block.n_dst, width of layer l's output]."""
        return self.layers[l](block, x_src)

    def forward(
        self,
        blocks: Sequence[Block],
        x: Tensor | IndexedRows,
        halo_inputs: HaloInputs | None = None,
        *,
        layer_input: LayerInput | None = None,
    ) -> Tensor:
        """The one layer loop (training, tests and the trainer's halo schemes all use it).

        Args:
            blocks: ``num_layers`` consistent blocks (``blocks[l + 1].n_computed ==
                blocks[l].n_dst``).
            x: without ``layer_input``: float[blocks[0].n_src, in_dim], the input rows of all
                sources of ``blocks[0]``; with it: float[blocks[0].n_computed, in_dim], the
                computed sources' rows. Either may be :class:`~distmb.pipeline.rows.IndexedRows`
                (rows read in place).
            halo_inputs: supplies the halo rows of ``blocks[l]``, ``l >= 1``; required when
                any of those blocks has ``n_halo > 0`` (and no ``layer_input`` is given).
            layer_input: ``layer_input(l, block, h)`` turns the computed sources' rows ``h``
                of every layer (``l = 0`` included) into the layer's whole input (a halo
                scheme appends the halo rows, and may push ``h`` to other ranks).

        Returns:
            float[blocks[-1].n_dst, num_classes] (logits).

        Raises:
            ValueError: wrong number of blocks, inconsistent row counts, or halos without
                ``halo_inputs``.
        """
        if len(blocks) != self.num_layers:
            raise ValueError(f"expected {self.num_layers} blocks, got {len(blocks)}")
        if isinstance(x, IndexedRows) and not self.reads_input_in_place:
            x = x.materialize()

        def input_of(l: int, h: Tensor) -> Tensor:
            block = blocks[l]
            if layer_input is not None:
                self._check_computed(l, block, h)
                h = layer_input(l, block, h)
            elif l > 0:
                h = self._layer_input(l, block, h, halo_inputs)
            if h.shape[0] != block.n_src:
                where = "x" if l == 0 else f"the input of layer {l}"
                raise ValueError(
                    f"{where} has {h.shape[0]} rows but blocks[{l}] has n_src={block.n_src} sources"
                )
            return h

        h, l = x, 0
        while l < self.num_layers:
            h = input_of(l, h)
            if l + 1 < self.num_layers and self.fuses_pair(l, h):
                # Layers l and l + 1 as one node; the hook runs between them, in order.
                h = self.forward_pair(l, blocks[l], blocks[l + 1], h, partial(input_of, l + 1))
                l += 2
            else:
                h = self.forward_layer(l, blocks[l], h)
                l += 1
        return h

    def fuses_pair(self, l: int, x_src: Tensor | IndexedRows) -> bool:
        """Whether :meth:`forward` runs layers ``l`` and ``l + 1`` on input ``x_src`` as one
        :meth:`forward_pair` (default: never)."""
        return False

    def forward_pair(
        self,
        l: int,
        block: Block,
        next_block: Block,
        x_src: Tensor | IndexedRows,
        next_input: Callable[[Tensor], Tensor],
    ) -> Tensor:
        """Layers ``l`` and ``l + 1`` at once (where :meth:`fuses_pair`): layer ``l + 1``
        takes ``next_input(layer l's output)``. The same values and gradients as
        :meth:`forward_layer` twice."""
        raise NotImplementedError(f"{type(self).__name__} fuses no layer pairs")

    @staticmethod
    def _check_computed(l: int, block: Block, h: Tensor) -> None:
        if h.shape[0] != block.n_computed:
            source = "x" if l == 0 else f"layer {l - 1}"
            raise ValueError(
                f"{source} produced {h.shape[0]} rows but blocks[{l}] has "
                f"{block.n_computed} computed sources (n_src={block.n_src}, "
                f"n_halo={block.n_halo})"
            )

    def _layer_input(
        self, l: int, block: Block, h: Tensor, halo_inputs: HaloInputs | None
    ) -> Tensor:
        """Input of layer ``l >= 1``: the previous output, then the halo rows if any."""
        self._check_computed(l, block, h)
        if block.n_halo == 0:
            return h
        if halo_inputs is None:
            raise ValueError(
                f"blocks[{l}] has {block.n_halo} halo sources but no halo_inputs was given"
            )
        halo = halo_inputs(l, block)
        expected = (block.n_halo, self._dims[l])
        if tuple(halo.shape) != expected:
            raise ValueError(
                f"halo_inputs({l}, block) returned shape {tuple(halo.shape)}, expected {expected}"
            )
        return torch.cat([h, halo.to(h.dtype)], 0)


class GraphSAGE(BlockModel):
    """GraphSAGE (equation 1): ``num_layers`` :class:`SAGEConv` layers,
    ``in_dim -> hidden -> ... -> num_classes``; ReLU and dropout after every layer but the
    last.

    Args:
        in_dim: input feature width.
        hidden: hidden width.
        num_classes: output width.
        num_layers: number of layers (>= 1).
        dropout: dropout probability after each hidden layer.
        aggr: aggregator of every layer (:data:`~distmb.nn.aggregate.AGGREGATORS`).
    """

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        num_classes: int,
        num_layers: int = 3,
        dropout: float = 0.5,
        aggr: str = "mean",
    ) -> None:
        super().__init__()
        self._stack(
            stack_widths(in_dim, hidden, num_classes, num_layers),
            lambda d_in, d_out, last: SAGEConv(
                d_in, d_out, aggr=aggr, activation=not last, dropout=dropout
            ),
        )

    def fuses_pair(self, l: int, x_src: Tensor | IndexedRows) -> bool:
        """Layers 0 and 1 when :func:`~distmb.nn.sage.fusable_pair` holds (training on the
        first layer's features with the fused kernels): the first layer's output gradient is
        then never written (:func:`~distmb.nn.sage.fused_pair_forward`)."""
        return l == 0 and fusable_pair(self.layers[0], self.layers[1], x_src)

    def forward_pair(
        self,
        l: int,
        block: Block,
        next_block: Block,
        x_src: Tensor | IndexedRows,
        next_input: Callable[[Tensor], Tensor],
    ) -> Tensor:
        return fused_pair_forward(
            self.layers[l], self.layers[l + 1], block, next_block, x_src, next_input
        )


class GAT(BlockModel):
    """GAT (equation 2): ``num_layers`` :class:`GATConv` layers.

    Widths follow DGL's GAT example: hidden layers have ``heads`` heads of width ``hidden``,
    concatenated, so the next layer's input is ``hidden * heads``; the last layer has
    ``heads`` heads of width ``num_classes``, averaged, with no ReLU and no dropout. Hidden
    layers apply ReLU inside (on ``z``) and dropout on their output.

    Args:
        in_dim: input feature width.
        hidden: width per head of the hidden layers.
        num_classes: output width.
        num_layers: number of layers (>= 1).
        heads: attention heads of every layer.
        dropout: dropout probability on each hidden layer's output.
        attn_dropout: dropout probability on the attention coefficients.
        self_loops: every destination also attends to itself (see :class:`GATConv`).
    """

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        num_classes: int,
        num_layers: int = 3,
        heads: int = 4,
        dropout: float = 0.5,
        attn_dropout: float = 0.0,
        self_loops: bool = False,
    ) -> None:
        super().__init__()
        _check_num_layers(num_layers)
        self._dims = [in_dim] + [hidden * heads] * (num_layers - 1)
        for l, d_in in enumerate(self._dims):
            last = l == num_layers - 1
            self.layers.append(
                GATConv(
                    d_in,
                    num_classes if last else hidden,
                    heads,
                    activation=not last,
                    dropout=dropout,
                    concat=not last,
                    attn_dropout=attn_dropout,
                    self_loops=self_loops,
                )
            )


class GCN(BlockModel):
    """GCN: ``num_layers`` :class:`GCNConv` layers (symmetric normalisation on each block,
    self loops added), ``in_dim -> hidden -> ... -> num_classes``; ReLU and dropout after
    every layer but the last.

    Args:
        in_dim: input feature width.
        hidden: hidden width.
        num_classes: output width.
        num_layers: number of layers (>= 1).
        dropout: dropout probability after each hidden layer.
        self_loops: add a ``(v, v)`` edge per destination in every layer.
    """

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        num_classes: int,
        num_layers: int = 3,
        dropout: float = 0.5,
        self_loops: bool = True,
    ) -> None:
        super().__init__()
        self._stack(
            stack_widths(in_dim, hidden, num_classes, num_layers),
            lambda d_in, d_out, last: GCNConv(
                d_in, d_out, activation=not last, dropout=dropout, self_loops=self_loops
            ),
        )


class GIN(BlockModel):
    """GIN: ``num_layers`` :class:`GINConv` layers (each an MLP of two linear layers over
    ``(1 + eps) x_v + sum of neighbours``), ``in_dim -> hidden -> ... -> num_classes``; ReLU
    and dropout after every layer but the last.

    Args:
        in_dim: input feature width.
        hidden: hidden width.
        num_classes: output width.
        num_layers: number of layers (>= 1).
        dropout: dropout probability after each hidden layer.
        eps: initial (or fixed) ``eps`` of every layer.
        train_eps: learn ``eps`` per layer.
    """

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        num_classes: int,
        num_layers: int = 3,
        dropout: float = 0.5,
        eps: float = 0.0,
        train_eps: bool = False,
    ) -> None:
        super().__init__()
        self._stack(
            stack_widths(in_dim, hidden, num_classes, num_layers),
            lambda d_in, d_out, last: GINConv(
                d_in, d_out, eps=eps, train_eps=train_eps, activation=not last, dropout=dropout
            ),
        )


def _check_num_layers(num_layers: int) -> None:
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")


def parameter_count(
    name: str,
    in_dim: int,
    hidden: int,
    num_classes: int,
    num_layers: int = 3,
    heads: int = 4,
    aggr: str = "mean",
    gin_train_eps: bool = False,
) -> int:
    """The number of parameters :func:`build_model` would create, computed without building
    it (to refuse a model that cannot fit before allocating it)."""
    widths = stack_widths(in_dim, hidden, num_classes, num_layers)
    if name == "gcn":  # W and bias
        return sum(d * o + o for d, o in widths)
    if name == "gin":  # two linear layers with biases (+ eps when learned)
        eps = 1 if gin_train_eps else 0
        return sum(d * o + o + o * o + o + eps for d, o in widths)
    if name == "gat":
        dims = [in_dim] + [hidden * heads] * (num_layers - 1)
        outs = [hidden] * (num_layers - 1) + [num_classes]
        # fc (d_in x heads*d_out), bias, attn_l and attn_r (heads*d_out each)
        return sum(d * heads * o + 3 * heads * o for d, o in zip(dims, outs, strict=True))
    weights_per_layer = 1 if aggr == "gcn" else 2  # fc_neigh (+ fc_self)
    return sum(weights_per_layer * d * o + o for d, o in widths)


#: The classes of :data:`MODELS` (``--cuda-graphs`` and ``--compile`` take a model of these
#: only, whoever built it).
BUILT_IN_MODELS = (GraphSAGE, GAT, GCN, GIN)


def build_model(
    name: str,
    in_dim: int,
    hidden: int,
    num_classes: int,
    num_layers: int = 3,
    heads: int = 4,
    dropout: float = 0.5,
    aggr: str = "mean",
    gat_self_loops: bool = True,
    gin_eps: float = 0.0,
    gin_train_eps: bool = False,
) -> BlockModel:
    """A model by name: ``"sage"`` (:class:`GraphSAGE` with aggregator ``aggr``), ``"gat"``
    (:class:`GAT` with ``heads``), ``"gcn"`` (:class:`GCN`) or ``"gin"`` (:class:`GIN` with
    ``gin_eps`` and ``gin_train_eps``); arguments another model takes are unused.

    GAT attends over each destination's sampled neighbours and itself by default
    (``gat_self_loops``): the paper's Table 2 runs GAT with the "gcn" aggregator, which
    includes the vertex itself, as DGL's GAT examples do by adding self-loops.

    Raises:
        ValueError: for an unknown ``name``.
    """
    if name == "sage":
        return GraphSAGE(
            in_dim, hidden, num_classes, num_layers=num_layers, dropout=dropout, aggr=aggr
        )
    if name == "gat":
        return GAT(
            in_dim,
            hidden,
            num_classes,
            num_layers=num_layers,
            heads=heads,
            dropout=dropout,
            self_loops=gat_self_loops,
        )
    if name == "gcn":
        return GCN(in_dim, hidden, num_classes, num_layers=num_layers, dropout=dropout)
    if name == "gin":
        return GIN(
            in_dim,
            hidden,
            num_classes,
            num_layers=num_layers,
            dropout=dropout,
            eps=gin_eps,
            train_eps=gin_train_eps,
        )
    raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")
