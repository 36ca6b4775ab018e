"""GraphSAGE layer over a block (equation 1 of the DistGNN-MB paper)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from distmb.nn import fused_update
from distmb.nn.aggregate import AGGREGATORS, aggregate, check_layer_input
from distmb.nn.backend import get_kernels
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

    def forward(self, block: Block, x_src: Tensor) -> Tensor:
        """Args:
            block: the layer's block.
            x_src: float[n_src, in_dim]; rows ``[0, n_dst)`` are the destinations' own rows.

        Returns:
            float[n_dst, out_dim].
        """
        check_layer_input("SAGEConv", x_src, self.in_dim)
        if get_kernels() == "fused" and fused_update.supported(x_src, *self.parameters()):
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

    def _forward_fused(self, block: Block, x_src: Tensor) -> Tensor:
        """The forward pass through the fused UPDATE kernels (same contract as forward)."""
        self_term = [] if self.fc_self is None else [(x_src[: block.n_dst], self.fc_self.weight)]
        kwargs = {"activation": self.activation, "p": self.dropout.p, "training": self.training}
        if self.out_dim < self.in_dim:
            h = aggregate(block, fused_update.linear(x_src, self.fc_neigh.weight), self.aggr)
            return fused_update.sage_update(self_term, self.bias, addend=h, **kwargs)
        h = aggregate(block, x_src, self.aggr)
        return fused_update.sage_update(
            [(h, self.fc_neigh.weight), *self_term], self.bias, **kwargs
        )

    def extra_repr(self) -> str:
        return (
            f"{self.in_dim}, {self.out_dim}, aggr={self.aggr!r}, activation={self.activation}, "
            f"dropout={self.dropout.p}"
        )
