"""Graph isomorphism network layer (Xu et al., 2019) over a block::

    h_v = act(MLP((1 + eps) · x_v + sum_{u -> v} x_u))

``MLP`` is ``Linear -> ReLU -> Linear`` (the GIN paper's two layers; DGL's and PyG's GIN
examples, without batch normalisation, whose batch statistics would make layer-wise
evaluation depend on the evaluation batches). ``eps`` is a learnable parameter
(``train_eps=True``) or a fixed buffer.

The neighbour sum is not normalised: a sampled block sums at most fan-out neighbours, a
full-neighbour block (exact evaluation) all of them, as with DGL's ``GINConv`` and a
neighbour sampler.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from distmb.nn.aggregate import aggregate, check_layer_input
from distmb.nn.kernels import ops as kernel_ops
from distmb.nn.kernels import triton_aggregate as aggregate_triton
from distmb.pipeline.sample import Block


class GINConv(nn.Module):
    """One GIN layer (module docstring); ReLU and dropout after the MLP with ``activation``.

    With ``--kernels triton`` (where :func:`~distmb.nn.kernels.triton_aggregate.takes_layer`
    holds: no autocast) ``(1 + eps) x_v + sum`` is one Triton kernel and one autograd node
    (:class:`~distmb.nn.kernels.triton_layer.GINAggregate`: ``eps`` read in the kernel, its
    gradient one dot product; while ``torch.compile`` traces, its custom operator:
    :func:`~distmb.nn.kernels.ops.gin_aggregate`), followed by the same MLP.

    Args:
        in_dim: input width.
        out_dim: output width (also the MLP's hidden width).
        eps: initial (or fixed) value of ``eps``.
        train_eps: learn ``eps`` (a parameter) instead of keeping it fixed (a buffer).
        activation: apply ReLU and dropout to the output (every layer but the last).
        dropout: dropout probability (only with ``activation``).
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        eps: float = 0.0,
        train_eps: bool = False,
        activation: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.out_dim = out_dim
        self.activation = activation
        self.train_eps = train_eps
        self.initial_eps = eps
        if train_eps:
            self.eps = nn.Parameter(torch.tensor([float(eps)]))
        else:
            self.register_buffer("eps", torch.tensor([float(eps)]))
        self.mlp = nn.Sequential(nn.Linear(in_dim, out_dim), nn.ReLU(), nn.Linear(out_dim, out_dim))
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for layer in (self.mlp[0], self.mlp[2]):
            layer.reset_parameters()  # PyTorch's default, as DGL's and PyG's MLPs
        with torch.no_grad():
            self.eps.fill_(self.initial_eps)

    def forward(self, block: Block, x_src: Tensor) -> Tensor:
        """Args:
            block: the layer's block.
            x_src: float[n_src, in_dim]; rows ``[0, n_dst)`` are the destinations' own rows.

        Returns:
            float[n_dst, out_dim], the dtype of ``x_src``.
        """
        check_layer_input("GINConv", x_src, self.in_dim)
        if aggregate_triton.takes_layer(x_src, [*self.parameters(), self.eps]):
            h = self.mlp(kernel_ops.gin_aggregate(x_src, self.eps, block))
        else:
            neighbours = aggregate(block, x_src, "sum")
            h = self.mlp((1 + self.eps.to(x_src.dtype)) * x_src[: block.n_dst] + neighbours)
        if self.activation:
            h = self.dropout(torch.relu(h))
        return h

    def extra_repr(self) -> str:
        return (
            f"{self.in_dim}, {self.out_dim}, eps={self.initial_eps}, "
            f"train_eps={self.train_eps}, activation={self.activation}, dropout={self.dropout.p}"
        )
