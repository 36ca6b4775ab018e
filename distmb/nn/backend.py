"""Which implementation the layers use: ``"fused"`` C++ kernels or plain ``"torch"`` ops.

Both paths sit behind the same layer modules (``distmb.nn.sage``, ``distmb.nn.gat``,
``distmb.nn.aggregate``), so one run can compare them (``--kernels fused|torch``).
"""

from __future__ import annotations

KERNELS = ("fused", "torch")

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
