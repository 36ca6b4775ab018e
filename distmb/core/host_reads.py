"""Device-to-host reads: the one choke point through which the device path reads a device
value on the host.

On a GPU every such read (``.item()``, ``.tolist()``, ``.cpu()``, ``int(t)``, ``bool(t)``, a
size read back to allocate an output) waits for the queued kernels: a host synchronisation.
The device path (the device sampler, the device feature cache, the device HEC, the training
step) makes them through :func:`to_host`, :func:`host_values` and :func:`host_scalar` only, so
that

- every site is greppable (``grep -rn "to_host\\|host_values\\|host_scalar" distmb``), and
- :data:`HOST_READS` counts them exactly, on any device (on CPU tensors a read costs nothing,
  but it is counted all the same: the count is the CI proxy of a GPU run's synchronisations,
  ``tests/test_device_path_budget.py``, ``benchmarks/gpu.py``).

:func:`count_device_wait` counts the other kind of host synchronisation: an explicit wait
for the device's queue (the phase timers' ``torch.cuda.synchronize``).

Reads hidden inside an op whose output size depends on the data (``torch.nonzero``, boolean
mask indexing, ``torch.unique``) are not counted here; ``distmb.engine.op_census`` counts
those ops.

The other way, a copy of pageable host memory to a CUDA device is synchronous too (CUDA
stages it, and PyTorch waits for the stream). The device path uploads each batch's host
values (the seeds, the labels) through :func:`to_device`, which stages them in page-locked
memory and copies without blocking the host.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class HostReadCounter:
    """Running counts of the process's host synchronisations (all threads).

    Attributes:
        reads: device-to-host reads made through this module.
        waits: explicit waits for the device (:func:`count_device_wait`).
    """

    reads: int = 0
    waits: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add_read(self) -> None:
        with self._lock:
            self.reads += 1

    def add_wait(self) -> None:
        with self._lock:
            self.waits += 1

    def snapshot(self) -> tuple[int, int]:
        """``(reads, waits)`` now; differences of two snapshots count a stretch of code."""
        with self._lock:
            return self.reads, self.waits


#: The process's counter.
HOST_READS = HostReadCounter()


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the CPU (itself when it is there): one counted read."""
    HOST_READS.add_read()
    return tensor.cpu()


def host_values(tensor: torch.Tensor) -> list:
    """``tensor.tolist()`` (nested Python numbers): one counted read, however many values.

    Read several scalars at once by stacking them into one tensor first."""
    return to_host(tensor).tolist()


def host_scalar(tensor: torch.Tensor) -> int | float | bool:
    """The one value of ``tensor`` (any shape with one element) as a Python number: one
    counted read (``int(t)``, ``bool(t)`` and ``float(t)`` of the device path go here)."""
    return to_host(tensor).item()


def count_device_wait() -> None:
    """Count one explicit wait for the device's queue (the caller makes it)."""
    HOST_READS.add_wait()


def to_device(
    host: np.ndarray | torch.Tensor, device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``host`` (a host array or CPU tensor, any shape) as a tensor on ``device`` (cast to
    ``dtype`` when given), without a host synchronisation: on CUDA the values are copied
    into page-locked memory, and from there on the current stream with ``non_blocking``
    (PyTorch's pinned-memory allocator keeps the staging buffer until the copy is done).
    On the CPU, ``host`` itself where no cast is needed (no copy)."""
    tensor = host if isinstance(host, torch.Tensor) else torch.from_numpy(np.asarray(host))
    if dtype is not None and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    staged = tensor if tensor.is_pinned() else tensor.contiguous().pin_memory()
    return staged.to(device, non_blocking=True)
