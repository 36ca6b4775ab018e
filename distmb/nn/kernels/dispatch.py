"""Which implementation the layers use: ``"fused"`` C++ kernels, plain ``"torch"`` ops, or
``"triton"`` kernels.

All sit behind the same layer modules (``distmb.nn.sage``, ``distmb.nn.gat``,
``distmb.nn.aggregate``), so one run can compare them (``--kernels fused|torch|triton``).
Each is chosen per call, for the tensors at hand: ``"fused"`` takes float32 CPU tensors (other
tensors, e.g. on a GPU, go through PyTorch ops); ``"triton"`` runs
:func:`~distmb.nn.aggregate.aggregate` with the Triton kernel of
:mod:`distmb.nn.kernels.triton_aggregate` and :func:`~distmb.nn.aggregate.attention_aggregate`
(GAT) with those of :mod:`distmb.nn.kernels.triton_gat` on CUDA tensors (float32, bf16, fp16;
CPU tensors only under Triton's interpreter), and everything else through PyTorch ops.
"""

from __future__ import annotations

KERNELS = ("fused", "torch", "triton")

_current = "fused"


def set_kernels(name: str) -> None:
    """Select the implementation used by every layer from now on."""
    global _current
    if name not in KERNELS:
        raise ValueError(f"unknown kernels {name!r}; expected one of {', '.join(KERNELS)}")
    _current = name


def get_kernels() -> str:
    """The implementation currently selected (default ``"fused"``)."""
    return _current
