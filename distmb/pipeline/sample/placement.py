"""Where the device sampler reads the graph's CSR from (``placement``).

- ``"device"``: the CSR is copied into the device's memory.
- ``"host"``: the CSR stays in host memory and the device reads it in place (zero-copy):
  on CUDA the arrays are page-locked (``pin_memory``) and wrapped as CUDA tensors over the
  same bytes through ``__cuda_array_interface__``. This relies on unified virtual
  addressing (every 64-bit CUDA platform): memory from ``cudaHostAlloc`` has the same
  address on the host and the device, so a kernel dereferencing it reads host memory over
  PCIe/NVLink-C2C, as PyTorch-Direct and DGL's UVA sampling do. For a graph that does not
  fit the device.

On the CPU both placements are the host arrays themselves (the same code path, nothing
copied), which is how CI exercises it.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

Placement = Literal["device", "host"]
PLACEMENTS: tuple[str, ...] = ("device", "host")


class _HostBuffer:
    """Exposes a pinned host tensor through ``__cuda_array_interface__`` (version 3) and
    keeps it alive for as long as the CUDA view made from it."""

    def __init__(self, pinned: torch.Tensor) -> None:
        self.pinned = pinned
        self.__cuda_array_interface__ = {
            "shape": tuple(pinned.shape),
            "typestr": np.dtype(str(pinned.dtype).removeprefix("torch.")).str,
            "data": (pinned.data_ptr(), False),
            "strides": None,
            "version": 3,
        }


def mapped_view(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor on ``device`` that reads ``host``'s memory in place (see module doc).

    Args:
        host: a contiguous CPU tensor (copied once into pinned memory unless it already is
            pinned).
        device: ``cpu`` (``host`` itself is returned) or a CUDA device.

    Raises:
        ValueError: another device type.
    """
    host = host.contiguous()
    if device.type == "cpu":
        return host
    if device.type != "cuda":
        raise ValueError(f"placement 'host' supports cpu and cuda devices (got {device})")
    pinned = host if host.is_pinned() else host.pin_memory()
    with torch.cuda.device(device):
        view = torch.as_tensor(_HostBuffer(pinned), device=device)
    return view


def place(host: np.ndarray | torch.Tensor, device: torch.device, placement: str) -> torch.Tensor:
    """``host`` (a 1-D array) as a tensor read by ``device`` under ``placement``.

    Raises:
        ValueError: an unknown placement.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"graph placement {placement!r}: expected one of {PLACEMENTS}")
    tensor = host if isinstance(host, torch.Tensor) else torch.from_numpy(np.asarray(host))
    if placement == "host":
        return mapped_view(tensor, device)
    return tensor.to(device)
