"""GraphSAGE layer over a block (equation 1 of the DistGNN-MB paper)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from distmb.nn import fused_aggregate, fused_update
from distmb.nn.aggregate import AGGREGATORS, aggregate, check_layer_input
from distmb.nn.backend import get_kernels
from distmb.rows import IndexedRows
from distmb.sampling import Block

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

    Kernels (:func:`distmb.nn.backend.get_kernels`): with ``"fused"`` and float32 CPU tensors
    the UPDATE (both products, bias, ReLU, dropout) runs as one pass of
    :func:`distmb.nn.fused_update.sage_update`, and the projection before aggregating through
    :func:`distmb.nn.fused_update.linear`; with ``"torch"`` (or another dtype) it runs as
    ``nn.Linear`` + ReLU + ``nn.Dropout``. Same parameters either way; the dropout masks of the
    two paths differ (the fused one draws a seed from torch's generator per call).

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
                May be :class:`~distmb.rows.IndexedRows` (a first layer's features read in
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
        """Whether the fused path reads an :class:`~distmb.rows.IndexedRows` input through
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
    aggregation's backward pass (:func:`~distmb.nn.fused_aggregate.aggregate_backward`'s
    addend), or added to the projection's input gradient in place, and no gradient of
    ``x_src`` is computed at all when it needs none (the first layer's features).
    """

    @staticmethod
    def forward(
        ctx,
        x_src: Tensor,
        w_neigh: Tensor,
        w_self: Tensor | None,
        bias: Tensor,
        block: Block,
        aggr: str,
        activation: bool,
        p: float,
        seed: int,
    ) -> Tensor:
        in_place = isinstance(x_src, IndexedRows)
        x = x_src if in_place else x_src.detach().contiguous()
        wn = w_neigh.detach().contiguous()
        ws = None if w_self is None else w_self.detach().contiguous()
        n_dst = block.n_dst
        self_x, self_w = ([], []) if ws is None else ([_first_rows(x, n_dst)], [ws])
        project = wn.shape[0] < wn.shape[1]
        saved_x = None if in_place else x  # in-place rows are not a tensor: kept on ctx
        if project:
            zero = torch.zeros(wn.shape[0], dtype=torch.float32)
            z, _ = fused_update.update_forward([x], [wn], None, zero, False, 0.0, 0)
            h = fused_aggregate.aggregate_forward(block, z, aggr)
            out, bits = fused_update.update_forward(self_x, self_w, h, bias, activation, p, seed)
            ctx.save_for_backward(saved_x, wn, ws, bits)
        else:
            h = fused_aggregate.aggregate_forward(block, x, aggr)
            out, bits = fused_update.update_forward(
                [h, *self_x], [wn, *self_w], None, bias, activation, p, seed
            )
            ctx.save_for_backward(saved_x, wn, ws, bits, h)
        ctx.in_place = x if in_place else None
        ctx.block, ctx.aggr, ctx.project = block, aggr, project
        ctx.scale = fused_update.dropout_scale(p) if activation else 1.0
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x, wn, ws, bits, *rest = ctx.saved_tensors
        if ctx.in_place is not None:
            x = ctx.in_place
        need_x, need_wn, need_ws, need_b = ctx.needs_input_grad[:4]
        block: Block = ctx.block
        n_dst = block.n_dst
        self_x, self_w = ([], []) if ws is None else ([_first_rows(x, n_dst)], [ws])
        grad_x = grad_wn = grad_ws = None
        if ctx.project:
            grad_h, grad_b, grad_self, grad_self_w = fused_update.update_backward(
                grad_out, bits, ctx.scale, self_x, self_w,
                [need_x] * len(self_x), [need_ws] * len(self_w), need_b, need_x or need_wn,
            )  # fmt: skip
            if need_x or need_wn:
                grad_z = fused_aggregate.aggregate_backward(block, ctx.aggr, grad_h)
                _, _, (grad_x,), (grad_wn,) = fused_update.update_backward(
                    grad_z, None, 1.0, [x], [wn], [need_x], [need_wn], False, False
                )
                if need_x and grad_self:
                    grad_x[:n_dst] += grad_self[0]
        else:
            (h,) = rest
            _, grad_b, grads_x, grads_w = fused_update.update_backward(
                grad_out, bits, ctx.scale, [h, *self_x], [wn, *self_w],
                [need_x] * (1 + len(self_x)), [need_wn, need_ws][: 1 + len(self_w)],
                need_b, False,
            )  # fmt: skip
            grad_wn, grad_self_w = grads_w[0], grads_w[1:]
            if need_x:
                addend = grads_x[1] if len(grads_x) > 1 else None
                grad_x = fused_aggregate.aggregate_backward(block, ctx.aggr, grads_x[0], addend)
        if grad_self_w:
            grad_ws = grad_self_w[0]
        return grad_x, grad_wn, grad_ws, grad_b, None, None, None, None, None


def _first_rows(x: Tensor | IndexedRows, n: int) -> Tensor | IndexedRows:
    """Rows ``[0, n)`` of a layer input (the destinations' own rows), in place for
    :class:`~distmb.rows.IndexedRows`."""
    return x.prefix(n) if isinstance(x, IndexedRows) else x[:n]
