"""Linear layers' output widths padded for cuBLAS's fast matrix-product kernels.

cuBLAS runs a product with its tiled (tensor-core or FFMA) kernels when the operands' leading
dimensions and pointers are multiples of 16 bytes; otherwise it falls back to kernels that
assume one-element alignment (``cutlass_80_simt_sgemm_*_align1``), and for a weight gradient
(a short, wide output reduced over every row of the batch) those run a handful of tiles for
the whole reduction. A layer with 47 outputs (ogbn-products' classes, and the GPU
benchmark's) has such leading dimensions in all six of its products an iteration (forward,
self term, input and weight gradients). On an H200, GraphSAGE's eager profile on the
benchmark graph spent 89 ms an epoch (0.46 ms an iteration, six launches) in three
``align1`` kernels, of 0.60 s of kernel time (``results/gpu.json``'s profile).

So on CUDA a layer whose output width is not a multiple of :data:`GEMM_ALIGN_ELEMENTS`
computes with its weights and bias padded by zero rows to the next multiple
(:func:`gemm_width`, :func:`pad_rows`) and returns the first ``out_dim`` columns of its
output (a view). The parameters keep their shapes; every output column is the same dot
product as unpadded and the padding columns are never read, so the values and gradients are
the unpadded layer's. Off CUDA nothing is padded (:data:`PADDED_DEVICE_TYPES`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

#: Element multiple that makes a row of float32 (4 bytes), bf16 or fp16 (2 bytes) a multiple
#: of cuBLAS's 16-byte alignment.
GEMM_ALIGN_ELEMENTS = 8
#: Device types whose layers pad their output width (cuBLAS's; tests add ``"cpu"`` to check
#: that padding changes no value).
PADDED_DEVICE_TYPES: frozenset[str] = frozenset({"cuda"})


def gemm_width(width: int, device: torch.device) -> int:
    """The width a layer of ``width`` outputs computes with on ``device``: rounded up to a
    multiple of :data:`GEMM_ALIGN_ELEMENTS` on :data:`PADDED_DEVICE_TYPES`, else ``width``."""
    if device.type not in PADDED_DEVICE_TYPES:
        return width
    return -(-width // GEMM_ALIGN_ELEMENTS) * GEMM_ALIGN_ELEMENTS


def pad_rows(t: Tensor | None, rows: int) -> Tensor | None:
    """``t`` (a weight ``[out, in]`` or a bias ``[out]``) with zero rows appended up to
    ``rows`` along its first dimension (differentiable: the gradient of the padding is
    dropped); ``t`` itself when it has ``rows`` already, or None."""
    if t is None or t.shape[0] == rows:
        return t
    return F.pad(t, (0, 0) * (t.dim() - 1) + (0, rows - t.shape[0]))
