"""Graph attention layer over a block (equation 2 of the DistGNN-MB paper).

The paper's variant of DGL's GATConv applies the bias and the non-linearity *before* the
attention coefficients::

    z_u      = ReLU(W · f_u + b)                       (every source; z_v = z[v] for a dst)
    e_u, e_v = <a_l, z_u>, <a_r, z_v>                  (per head)
    alpha_uv = EdgeSoftmax(LeakyReLU(e_u + e_v))       (over the edges of v)
    h_v      = sum_{u in N(v)} alpha_uv · z_u          (per head)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from distmb.nn.aggregate import (
    add_self_loops,
    attention_aggregate,
    attention_softmax,
    check_layer_input,
    weighted_aggregate,
)
from distmb.nn.kernels import cpu_update as fused_update
from distmb.nn.kernels import ops as kernel_ops
from distmb.nn.kernels import triton_aggregate as aggregate_triton
from distmb.nn.kernels.dispatch import get_kernels
from distmb.pipeline.sample import Block

#: Gain of the Xavier-normal initialisation of W, a_l and a_r (DGL GATConv uses ReLU's).
INIT_GAIN = nn.init.calculate_gain("relu")
#: Default negative slope of the LeakyReLU on the attention logits (GAT paper, DGL, PyG).
NEGATIVE_SLOPE = 0.2


class GATConv(nn.Module):
    """Multi-head graph attention, faithful to equation 2 of DistGNN-MB.

    Per head ``h`` (``D = out_dim``)::

        z        = act(x_src @ W^T + b)                 [n_src, H, D]
        el[u]    = <a_l[h], z[u, h]>,  er[v] = <a_r[h], z[v, h]>   (v < n_dst)
        alpha    = edge_softmax(LeakyReLU(el[u] + er[v]))   over the edges (u -> v)
        out[v,h] = sum_u alpha_uv z[u, h]

    ``act`` is ReLU with ``activation=True``; with ``activation=False`` (the model's last
    layer) ``z = W x + b`` is left linear so that logits can be negative.

    Output: ``concat=True`` gives float[n_dst, heads * out_dim] (heads side by side),
    ``concat=False`` the mean over heads, float[n_dst, out_dim].

    Dropout: ``dropout`` is applied to the layer's output (after the head concat/mean), only
    with ``activation=True``, as in equation 1; ``attn_dropout`` (default 0) is applied to
    ``alpha`` in training mode.

    Destinations without edges: equation 2 has no self or residual term, so such a
    destination's output is 0 (also its bias is inside the ReLU). ``self_loops=True`` adds
    one ``(v, v)`` edge per destination (PyG's ``add_self_loops``), so every destination also
    attends to itself; it is off by default to stay faithful to the paper.

    Initialisation as in DGL's GATConv: ``W``, ``a_l``, ``a_r`` Xavier-normal with the ReLU
    gain (:data:`INIT_GAIN`), bias zero.

    Kernels (:func:`distmb.nn.kernels.dispatch.get_kernels`): with ``"fused"`` and float32 CPU
    tensors
    ``z``, ``el`` and ``er`` come from one pass of
    :func:`distmb.nn.kernels.cpu_update.gat_projection`; with ``"torch"`` (or another dtype) from
    ``nn.Linear``, ReLU and two reductions. Same parameters either way. With ``"triton"``
    (CUDA tensors), the softmax and the weighted sum are one Triton kernel
    (:func:`distmb.nn.aggregate.attention_aggregate`) unless attention dropout is active,
    which also adds the self loops without building the looped block; and where
    :func:`~distmb.nn.kernels.triton_aggregate.takes_layer` holds (no autocast), ``W x + b``
    is one ``addmm`` and the scores and the attention one node
    (:func:`~distmb.nn.kernels.triton_gat_layer.attention_layer`: the scores a Triton kernel in
    float32, their part of ``z``'s gradient summed in the attention's backward kernel).

    Args:
        in_dim: input width.
        out_dim: width per head ``D``.
        heads: number of heads ``H``.
        activation: ReLU on ``z`` and dropout on the output.
        dropout: output dropout probability (only with ``activation``).
        negative_slope: LeakyReLU slope on the attention logits.
        concat: concatenate heads (else average them).
        attn_dropout: dropout probability on the attention coefficients.
        self_loops: add a self edge per destination before attention.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        heads: int,
        activation: bool = True,
        dropout: float = 0.0,
        negative_slope: float = NEGATIVE_SLOPE,
        concat: bool = True,
        attn_dropout: float = 0.0,
        self_loops: bool = False,
    ) -> None:
        super().__init__()
        if heads < 1:
            raise ValueError(f"heads must be >= 1, got {heads}")
        self.in_dim = in_dim
        self.out_dim = out_dim
        self.heads = heads
        self.activation = activation
        self.negative_slope = negative_slope
        self.concat = concat
        self.self_loops = self_loops
        self.fc = nn.Linear(in_dim, heads * out_dim, bias=False)
        self.bias = nn.Parameter(torch.empty(heads * out_dim))
        self.attn_l = nn.Parameter(torch.empty(heads, out_dim))
        self.attn_r = nn.Parameter(torch.empty(heads, out_dim))
        self.dropout = nn.Dropout(dropout)
        self.attn_dropout = nn.Dropout(attn_dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_normal_(self.fc.weight, gain=INIT_GAIN)
        # Xavier on [1, H, D] like DGL's attn_l/attn_r parameters.
        nn.init.xavier_normal_(self.attn_l.unsqueeze(0), gain=INIT_GAIN)
        nn.init.xavier_normal_(self.attn_r.unsqueeze(0), gain=INIT_GAIN)
        nn.init.zeros_(self.bias)

    @property
    def output_dim(self) -> int:
        """Width of the output: ``heads * out_dim`` if ``concat`` else ``out_dim``."""
        return self.heads * self.out_dim if self.concat else self.out_dim

    def forward(self, block: Block, x_src: Tensor) -> Tensor:
        """Args:
            block: the layer's block.
            x_src: float[n_src, in_dim]; rows ``[0, n_dst)`` are the destinations.

        Returns:
            float[n_dst, heads * out_dim] if ``concat`` else float[n_dst, out_dim].
        """
        check_layer_input("GATConv", x_src, self.in_dim)
        if x_src.shape[0] != block.n_src:
            raise ValueError(
                f"x_src has {x_src.shape[0]} rows but the block has n_src={block.n_src} sources"
            )
        attention_dropout = self.training and self.attn_dropout.p > 0
        if self.self_loops and attention_dropout:
            block = add_self_loops(block)
        params = list(self.parameters())
        if get_kernels() == "fused" and fused_update.supported(x_src, *params):
            z, el, er = fused_update.gat_projection(
                x_src, self.fc.weight, self.bias, self.attn_l, self.attn_r, self.activation
            )
            z = z.view(block.n_src, self.heads, self.out_dim)
            er = er[: block.n_dst]
        elif aggregate_triton.takes_layer(x_src, params):
            z = torch.addmm(self.bias, x_src, self.fc.weight.t())  # one launch for W x + b
            if self.activation:
                z = torch.relu(z)
            z = z.view(block.n_src, self.heads, self.out_dim)
            if not attention_dropout:  # the scores and the attention as one node
                out = kernel_ops.attention_layer(
                    block, z, self.attn_l, self.attn_r, self.negative_slope, self.self_loops
                )
                return self._finish(block, out)
            el, er = self._scores(block, z)
        else:
            z = self.fc(x_src) + self.bias
            if self.activation:
                z = torch.relu(z)
            z = z.view(block.n_src, self.heads, self.out_dim)
            el, er = self._scores(block, z)
        if attention_dropout:
            alpha = attention_softmax(block, el, er, self.negative_slope)  # [E, H]
            out = weighted_aggregate(block, self.attn_dropout(alpha), z)  # [n_dst, H, D]
        else:
            # No dropout between the softmax and the sum: one kernel may do both, and add
            # the self loops without building the looped block.
            out = attention_aggregate(block, el, er, z, self.negative_slope, self.self_loops)
        return self._finish(block, out)

    def _scores(self, block: Block, z: Tensor) -> tuple[Tensor, Tensor]:
        """``(el [n_src, H], er [n_dst, H])`` of ``z`` [n_src, H, D] with PyTorch's ops."""
        return (z * self.attn_l).sum(-1), (z[: block.n_dst] * self.attn_r).sum(-1)

    def _finish(self, block: Block, out: Tensor) -> Tensor:
        """The heads of ``out`` [n_dst, H, D] concatenated or averaged, then the dropout."""
        out = out.reshape(block.n_dst, -1) if self.concat else out.mean(1)
        if self.activation:
            out = fused_update.output_dropout(out, self.dropout)
        return out

    def extra_repr(self) -> str:
        return (
            f"{self.in_dim}, {self.out_dim}, heads={self.heads}, concat={self.concat}, "
            f"activation={self.activation}, dropout={self.dropout.p}, "
            f"attn_dropout={self.attn_dropout.p}, self_loops={self.self_loops}"
        )
