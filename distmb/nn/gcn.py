"""Graph convolution (Kipf & Welling) over a block, normalised as DGL's
``GraphConv(norm="both")`` on message-flow graphs.

With the block's self loops (one ``(v, v)`` edge per destination, on by default: the
``A + I`` of the GCN paper; :func:`~distmb.nn.aggregate.add_self_loops`)::

    d_out[u] = max(1, edges of the block leaving source u)
    d_in[v]  = max(1, edges of the block entering destination v)
    h_v      = act(d_in[v]^-1/2 · sum_{u -> v} d_out[u]^-1/2 · x_u · W + b)

Degrees are counted **in the block**, as DGL does on an MFG: a sampled block normalises by
its sampled degrees, and a full-neighbour block (layer-wise evaluation) over every
destination by the graph's degrees (+1 for the self loop). Evaluation in batches of
``--eval-batch-size`` destinations counts a source's out-edges into the batch's
destinations only, like DGL's batched ``inference``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from distmb.nn.aggregate import add_self_loops, aggregate, check_layer_input, in_degrees
from distmb.nn.kernels import cpu_update as fused_update
from distmb.nn.kernels import ops as kernel_ops
from distmb.nn.kernels import triton_aggregate as aggregate_triton
from distmb.pipeline.sample import Block


def symmetric_norms(block: Block, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(d_out^-1/2 [n_src, 1], d_in^-1/2 [n_dst, 1])`` of ``block``'s edges, each degree
    clamped to at least 1 (a vertex without edges gets norm 1), in ``dtype``."""
    # Counted with a scatter, not bincount, whose output size a GPU would read back.
    out_deg = torch.zeros(block.n_src, dtype=torch.int64, device=block.indices.device)
    out_deg.index_add_(0, block.indices, torch.ones_like(block.indices))
    src_norm = out_deg.clamp(min=1).to(dtype).pow(-0.5).unsqueeze(1)
    dst_norm = in_degrees(block).clamp(min=1).to(dtype).pow(-0.5).unsqueeze(1)
    return src_norm, dst_norm


class GCNConv(nn.Module):
    """``h_v = act(D_in^-1/2 (A [+ I]) D_out^-1/2 X W + b)`` on a block (module docstring).

    ReLU and dropout follow the layer with ``activation=True`` (every layer but the last);
    with ``--kernels fused`` and float32 CPU tensors the dropout masks are the fused kernels'
    counter-based ones (:func:`distmb.nn.kernels.cpu_update.dropout`), else ``nn.Dropout``'s.
    Like DGL's GraphConv, the layer multiplies by ``W`` before aggregating when
    ``out_dim < in_dim`` (fewer values to aggregate; same result up to rounding).
    With ``--kernels triton`` (where :func:`~distmb.nn.kernels.triton_aggregate.takes_layer`
    holds: no autocast) the normalised aggregation, ``W`` and the bias are one autograd node
    (:class:`~distmb.nn.kernels.triton_layer.LinearAggregate` with the aggregation kind
    ``"symmetric"`` / ``"symmetric_self"``): both degree factors computed in the Triton
    kernel from row pointers (the sources' out-degrees are the row degrees of the block's
    transposed CSR, built in the forward and cached on the block for the backward), the
    self loops as the kernel's own-row term (no block with added edges); the same values as
    the PyTorch-ops layer up to float rounding.
    Initialisation as DGL's GraphConv: ``W`` Xavier-uniform, bias zero.

    Args:
        in_dim: input width.
        out_dim: output width.
        activation: apply ReLU and dropout to the output.
        dropout: dropout probability (only with ``activation``).
        self_loops: add one ``(v, v)`` edge per destination before normalising.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        activation: bool = True,
        dropout: float = 0.0,
        self_loops: bool = True,
    ) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.out_dim = out_dim
        self.activation = activation
        self.self_loops = self_loops
        self.fc = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.empty(out_dim))
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.fc.weight)
        nn.init.zeros_(self.bias)

    def forward(self, block: Block, x_src: Tensor) -> Tensor:
        """Args:
            block: the layer's block.
            x_src: float[n_src, in_dim]; rows ``[0, n_dst)`` are the destinations' own rows.

        Returns:
            float[n_dst, out_dim], the dtype of ``x_src``.
        """
        check_layer_input("GCNConv", x_src, self.in_dim)
        if aggregate_triton.takes_layer(x_src, list(self.parameters())):
            kind = "symmetric_self" if self.self_loops else "symmetric"
            h = kernel_ops.linear_aggregate(x_src, self.fc.weight, None, self.bias, block, kind)
            if self.activation:
                h = fused_update.output_dropout(torch.relu(h), self.dropout)
            return h
        if self.self_loops:
            block = add_self_loops(block)
        src_norm, dst_norm = symmetric_norms(block, x_src.dtype)
        if self.out_dim < self.in_dim:
            h = aggregate(block, self.fc(x_src) * src_norm, "sum") * dst_norm
        else:
            h = self.fc(aggregate(block, x_src * src_norm, "sum") * dst_norm)
        h = h + self.bias
        if self.activation:
            h = fused_update.output_dropout(torch.relu(h), self.dropout)
        return h

    def extra_repr(self) -> str:
        return (
            f"{self.in_dim}, {self.out_dim}, activation={self.activation}, "
            f"dropout={self.dropout.p}, self_loops={self.self_loops}"
        )
