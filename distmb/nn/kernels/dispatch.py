"""Which implementation the layers use: ``"fused"`` C++ kernels, plain ``"torch"`` ops, or
``"triton"`` kernels; ``--kernels auto`` (the default) picks one per device.

All sit behind the same layer modules (``distmb.nn.sage``, ``distmb.nn.gat``,
``distmb.nn.aggregate``), so one run can compare them (``--kernels fused|torch|triton``).
Each is chosen per call, for the tensors at hand: ``"fused"`` takes float32 CPU tensors (other
tensors, e.g. on a GPU, go through PyTorch ops); ``"triton"`` runs
:func:`~distmb.nn.aggregate.aggregate` with the Triton kernel of
:mod:`distmb.nn.kernels.triton_aggregate` and :func:`~distmb.nn.aggregate.attention_aggregate`
(GAT) with those of :mod:`distmb.nn.kernels.triton_gat` on CUDA tensors (float32, bf16, fp16;
CPU tensors only under Triton's interpreter), and everything else through PyTorch ops.
:func:`resolve_kernels` turns ``"auto"`` into one of them once the training device is known.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: The implementations the layers can be set to (:func:`set_kernels`).
KERNELS = ("fused", "torch", "triton")
#: ``--kernels``' value that picks the fastest implementation of the training device
#: (:func:`resolve_kernels`).
AUTO_KERNELS = "auto"
#: ``--kernels``' choices: :data:`AUTO_KERNELS`, then :data:`KERNELS`.
KERNEL_CHOICES = (AUTO_KERNELS, *KERNELS)

_current = "fused"


def resolve_kernels(name: str, device: torch.device) -> str:
    """The implementation ``--kernels name`` selects on ``device``: ``name`` itself, or for
    ``"auto"`` the fastest one there: ``"triton"`` on a CUDA device where the Triton kernels
    can run (Triton installed: :func:`distmb.pipeline.sample.idmap_triton.usable`), else
    ``"fused"`` (the C++ kernels on the CPU, never Triton's interpreter; PyTorch ops on a GPU
    without Triton).

    Raises:
        ValueError: ``name`` is neither ``"auto"`` nor one of :data:`KERNELS`.
    """
    if name not in KERNEL_CHOICES:
        raise ValueError(f"unknown kernels {name!r}; expected one of {', '.join(KERNEL_CHOICES)}")
    if name != AUTO_KERNELS:
        return name
    if device.type != "cuda":
        return "fused"
    from distmb.pipeline.sample.idmap_triton import usable

    return "triton" if usable(device)[0] else "fused"


def set_kernels(name: str) -> None:
    """Select the implementation used by every layer from now on (one of :data:`KERNELS`;
    ``"auto"`` is resolved first: :func:`resolve_kernels`)."""
    global _current
    if name not in KERNELS:
        raise ValueError(f"unknown kernels {name!r}; expected one of {', '.join(KERNELS)}")
    _current = name


def get_kernels() -> str:
    """The implementation currently selected (default ``"fused"``)."""
    return _current
