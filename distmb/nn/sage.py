"""GraphSAGE layer over a block (equation 1 of the DistGNN-MB paper)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from distmb.nn.aggregate import AGGREGATORS, aggregate, check_layer_input
from distmb.nn.kernels import cpu_aggregate as fused_aggregate
from distmb.nn.kernels import cpu_update as fused_update
from distmb.nn.kernels import ops as kernel_ops
from distmb.nn.kernels import triton_aggregate as aggregate_triton
from distmb.nn.kernels.dispatch import get_kernels
from distmb.pipeline.rows import IndexedRows
from distmb.pipeline.sample import Block

#: Gain of the Xavier-uniform initialisation of the weights (DGL SAGEConv uses ReLU's).
INIT_GAIN = nn.init.calculate_gain("relu")


class SAGEConv(nn.Module):
    """``h_v = Dropout(ReLU(W_n · AGG({x_u : u in N(v)}) + W_s · x_v + b))``.

    With ``activation=False`` (the last layer) the output is the linear combination
    ``W_n · AGG + W_s · x_v + b`` (no ReLU, no dropout).

    The ``"gcn"`` aggregator already mixes in the destination's own row, so, as in DGL's
    SAGEConv, it has no self weight: ``h_v = act(W_n · gcn_agg + b)``.

    Initialisation as in DGL's SAGEConv: weights Xavier-uniform with the ReLU gain
    (:data:`INIT_GAIN`), bias zero.

    Because ``W_n`` is linear, ``W_n · AGG(x) == AGG(W_n · x)``; like DGL, the layer projects
    before aggregating when ``out_dim < in_dim`` (fewer values to aggregate). The result is
    the same up to float rounding.

    Kernels (:func:`distmb.nn.kernels.dispatch.get_kernels`): with ``"fused"`` and float32 CPU
    tensors
    the UPDATE (both products, bias, ReLU, dropout) runs as one pass of
    :func:`distmb.nn.kernels.cpu_update.sage_update`, and the projection before aggregating through
    :func:`distmb.nn.kernels.cpu_update.linear`; with ``"torch"`` (or another dtype) it runs as
    ``nn.Linear`` + ReLU + ``nn.Dropout``. Same parameters either way; the dropout masks of the
    two paths differ (the fused one draws a seed from torch's generator per call). With
    ``"triton"`` (where :func:`~distmb.nn.kernels.triton_aggregate.takes_layer` holds: no
    autocast) the aggregation and the linear part are one autograd node
    (:class:`~distmb.nn.kernels.triton_layer.LinearAggregate`:
    ``addmm`` chains and the Triton kernel's addend, fewer launches), then ReLU + ``nn.Dropout``.

    Args:
        in_dim: input width ``D_in``.
        out_dim: output width ``D_out``.
        aggr: one of :data:`~distmb.nn.aggregate.AGGREGATORS`.
        activation: apply ReLU and dropout (every layer but the last).
        dropout: dropout probability on the output (only with ``activation``).
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        aggr: str = "mean",
        activation: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if aggr not in AGGREGATORS:
            raise ValueError(f"unknown aggregator {aggr!r}; expected one of {AGGREGATORS}")
        self.in_dim = in_dim
        self.out_dim = out_dim
        self.aggr = aggr
        self.activation = activation
        self.fc_neigh = nn.Linear(in_dim, out_dim, bias=False)
        self.fc_self = None if aggr == "gcn" else nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.empty(out_dim))
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.fc_neigh.weight, gain=INIT_GAIN)
        if self.fc_self is not None:
            nn.init.xavier_uniform_(self.fc_self.weight, gain=INIT_GAIN)
        nn.init.zeros_(self.bias)

    def forward(self, block: Block, x_src: Tensor | IndexedRows) -> Tensor:
        """Args:
            block: the layer's block.
            x_src: float[n_src, in_dim]; rows ``[0, n_dst)`` are the destinations' own rows.
                May be :class:`~distmb.pipeline.rows.IndexedRows` (a first layer's features read in
                place): the fused kernels read them through their ids (not with the
                ``"gcn"`` aggregator); otherwise they are gathered first.

        Returns:
            float[n_dst, out_dim].
        """
        check_layer_input("SAGEConv", x_src, self.in_dim)
        fused = get_kernels() == "fused" and fused_update.supported(x_src, *self.parameters())
        if isinstance(x_src, IndexedRows) and not (fused and self.reads_in_place):
            x_src = x_src.materialize()
        if fused:
            return self._forward_fused(block, x_src)
        if aggregate_triton.takes_layer(x_src, list(self.parameters())):
            w_self = None if self.fc_self is None else self.fc_self.weight
            h = kernel_ops.linear_aggregate(
                x_src, self.fc_neigh.weight, w_self, self.bias, block, self.aggr
            )
        else:
            if self.out_dim < self.in_dim:
                h = aggregate(block, self.fc_neigh(x_src), self.aggr)
            else:
                h = self.fc_neigh(aggregate(block, x_src, self.aggr))
            if self.fc_self is not None:
                h = h + self.fc_self(x_src[: block.n_dst])
            h = h + self.bias
        if self.activation:
            h = self.dropout(torch.relu(h))
        return h

    @property
    def reads_in_place(self) -> bool:
        """Whether the fused path reads an :class:`~distmb.pipeline.rows.IndexedRows` input through
        its ids (every aggregator but ``"gcn"``, whose self term needs the gathered rows)."""
        return self.aggr != "gcn"

    def _forward_fused(self, block: Block, x_src: Tensor | IndexedRows) -> Tensor:
        """The forward pass through the fused kernels (same contract as forward)."""
        p, seed = fused_update.effective_dropout(
            self.activation, self.dropout.p, self.training, None
        )
        w_self = None if self.fc_self is None else self.fc_self.weight
        return _FusedSAGE.apply(
            x_src, self.fc_neigh.weight, w_self, self.bias, block, self.aggr, self.activation,
            p, seed,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"{self.in_dim}, {self.out_dim}, aggr={self.aggr!r}, activation={self.activation}, "
            f"dropout={self.dropout.p}"
        )


class _FusedSAGE(torch.autograd.Function):
    """One autograd node for a whole fused SAGEConv: AGG and UPDATE forward and backward.

    Aggregate first (``out_dim >= in_dim``)::

        h = AGG(x_src)                                   float32[n_dst, in_dim]
        out = act(h @ W_n^T + x_src[:n_dst] @ W_s^T + b)

    Project first (``out_dim < in_dim``)::

        h = AGG(x_src @ W_n^T)                           float32[n_dst, out_dim]
        out = act(h + x_src[:n_dst] @ W_s^T + b)

    ``x_src`` is used twice (all rows aggregated, the first ``n_dst`` rows as the self term).
    Autograd would give each use a full-size gradient (the slice's zero-filled
    float32[n_src, in_dim]) and add them; here the self term's gradient is summed into the
    aggregation's backward pass (:func:`~distmb.nn.kernels.cpu_aggregate.aggregate_backward`'s
    addend), or added to the projection's input gradient in place, and no gradient of
    ``x_src`` is computed at all when it needs none (the first layer's features).
    """

    @staticmethod
    def forward(
        ctx,
        x_src: Tensor | IndexedRows,
        w_neigh: Tensor,
        w_self: Tensor | None,
        bias: Tensor,
        block: Block,
        aggr: str,
        activation: bool,
        p: float,
        seed: int,
    ) -> Tensor:
        out, st = _sage_forward(x_src, w_neigh, w_self, bias, block, aggr, activation, p, seed)
        in_place = isinstance(st.x, IndexedRows)
        # In-place rows are not a tensor: kept on ctx.
        ctx.save_for_backward(None if in_place else st.x, st.wn, st.ws, st.bits, st.h)
        ctx.in_place = st.x if in_place else None
        ctx.block, ctx.aggr, ctx.project, ctx.scale = block, aggr, st.project, st.scale
        ctx.bf16 = fused_update.products_bf16()
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x, wn, ws, bits, h = ctx.saved_tensors
        st = _SageForward(
            ctx.in_place if ctx.in_place is not None else x, wn, ws, bits, h, ctx.block,
            ctx.aggr, ctx.project, ctx.scale,
        )  # fmt: skip
        with fused_update.bf16_products(ctx.bf16):
            grads = _sage_backward(st, grad_out, *ctx.needs_input_grad[:4])
        return (*grads, None, None, None, None, None)


@dataclass
class _SageForward:
    """What a fused SAGEConv's forward keeps for its backward.

    Attributes:
        x: the layer input float32[n_src, in_dim] (detached), or rows read in place.
        wn, ws: the weights (detached, contiguous); ws None without a self term.
        bits: uint8[n_dst, ceil(out_dim / 8)] gate bits, None without activation.
        h: float32[n_dst, in_dim], the aggregation (aggregate first), else None.
        project: projected before aggregating (``out_dim < in_dim``).
        scale: the dropout scale ``1 / (1 - p)`` (1 without activation).
    """

    x: Tensor | IndexedRows
    wn: Tensor
    ws: Tensor | None
    bits: Tensor | None
    h: Tensor | None
    block: Block
    aggr: str
    project: bool
    scale: float

    def self_terms(self) -> tuple[list[Tensor | IndexedRows], list[Tensor]]:
        """The UPDATE's self-term sources and weights (empty without ``W_s``)."""
        if self.ws is None:
            return [], []
        return [_first_rows(self.x, self.block.n_dst)], [self.ws]


def _sage_forward(
    x_src: Tensor | IndexedRows,
    w_neigh: Tensor,
    w_self: Tensor | None,
    bias: Tensor,
    block: Block,
    aggr: str,
    activation: bool,
    p: float,
    seed: int,
) -> tuple[Tensor, _SageForward]:
    """A fused SAGEConv's forward pass (no autograd): float32[n_dst, out_dim] and its state."""
    x = x_src if isinstance(x_src, IndexedRows) else x_src.detach().contiguous()
    wn = w_neigh.detach().contiguous()
    ws = None if w_self is None else w_self.detach().contiguous()
    scale = fused_update.dropout_scale(p) if activation else 1.0
    project = wn.shape[0] < wn.shape[1]
    st = _SageForward(x, wn, ws, None, None, block, aggr, project, scale)
    self_x, self_w = st.self_terms()
    if project:
        zero = torch.zeros(wn.shape[0], dtype=torch.float32)
        z, _ = fused_update.update_forward([x], [wn], None, zero, False, 0.0, 0)
        h = fused_aggregate.aggregate_forward(block, z, aggr)
        out, st.bits = fused_update.update_forward(self_x, self_w, h, bias, activation, p, seed)
    else:
        st.h = fused_aggregate.aggregate_forward(block, x, aggr)
        out, st.bits = fused_update.update_forward(
            [st.h, *self_x], [wn, *self_w], None, bias, activation, p, seed
        )
    return out, st


def _sage_backward(
    st: _SageForward, grad_out: Tensor, need_x: bool, need_wn: bool, need_ws: bool, need_b: bool
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """The gradients ``(x_src, W_n, W_s, b)`` of :func:`_sage_forward` (None where not
    needed)."""
    n_dst = st.block.n_dst
    self_x, self_w = st.self_terms()
    grad_x = grad_wn = grad_ws = None
    if st.project:
        grad_h, grad_b, grad_self, grad_self_w = fused_update.update_backward(
            grad_out, st.bits, st.scale, self_x, self_w,
            [need_x] * len(self_x), [need_ws] * len(self_w), need_b, need_x or need_wn,
        )  # fmt: skip
        if need_x or need_wn:
            grad_z = fused_aggregate.aggregate_backward(st.block, st.aggr, grad_h)
            _, _, (grad_x,), (grad_wn,) = fused_update.update_backward(
                grad_z, None, 1.0, [st.x], [st.wn], [need_x], [need_wn], False, False
            )
            if need_x and grad_self:
                grad_x[:n_dst] += grad_self[0]
    else:
        _, grad_b, grads_x, grads_w = fused_update.update_backward(
            grad_out, st.bits, st.scale, [st.h, *self_x], [st.wn, *self_w],
            [need_x] * (1 + len(self_x)), [need_wn, need_ws][: 1 + len(self_w)],
            need_b, False,
        )  # fmt: skip
        grad_wn, grad_self_w = grads_w[0], grads_w[1:]
        if need_x:
            addend = grads_x[1] if len(grads_x) > 1 else None
            grad_x = fused_aggregate.aggregate_backward(st.block, st.aggr, grads_x[0], addend)
    if grad_self_w:
        grad_ws = grad_self_w[0]
    return grad_x, grad_wn, grad_ws, grad_b


#: ``next_input(out) -> float32[n_src, dim]``: the second layer's input from the first layer's
#: output (the model's per-layer hook: a halo scheme appends halo rows below ``out``).
NextInput = Callable[[Tensor], Tensor]


def fusable_pair(first: SAGEConv, second: SAGEConv, x_src: Tensor | IndexedRows) -> bool:
    """Whether :func:`fused_pair_forward` applies to two consecutive layers on this input.

    It does when both run the fused kernels in training with autograd on, the input needs no
    gradient (a first layer's features), both aggregate before their UPDATE
    (``out_dim >= in_dim``), the second layer's aggregator is ``"mean"`` or ``"sum"``, and
    neither layer has forward hooks (the pair does not call the layers' modules, so their
    hooks would not run: with hooks the layers run one by one).
    """
    params = [*first.parameters(), *second.parameters()]
    hooked = any(m._forward_hooks or m._forward_pre_hooks for m in (first, second))
    return (
        not hooked
        and get_kernels() == "fused"
        and first.training
        and torch.is_grad_enabled()
        and fused_update.supported(x_src, *params)
        and not x_src.requires_grad
        and first.out_dim >= first.in_dim
        and second.out_dim >= second.in_dim
        and second.aggr in ("mean", "sum")
        and (not isinstance(x_src, IndexedRows) or first.reads_in_place)
    )


def fused_pair_forward(
    first: SAGEConv,
    second: SAGEConv,
    first_block: Block,
    second_block: Block,
    x_src: Tensor | IndexedRows,
    next_input: NextInput,
) -> Tensor:
    """Two consecutive SAGEConv layers as one autograd node (:func:`fusable_pair` must hold):
    values, dropout draws and gradients are those of the two layers one after the other, but
    the first layer's output gradient float32[first_block.n_dst, out_dim] is never written:
    its UPDATE backward aggregates each row from the second layer's destination gradients as
    it needs it (:func:`~distmb.nn.kernels.cpu_update.update_backward_aggregated`), which saves the
    second aggregation's backward writing it and the first UPDATE reading it back.
    """
    p0, seed0 = fused_update.effective_dropout(
        first.activation, first.dropout.p, first.training, None
    )
    w_self0 = None if first.fc_self is None else first.fc_self.weight
    w_self1 = None if second.fc_self is None else second.fc_self.weight
    return _FusedSAGEPair.apply(
        x_src, first.fc_neigh.weight, w_self0, first.bias,
        second.fc_neigh.weight, w_self1, second.bias,
        (first, second), (first_block, second_block), next_input, p0, seed0,
    )  # fmt: skip


class _FusedSAGEPair(torch.autograd.Function):
    """The node of :func:`fused_pair_forward`. The second layer's dropout seed is drawn
    between the two forwards, as the layers would draw it one after the other."""

    @staticmethod
    def forward(
        ctx,
        x_src: Tensor | IndexedRows,
        w_neigh0: Tensor,
        w_self0: Tensor | None,
        bias0: Tensor,
        w_neigh1: Tensor,
        w_self1: Tensor | None,
        bias1: Tensor,
        layers: tuple[SAGEConv, SAGEConv],
        blocks: tuple[Block, Block],
        next_input: NextInput,
        p0: float,
        seed0: int,
    ) -> Tensor:
        first, second = layers
        out0, st0 = _sage_forward(
            x_src, w_neigh0, w_self0, bias0, blocks[0], first.aggr, first.activation, p0, seed0
        )
        x1 = next_input(out0)
        p1, seed1 = fused_update.effective_dropout(
            second.activation, second.dropout.p, second.training, None
        )
        out1, st1 = _sage_forward(
            x1, w_neigh1, w_self1, bias1, blocks[1], second.aggr, second.activation, p1, seed1
        )
        ctx.states = (st0, st1)
        ctx.bf16 = fused_update.products_bf16()
        return out1

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        st0, st1 = ctx.states
        ctx.states = None
        with fused_update.bf16_products(ctx.bf16):
            return _FusedSAGEPair._backward(st0, st1, ctx.needs_input_grad, grad_out)

    @staticmethod
    def _backward(
        st0: _SageForward, st1: _SageForward, need: tuple[bool, ...], grad_out: Tensor
    ) -> tuple[Tensor | None, ...]:
        # Second layer: its UPDATE's gradients, up to (not through) its aggregation.
        self_x1, self_w1 = st1.self_terms()
        _, grad_b1, grads_x1, grads_w1 = fused_update.update_backward(
            grad_out, st1.bits, st1.scale, [st1.h, *self_x1], [st1.wn, *self_w1],
            [True] * (1 + len(self_x1)), [need[4], need[5]][: 1 + len(self_w1)], need[6], False,
        )  # fmt: skip
        addend = grads_x1[1] if len(grads_x1) > 1 else None
        # First layer: its output gradient made row by row from the second's.
        self_x0, self_w0 = st0.self_terms()
        grad_b0, _, grads_w0 = fused_update.update_backward_aggregated(
            st1.block, st1.aggr, grads_x1[0], addend, st0.bits, st0.scale,
            [st0.h, *self_x0], [st0.wn, *self_w0], [False] * (1 + len(self_x0)),
            [need[1], need[2]][: 1 + len(self_w0)], need[3],
        )  # fmt: skip
        grad_ws0 = grads_w0[1] if len(grads_w0) > 1 else None
        grad_ws1 = grads_w1[1] if len(grads_w1) > 1 else None
        return (
            None, grads_w0[0], grad_ws0, grad_b0, grads_w1[0], grad_ws1, grad_b1,
            None, None, None, None, None,
        )  # fmt: skip


def _first_rows(x: Tensor | IndexedRows, n: int) -> Tensor | IndexedRows:
    """Rows ``[0, n)`` of a layer input (the destinations' own rows), in place for
    :class:`~distmb.pipeline.rows.IndexedRows`."""
    return x.prefix(n) if isinstance(x, IndexedRows) else x[:n]
