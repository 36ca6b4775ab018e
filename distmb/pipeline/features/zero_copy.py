"""Zero-copy host rows: a feature table in pinned host memory that the GPU reads directly.

PyTorch-Direct (Min et al.) gathers feature rows on the GPU straight from host memory over
PCIe (a "unified tensor"), instead of gathering on the CPU and copying the result: the GPU's
own address translation reads the pinned pages, so no CPU thread touches the rows and no
staging buffer exists. Two details make those reads fast: the requested ids are **sorted**
(neighbouring rows share PCIe read requests and pages), and every warp's reads start on a
**128-byte boundary** (PyTorch-Direct shifts its threads' indices; unaligned reads cost it
up to 44 %).

What public PyTorch offers, and what this module does with it:

- PyTorch has no unified tensor. The closest public mechanism is a CUDA tensor *aliasing*
  pinned host memory: host memory that is pinned and mapped (``cudaHostRegister`` with
  ``cudaHostRegisterMapped``, exposed as ``torch.cuda.cudart().cudaHostRegister``) has, under
  unified virtual addressing (every 64-bit Linux CUDA system), the same address on the
  device; ``torch.as_tensor`` accepts any object with ``__cuda_array_interface__`` and wraps
  its pointer as a CUDA tensor without copying (``at::from_blob``; PyTorch asks the driver
  which device the pointer belongs to, and accepts registered host memory). Any CUDA kernel
  reading that tensor, here ``index_select``, then reads host memory over PCIe: a
  device-side gather, zero-copy. :class:`HostRows` checks the alias once after creating it
  (rows read through it equal the host rows) and stops with an error otherwise.
- PyTorch's ``index_select`` kernel cannot be told to shift its threads as PyTorch-Direct's
  does; instead the host copy of the table **pads every row to a multiple of 128 bytes**
  (:data:`ROW_ALIGN_BYTES`), so every row, hence every warp's first read, starts aligned.
  The padding costs host memory (100 float32 values: 400 -> 512 bytes per row) and no PCIe
  traffic (the pad columns are never read). ``align_rows=False`` keeps the rows packed.
- Ids are sorted (and deduplicated) by the caller,
  :class:`~distmb.pipeline.features.device.DeviceFeatures`, which also un-permutes the rows;
  :func:`gather_sorted` does the same for a bare table.

On a CPU device the same code runs with the host tensor itself as the "device view": the
gather is a CPU ``index_select`` over the same padded, strided layout, so CI tests the logic.
"""

from __future__ import annotations

import numpy as np
import torch

from distmb.pipeline.features.storage import HOST_DTYPES, as_host_tensor, copy_rows

#: Row starts are aligned to this many bytes in the host copy (a PCIe read request and a
#: GPU L2 line: PyTorch-Direct's alignment unit).
ROW_ALIGN_BYTES = 128
#: ``cudaHostRegisterPortable | cudaHostRegisterMapped``: pinned for every context, mapped
#: into the device's address space.
_HOST_REGISTER_FLAGS = 1 | 2


def resolve_device(device: torch.device | str) -> torch.device:
    """``device`` as a :class:`torch.device`, a bare ``cuda`` made ``cuda:<current index>``
    when CUDA is available (so that device tensors and streams name one GPU); any other
    device, ``cuda:1`` or ``cpu`` among them, as given."""
    resolved = torch.device(device)
    if resolved.type == "cuda" and resolved.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return resolved


def aligned_width(dim: int, itemsize: int, align: int = ROW_ALIGN_BYTES) -> int:
    """Values per padded row: ``dim`` rounded up so that a row is a multiple of ``align``
    bytes (``align`` must be a multiple of ``itemsize``)."""
    if align % itemsize:
        raise ValueError(f"alignment {align} B is not a multiple of the item size {itemsize} B")
    per = align // itemsize
    return -(-max(dim, 1) // per) * per


class _CudaArrayInterface:
    """Describes ``host``'s memory as device memory (``__cuda_array_interface__`` v3); holds
    ``host`` so that the alias keeps it alive."""

    def __init__(self, host: torch.Tensor) -> None:
        self.host = host
        typestr = np.dtype(str(host.dtype).removeprefix("torch.")).str
        self.__cuda_array_interface__ = {
            "shape": tuple(host.shape),
            "typestr": typestr,
            "data": (host.data_ptr(), False),
            "strides": None,
            "version": 3,
        }


def cuda_alias(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CUDA tensor on ``device`` whose storage is ``host``'s pinned, mapped memory
    (contiguous CPU tensor). Kernels reading it read host memory over PCIe. A bfloat16 host
    is described as int16 (the interface has no bfloat16) and the alias viewed back."""
    if not host.is_contiguous() or not host.is_pinned():
        raise ValueError("cuda_alias: the host tensor must be contiguous and pinned")
    described = host.view(torch.int16) if host.dtype == torch.bfloat16 else host
    alias = torch.as_tensor(_CudaArrayInterface(described), device=device).view(host.dtype)
    if alias.data_ptr() != host.data_ptr() or alias.device.type != "cuda":
        raise RuntimeError(
            "cuda_alias: PyTorch copied the host table instead of aliasing it "
            f"(pointer {host.data_ptr():#x} -> {alias.data_ptr():#x} on {alias.device})"
        )
    return alias


class HostRows:
    """A feature table in host memory, gathered by ``device`` (see the module docstring).

    Args:
        table: [num_rows, dim] float16/32/64, a numpy array (memory maps included) or a CPU
            tensor. It is copied once into the (padded) host buffer, unless it can be used
            as it is (CPU device and no padding needed).
        device: where gathered rows land: ``cuda`` (zero-copy reads of the pinned host
            buffer) or ``cpu`` (the same layout and code, for tests).
        align_rows: pad rows to :data:`ROW_ALIGN_BYTES` (see the module docstring).
        dtype: the dtype the host buffer stores the rows in (one of :data:`HOST_DTYPES`);
            None: the table's. Converted chunk by chunk while the buffer is filled
            (:func:`copy_rows`); a value the cast would make infinite is an error.

    Attributes:
        view: [num_rows, dim] tensor on ``device`` over the host buffer (stride ``width``).
        width: values per row of the host buffer (``dim``, or padded).
        row_bytes: bytes of one row's values (``dim * itemsize``: what a gather moves).
    """

    def __init__(
        self,
        table: np.ndarray | torch.Tensor,
        device: torch.device | str,
        *,
        align_rows: bool = True,
        dtype: torch.dtype | None = None,
    ) -> None:
        source = as_host_tensor(table)
        if dtype is not None and dtype not in HOST_DTYPES:
            raise ValueError(f"host rows dtype must be one of {HOST_DTYPES}, got {dtype}")
        self.device = resolve_device(device)
        self.num_rows, self.dim = int(source.shape[0]), int(source.shape[1])
        self.dtype = source.dtype if dtype is None else dtype
        itemsize = self.dtype.itemsize
        self.width = aligned_width(self.dim, itemsize) if align_rows else self.dim
        self.row_bytes = self.dim * itemsize
        self._registered: int | None = None
        if self.device.type == "cuda":
            host = self._pinned_copy(source)
            full = cuda_alias(host, self.device)
            self._check_alias(host, full)
        else:
            if self.width == self.dim and source.is_contiguous() and source.dtype == self.dtype:
                host = source
            else:
                host = torch.zeros((self.num_rows, self.width), dtype=self.dtype)
                copy_rows(host[:, : self.dim], source)
            full = host
        self.host = host
        self.view = full[:, : self.dim]

    @property
    def host_bytes(self) -> int:
        """Bytes of the host buffer (padding included)."""
        return self.num_rows * self.width * self.host.element_size()

    def gather(self, sorted_ids: torch.Tensor) -> torch.Tensor:
        """[n, dim] of the table's dtype on ``device``: rows ``sorted_ids`` (int64 on
        ``device``, ascending, in range: the caller checks), read by the device."""
        return torch.index_select(self.view, 0, sorted_ids)

    def close(self) -> None:
        """Unregister the pinned host buffer (CUDA); the object must not gather after it."""
        if self._registered is not None:
            torch.cuda.check_error(torch.cuda.cudart().cudaHostUnregister(self._registered))
            self._registered = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to do
            pass

    def _pinned_copy(self, source: torch.Tensor) -> torch.Tensor:
        """The padded host buffer: allocated pageable (exact size; PyTorch's pinned allocator
        rounds up to a power of two), filled, then pinned and mapped in place with
        ``cudaHostRegister``."""
        host = torch.zeros((self.num_rows, self.width), dtype=self.dtype)
        copy_rows(host[:, : self.dim], source)
        nbytes = host.numel() * host.element_size()
        if nbytes:
            err = torch.cuda.cudart().cudaHostRegister(
                host.data_ptr(), nbytes, _HOST_REGISTER_FLAGS
            )
            if int(err) != 0:
                raise RuntimeError(
                    f"cudaHostRegister of the {nbytes / 2**20:.1f} MiB host feature table "
                    f"failed ({err}); is the locked-memory limit (ulimit -l) too low?"
                )
            self._registered = host.data_ptr()
        else:
            host = host.pin_memory()
        return host

    def _check_alias(self, host: torch.Tensor, alias: torch.Tensor) -> None:
        """Rows read through the alias must equal the host rows (first and last row)."""
        if not self.num_rows:
            return
        probe = torch.tensor([0, self.num_rows - 1], device=self.device)
        seen = torch.index_select(alias, 0, probe).cpu()
        if not torch.equal(seen, host[[0, self.num_rows - 1]]):
            raise RuntimeError(
                "zero-copy: rows read by the GPU through the host alias differ from the host "
                "rows (no unified virtual addressing for registered memory on this system?)"
            )


def gather_sorted(rows: HostRows, ids: torch.Tensor) -> torch.Tensor:
    """[n, dim] on ``rows.device``: rows ``ids`` (int64, any order, repeats allowed, on that
    device) in ``ids``' order. The device reads each distinct row once, in ascending id
    order, then the rows are put back in the requested order."""
    if not ids.numel():
        return torch.empty((0, rows.dim), dtype=rows.dtype, device=rows.device)
    unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
    return rows.gather(unique)[inverse]
