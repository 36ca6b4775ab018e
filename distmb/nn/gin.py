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
from torch.autograd.function import FunctionCtx, once_differentiable

from distmb.nn.aggregate import aggregate, check_layer_input
from distmb.nn.kernels import ops as kernel_ops
from distmb.nn.kernels import triton_aggregate as aggregate_triton
from distmb.pipeline.sample import Block


class GINConv(nn.Module):
    """One GIN layer (module docstring); ReLU and dropout after the MLP with ``activation``.

    With ``--kernels triton`` (where :func:`~distmb.nn.kernels.triton_aggregate.takes_layer`
    holds: no autocast) ``(1 + eps) x_v + sum`` is one Triton kernel and one autograd node
    (:class:`_TritonGINAggregate`: ``eps`` read in the kernel, its gradient one dot
    product), followed by the same MLP.

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
            if torch.compiler.is_compiling():  # --compile: traceable operators
                h = self.mlp(kernel_ops.gin_aggregate(x_src, self.eps, block))
            else:
                h = self.mlp(_TritonGINAggregate.apply(x_src, self.eps, block))
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


class _TritonGINAggregate(torch.autograd.Function):
    """GIN's ``(1 + eps) · x_src[:n_dst] + sum_{u -> v} x_u`` on the Triton path as one
    autograd node and one kernel each way
    (:func:`~distmb.nn.kernels.triton_aggregate.aggregate_forward` with ``self_eps``: the own
    row weighted ``1 + eps`` in the kernel, in float32, added after the neighbour sum as the
    PyTorch ops add it). Backward: ``x``'s gradient is the transposed sum with the own row
    weighted ``1 + eps`` again (autograd would add a zero-padded slice gradient), ``eps``'s
    the dot product ``<grad_out, x_src[:n_dst]>`` (summed in another order than autograd's
    product and sum: the same up to float rounding), nothing for an input that needs none.

    Args of forward: x_src [n_src, F], eps [1] (a parameter or a buffer) in ``x_src``'s
    dtype, the block; output [n_dst, F] in ``x_src``'s dtype.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, x_src: Tensor, eps: Tensor, block: Block) -> Tensor:
        ctx.save_for_backward(x_src, eps)
        ctx.block = block
        return aggregate_triton.aggregate_forward(block, x_src, "sum", self_eps=eps)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x, eps = ctx.saved_tensors
        block = ctx.block
        need_x, need_eps = ctx.needs_input_grad[:2]
        grad_x = grad_eps = None
        if need_x:
            grad_x = aggregate_triton.aggregate_backward(block, "sum", grad_out, self_eps=eps)
        if need_eps:
            x_dst = x[: block.n_dst]
            grad_eps = torch.dot(grad_out.reshape(-1), x_dst.reshape(-1)).reshape(1)
        return grad_x, grad_eps, None
