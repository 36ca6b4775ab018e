"""Fused UPDATE kernels (``csrc/kernels/update/``) as autograd functions.

The dense part of a layer runs as one C++ pass over its output (DistGNN-MB section 3.3,
"Operator Fusion"): register tiles of a blocked GEMM get bias, ReLU, dropout and the packed
gate bits before they are stored, and the backward pass turns each row block of the output
gradient into input gradients, per-thread weight-gradient accumulators and the bias (and
attention-vector) gradients in one sweep.

- :func:`sage_update`: ``Dropout(ReLU(sum_s x_s @ W_s^T + addend + b))`` (GraphSAGE, with
  ``activation=False`` the linear sum of the last layer).
- :func:`linear`: ``x @ W^T`` through the same kernels (the projection SAGEConv applies before
  aggregating when ``out_dim < in_dim``).
- :func:`gat_projection`: ``z = act(x @ W^T + b)`` and the per-head attention scores
  ``el = <a_l, z>``, ``er = <a_r, z>``.
- :func:`dropout`: standalone dropout with the same counter-based masks; :func:`output_dropout`:
  a layer's output dropout through it when the fused kernels apply (GAT's and GCN's).
- :func:`dropout_mask`: the dropout mask a seed produces (for tests).

Dropout masks come from a counter-based hash of ``(seed, row, column)``: reproducible for a
seed and independent of the thread count. The seed of each training-mode call is drawn from
torch's default CPU generator (:func:`draw_seed`), so ``torch.manual_seed`` and a checkpointed
``torch.get_rng_state()`` reproduce training exactly as with the ``"torch"`` path (the two
paths draw different masks). Backward needs only the packed gate bits
(``uint8[N, ceil(K / 8)]``: ReLU-active and kept), not the pre-activation or output tensors.

The kernels take float32 CPU tensors only: :func:`supported` tells the layers when to fall
back to the PyTorch implementation. Inside :func:`bf16_products` (``--precision bf16`` on the
CPU) their matrix products take operands rounded to bfloat16 and sum in float32 (AVX512-BF16
where the build has it: :func:`bf16_native`); tensors, element-wise steps and reductions stay
float32. An autograd node runs its backward with the products of its forward.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from distmb import _C
from distmb.nn.kernels.cpu_aggregate import block_transpose
from distmb.nn.kernels.dispatch import get_kernels
from distmb.pipeline.rows import IndexedRows
from distmb.pipeline.sample import Block

#: Seeds are drawn uniformly from [0, SEED_BOUND) (a non-negative int64).
SEED_BOUND = 2**63 - 1
#: The only dtype the kernels take.
F32 = torch.float32
#: Bits per byte of the packed gate masks.
BITS_PER_BYTE = 8


class _Products(threading.local):
    """Per thread, as autocast's state is: whether the products take bfloat16 operands."""

    bf16 = False


_products = _Products()


def bf16_native() -> bool:
    """Whether this build's bfloat16 products run on AVX512-BF16 instructions (else portable
    C++, no faster than float32: ``setup.py`` targets the build host, ``DISTMB_MARCH``)."""
    return bool(_C.update_bf16_native())


def products_bf16() -> bool:
    """Whether the kernels' matrix products take bfloat16 operands now (on this thread)."""
    return _products.bf16


@contextlib.contextmanager
def bf16_products(enabled: bool = True) -> Iterator[None]:
    """Inside (on this thread): the kernels' matrix products round their operands to bfloat16
    and sum in float32 (``enabled`` False: float32 products); the previous setting is restored
    on exit."""
    previous, _products.bf16 = _products.bf16, enabled
    try:
        yield
    finally:
        _products.bf16 = previous


def supported(*tensors: Tensor | None) -> bool:
    """Whether the fused kernels can run on these tensors (all float32 on the CPU)."""
    return all(t is None or (t.dtype == F32 and t.device.type == "cpu") for t in tensors)


def draw_seed() -> int:
    """A dropout seed drawn from torch's default CPU generator (advances its state)."""
    return int(torch.randint(0, SEED_BOUND, (1,), dtype=torch.int64).item())


def dropout_mask(seed: int, n: int, k: int, p: float) -> Tensor:
    """bool[n, k]: the units :func:`sage_update` keeps for ``seed`` and dropout ``p``.

    Unit ``(row, col)`` is kept where 32 bits of ``mix64(hash_key(seed, row) ^ (col // 2))``
    (the low half for even ``col``, the high half for odd) are below
    ``round((1 - p) * 2**32)``.
    """
    keep = _C.dropout_keep_mask(seed, n, k, p)
    return torch.from_numpy(keep.reshape(n, k)).bool()


def _np(t: Tensor) -> np.ndarray:
    return t.detach().numpy()


def _source(x: Tensor | IndexedRows) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """An UPDATE source as the kernels take it: an array, or ``(table, ids)`` for rows read
    in place (a two-byte table's rows gathered as float32 instead:
    :meth:`~distmb.pipeline.rows.IndexedRows.kernel_source`)."""
    return x.kernel_source() if isinstance(x, IndexedRows) else _np(x)


def _opt_np(t: Tensor | None) -> np.ndarray | None:
    return None if t is None else _np(t)


def _contig(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach().contiguous()


def _bits_per_row(k: int) -> int:
    return (k + BITS_PER_BYTE - 1) // BITS_PER_BYTE


def _check_p(p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")


def update_forward(
    xs: Sequence[Tensor | IndexedRows],
    ws: Sequence[Tensor],
    addend: Tensor | None,
    bias: Tensor,
    activation: bool,
    p: float,
    seed: int,
) -> tuple[Tensor, Tensor | None]:
    """One fused forward pass, no autograd: ``act(sum_s xs[s] @ ws[s]^T + addend + bias)``.

    Args:
        xs: float32[N, C_s] each (contiguous: see :func:`_contig`), or
            :class:`~distmb.pipeline.rows.IndexedRows` read in place; ws: float32[K, C_s].
        addend: float32[N, K] or None. bias: float32[K].
        activation: ReLU + dropout ``p`` with ``seed`` (``p`` = 0: no dropout).

    Returns:
        ``(out float32[N, K], bits uint8[N, ceil(K / 8)] or None without activation)``:
        the gate bits :func:`update_backward` needs.
    """
    n, k = _rows(xs, addend), bias.shape[0]
    out = torch.empty(n, k, dtype=F32)
    bits = torch.empty(n, _bits_per_row(k), dtype=torch.uint8) if activation else None
    _C.update_forward(
        [_source(x) for x in xs],
        [_np(w) for w in ws],
        _opt_np(_contig(addend)),
        _np(bias.detach().contiguous()),
        activation,
        p if activation else 0.0,
        seed,
        _np(out),
        _opt_np(bits),
        bf16=_products.bf16,
    )
    return out, bits


def update_backward(
    grad_out: Tensor,
    bits: Tensor | None,
    scale: float,
    xs: Sequence[Tensor | IndexedRows],
    ws: Sequence[Tensor],
    need_xs: Sequence[bool],
    need_ws: Sequence[bool],
    need_bias: bool,
    need_addend: bool,
) -> tuple[Tensor | None, Tensor | None, list[Tensor | None], list[Tensor | None]]:
    """The gradients of :func:`update_forward` for grad_out float32[N, K], no autograd.

    ``bits`` and ``scale`` (the dropout scale ``1 / (1 - p)``; 1 without activation) come
    from the forward call. Returns ``(grad_addend, grad_bias, grad_xs, grad_ws)``, None where
    not needed. Rows read in place (:class:`~distmb.pipeline.rows.IndexedRows`) get no gradient.
    """
    grad_out = grad_out.contiguous()
    n, k = grad_out.shape
    grad_addend = torch.empty(n, k, dtype=F32) if need_addend else None
    grad_bias = torch.empty(k, dtype=F32) if need_bias else None
    grad_xs, grad_ws = _grad_buffers(xs, ws, need_xs, need_ws)
    _C.update_backward(
        _np(grad_out),
        _opt_np(bits),
        scale,
        [_source(x) for x in xs],
        [_np(w) for w in ws],
        [_opt_np(g) for g in grad_xs],
        [_opt_np(g) for g in grad_ws],
        _opt_np(grad_bias),
        _opt_np(grad_addend),
        bf16=_products.bf16,
    )
    return grad_addend, grad_bias, grad_xs, grad_ws


def _grad_buffers(
    xs: Sequence[Tensor | IndexedRows],
    ws: Sequence[Tensor],
    need_xs: Sequence[bool],
    need_ws: Sequence[bool],
) -> tuple[list[Tensor | None], list[Tensor | None]]:
    """Empty float32 gradient buffers shaped like the sources and weights that need one
    (None for the others). Rows read in place get none: asking for one is an error."""
    grad_xs: list[Tensor | None] = []
    for x, need in zip(xs, need_xs, strict=True):
        if need and isinstance(x, IndexedRows):
            raise ValueError("update_backward: rows read in place (IndexedRows) get no gradient")
        grad_xs.append(torch.empty(x.shape[0], x.shape[1], dtype=F32) if need else None)
    grad_ws = [torch.empty_like(w) if need else None for w, need in zip(ws, need_ws, strict=True)]
    return grad_xs, grad_ws


def update_backward_aggregated(
    next_block: Block,
    kind: str,
    grad_dst: Tensor,
    addend: Tensor | None,
    bits: Tensor | None,
    scale: float,
    xs: Sequence[Tensor | IndexedRows],
    ws: Sequence[Tensor],
    need_xs: Sequence[bool],
    need_ws: Sequence[bool],
    need_bias: bool,
) -> tuple[Tensor | None, list[Tensor | None], list[Tensor | None]]:
    """:func:`update_backward` of a layer whose output feeds ``next_block``'s aggregation
    (``kind``: ``"mean"`` or ``"sum"``), with its output gradient never materialised.

    The output gradient would be ``aggregate_backward(next_block, kind, grad_dst, addend)``
    rows ``[0, N)`` (N = the rows of ``xs``: the next block's computed sources): the kernel
    makes each row from ``grad_dst`` float32[next_block.n_dst, K] over the block's transposed
    CSR (:func:`~distmb.nn.kernels.cpu_aggregate.block_transpose`) as it needs it. Bit-identical to
    the two calls. Returns ``(grad_bias, grad_xs, grad_ws)``, None where not needed.
    """
    grad_dst = grad_dst.contiguous()
    n, k = _rows(xs, None), grad_dst.shape[1]
    t = block_transpose(next_block)
    grad_bias = torch.empty(k, dtype=F32) if need_bias else None
    grad_xs, grad_ws = _grad_buffers(xs, ws, need_xs, need_ws)
    _C.update_backward_aggregated(
        _np(next_block.indptr.contiguous()),
        t.indptr.numpy(),
        t.dst.numpy(),
        kind,
        _np(grad_dst),
        _opt_np(_contig(addend)),
        _opt_np(bits),
        scale,
        n,
        [_source(x) for x in xs],
        [_np(w) for w in ws],
        [_opt_np(g) for g in grad_xs],
        [_opt_np(g) for g in grad_ws],
        _opt_np(grad_bias),
        bf16=_products.bf16,
    )
    return grad_bias, grad_xs, grad_ws


class _SageUpdate(torch.autograd.Function):
    """Autograd node of :func:`sage_update`; sources are passed flat as ``x0, w0, x1, w1``."""

    @staticmethod
    def forward(
        ctx,
        addend: Tensor | None,
        bias: Tensor,
        activation: bool,
        p: float,
        seed: int,
        *xw: Tensor,
    ) -> Tensor:
        xs = [_contig(t) for t in xw[0::2]]
        ws = [_contig(t) for t in xw[1::2]]
        out, bits = update_forward(xs, ws, addend, bias, activation, p, seed)
        ctx.save_for_backward(bits, *xs, *ws)
        ctx.bf16 = _products.bf16
        ctx.nsrc = len(xs)
        ctx.scale = dropout_scale(p) if activation else 1.0
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        bits, *rest = ctx.saved_tensors
        xs, ws = rest[: ctx.nsrc], rest[ctx.nsrc :]
        needs = ctx.needs_input_grad
        with bf16_products(ctx.bf16):
            grad_addend, grad_bias, grad_xs, grad_ws = update_backward(
                grad_out,
                bits,
                ctx.scale,
                xs,
                ws,
                [needs[5 + 2 * s] for s in range(len(xs))],
                [needs[6 + 2 * s] for s in range(len(ws))],
                needs[1],
                needs[0],
            )
        flat: list[Tensor | None] = []
        for gx, gw in zip(grad_xs, grad_ws, strict=True):
            flat += [gx, gw]
        return (grad_addend, grad_bias, None, None, None, *flat)


class _Dropout(torch.autograd.Function):
    """Autograd node of :func:`dropout`: saves only the packed keep bits."""

    @staticmethod
    def forward(ctx, x: Tensor, p: float, seed: int) -> Tensor:
        x = x.detach().contiguous()
        n, k = x.shape
        out = torch.empty_like(x)
        bits = torch.empty(n, _bits_per_row(k), dtype=torch.uint8)
        _C.dropout_forward(_np(x), p, seed, _np(out), _np(bits))
        ctx.save_for_backward(bits)
        ctx.scale = dropout_scale(p)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, None, None]:
        (bits,) = ctx.saved_tensors
        grad = grad_out.contiguous()
        grad_in = torch.empty_like(grad)
        _C.dropout_backward(_np(grad), _np(bits), ctx.scale, _np(grad_in))
        return grad_in, None, None


def dropout(x: Tensor, p: float, training: bool = True, seed: int | None = None) -> Tensor:
    """Dropout of ``x`` (float32[N, K], CPU) with the masks of :func:`dropout_mask`:
    ``x * keep / (1 - p)``, thread-parallel and counter-based (``torch.nn.Dropout`` draws its
    mask with one sequential generator: ~10 ns per unit on this project's CPUs). The seed is
    drawn with :func:`draw_seed` when None, so ``torch.manual_seed`` reproduces it.

    Returns ``x`` itself when not ``training`` or ``p`` = 0."""
    _check_p(p)
    if not training or p == 0.0:
        return x
    if x.dim() != 2:
        raise ValueError(f"dropout takes float32[N, K], got shape {list(x.shape)}")
    return _Dropout.apply(x, p, draw_seed() if seed is None else seed)


def output_dropout(x: Tensor, module: torch.nn.Dropout) -> Tensor:
    """A layer's output dropout ``module(x)``: with ``--kernels fused`` and a tensor the
    fused kernels take, through :func:`dropout` (counter-based masks, the module's ``p`` and
    train/eval mode); otherwise ``module`` itself."""
    if get_kernels() == "fused" and supported(x):
        return dropout(x, module.p, module.training)
    return module(x)


def _rows(xs: Sequence[Tensor | IndexedRows], addend: Tensor | None) -> int:
    return addend.shape[0] if addend is not None else xs[0].shape[0]


def dropout_scale(p: float) -> float:
    """The factor kept units are multiplied by: ``1 / (1 - p)`` (0 for ``p`` = 1)."""
    return 1.0 / (1.0 - p) if p < 1.0 else 0.0


def sage_update(
    sources: Sequence[tuple[Tensor, Tensor]],
    bias: Tensor,
    addend: Tensor | None = None,
    activation: bool = True,
    p: float = 0.0,
    training: bool = True,
    seed: int | None = None,
) -> Tensor:
    """``Dropout(ReLU(sum_s x_s @ W_s^T + addend + bias))`` in one fused pass.

    Args:
        sources: up to two pairs ``(x_s, W_s)``: x_s float32[N, C_s], W_s float32[K, C_s]
            (``nn.Linear`` weight layout).
        bias: float32[K].
        addend: optional float32[N, K] added before the activation (e.g. an already projected
            and aggregated neighbour term). At least one source or the addend is required.
        activation: apply ReLU and dropout; ``False`` gives the linear sum (``p`` ignored).
        p: dropout probability in [0, 1] (applied only with ``activation`` and ``training``).
        training: dropout is active.
        seed: dropout seed; drawn with :func:`draw_seed` when ``None`` and dropout is active.

    Returns:
        float32[N, K]. Differentiable w.r.t. every x_s, W_s, ``bias`` and ``addend``.
    """
    _check_p(p)
    if not sources and addend is None:
        raise ValueError("sage_update needs at least one source or an addend")
    if len(sources) > 2:
        raise ValueError(f"sage_update takes at most 2 sources, got {len(sources)}")
    p_eff, seed_eff = effective_dropout(activation, p, training, seed)
    flat = [t for pair in sources for t in pair]
    return _SageUpdate.apply(addend, bias, activation, p_eff, seed_eff, *flat)


def effective_dropout(
    activation: bool, p: float, training: bool, seed: int | None
) -> tuple[float, int]:
    """``(p, seed)`` for the kernels: ``(0, 0)`` where no dropout applies (no activation,
    evaluation, ``p`` = 0), else ``p`` and ``seed`` (drawn with :func:`draw_seed` if None)."""
    _check_p(p)
    if not (activation and training and p > 0.0):
        return 0.0, 0
    return p, draw_seed() if seed is None else seed


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """``x @ weight^T`` (no bias) through the fused kernels: x float32[N, C], weight
    float32[K, C] -> float32[N, K]."""
    bias = torch.zeros(weight.shape[0], dtype=F32)
    return sage_update([(x, weight)], bias, activation=False)


class _GatProjection(torch.autograd.Function):
    """Autograd node of :func:`gat_projection`."""

    @staticmethod
    def forward(
        ctx,
        x: Tensor,
        weight: Tensor,
        bias: Tensor,
        attn_l: Tensor,
        attn_r: Tensor,
        activation: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        x, weight, bias, attn_l, attn_r = (_contig(t) for t in (x, weight, bias, attn_l, attn_r))
        n, (heads, d) = x.shape[0], attn_l.shape
        z = torch.empty(n, heads * d, dtype=F32)
        el = torch.empty(n, heads, dtype=F32)
        er = torch.empty(n, heads, dtype=F32)
        _C.gat_projection_forward(
            _np(x),
            _np(weight),
            _np(bias),
            _np(attn_l),
            _np(attn_r),
            activation,
            _np(z),
            _np(el),
            _np(er),
            bf16=_products.bf16,
        )
        ctx.save_for_backward(x, weight, z, attn_l, attn_r)
        ctx.activation = activation
        ctx.bf16 = _products.bf16
        return z, el, er

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx, grad_z: Tensor, grad_el: Tensor, grad_er: Tensor
    ) -> tuple[Tensor | None, ...]:
        x, weight, z, attn_l, attn_r = ctx.saved_tensors
        grad_x = torch.empty_like(x) if ctx.needs_input_grad[0] else None
        grad_w, grad_b = torch.empty_like(weight), torch.empty(weight.shape[0], dtype=F32)
        grad_al, grad_ar = torch.empty_like(attn_l), torch.empty_like(attn_r)
        _C.gat_projection_backward(
            _np(x),
            _np(weight),
            _np(z),
            _np(attn_l),
            _np(attn_r),
            ctx.activation,
            _np(grad_z.contiguous()),
            _np(grad_el.contiguous()),
            _np(grad_er.contiguous()),
            _opt_np(grad_x),
            _np(grad_w),
            _np(grad_b),
            _np(grad_al),
            _np(grad_ar),
            bf16=ctx.bf16,
        )
        return grad_x, grad_w, grad_b, grad_al, grad_ar, None


def gat_projection(
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    attn_l: Tensor,
    attn_r: Tensor,
    activation: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """The fused GAT projection and attention scores.

    Args:
        x: float32[N, C].
        weight: float32[H * D, C] (``nn.Linear`` layout).
        bias: float32[H * D].
        attn_l, attn_r: float32[H, D].
        activation: ReLU on ``z`` (else ``z`` is linear).

    Returns:
        ``(z, el, er)``: z float32[N, H * D] = act(x @ W^T + b), el and er float32[N, H] with
        ``el[n, h] = <attn_l[h], z[n, h]>``, ``er[n, h] = <attn_r[h], z[n, h]>``.
        Differentiable w.r.t. every input tensor.
    """
    return _GatProjection.apply(x, weight, bias, attn_l, attn_r, activation)
