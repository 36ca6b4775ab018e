"""The FeatureSource protocol: rows of an input-feature table by vertex id; and
:class:`HostRowReader`, where the device feature cache reads the rows it misses."""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from distmb.pipeline.rows import IndexedRows

#: ``take_buffer(numel) -> float32[>= numel]``: a flat host buffer the caller owns (the
#: BatchLoader's pool of recycled gather buffers).
TakeBuffer = Callable[[int], torch.Tensor]


class FeatureSource(ABC):
    """Rows of a float32 feature table, addressed by vertex id.

    Every place that reads input features (the BatchLoader's gather stage, layer-wise
    evaluation, the halo schemes, the exact baseline's remote fetch) goes through one of
    these, so a new storage (out-of-core file, cache, device memory) is one new subclass.
    Everything a reader needs to know about a source is declared here, with the default of a
    host table; subclasses override what differs.

    Attributes:
        num_rows: ids are in ``[0, num_rows)``; what an id means (``VID_p`` of a part,
            ``VID_o`` of the whole graph) is the subclass's contract.
        dim: row width ``F``.
        rows_served: rows returned since the last :meth:`reset_counters`.
        bytes_read: bytes read from the backing storage since then (a cache hit or a row
            received from another rank reads nothing here).
        uses_collectives: a gather talks to other ranks (every rank must call it, in the same
            order, from the training thread), so it cannot run on a prefetch thread.
        wants_trace: the source plans ahead: the BatchLoader hands :meth:`inspect` the ids of
            a whole superbatch's gathers before making them (an out-of-core Belady cache).
        device: where :meth:`gather_batch_rows` delivers rows: the host (``cpu``) for a host
            table; a device source gathers straight onto its device.
    """

    uses_collectives: bool = False
    wants_trace: bool = False
    device: torch.device = torch.device("cpu")

    def __init__(self, num_rows: int, dim: int) -> None:
        self.num_rows = int(num_rows)
        self.dim = int(dim)
        self.rows_served = 0
        self.bytes_read = 0

    def gather(self, ids: np.ndarray | torch.Tensor) -> torch.Tensor:
        """float32[n, dim]: the rows of ``ids`` (int64[n]) in that order, in a new tensor."""
        ids_np = self._check_ids(ids)
        out = torch.empty((ids_np.size, self.dim), dtype=torch.float32)
        self._read_into(ids_np, out)
        self.rows_served += ids_np.size
        return out

    def gather_into(self, ids: np.ndarray | torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write the rows of ``ids`` into ``out`` (float32[n, dim], contiguous, CPU) and
        return it: for callers that reuse a preallocated buffer."""
        ids_np = self._check_ids(ids)
        if (
            out.dtype != torch.float32
            or tuple(out.shape) != (ids_np.size, self.dim)
            or not out.is_contiguous()
        ):
            raise ValueError(
                f"{type(self).__name__}.gather_into: out must be a contiguous float32"
                f"[{ids_np.size}, {self.dim}] tensor, got {out.dtype}{list(out.shape)}"
            )
        self._read_into(ids_np, out)
        self.rows_served += ids_np.size
        return out

    @property
    def has_halo(self) -> bool:
        """Whether the ids of a block's halo leaves can be gathered too (a part's source that
        holds its halo vertices' rows, :class:`~distmb.pipeline.features.PartFeatures`); then
        the BatchLoader gathers block 0's halo rows with its other rows. False by default."""
        return False

    def gather_batch_rows(
        self, ids: torch.Tensor, take_buffer: TakeBuffer
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The BatchLoader's gather: the rows of ``ids`` (int64[n]) on :attr:`device`.

        Returns:
            ``(rows, buffer)``: ``rows`` float32[n, dim], in the order of ``ids``, and the flat
            buffer they are a view of when they were written into ``take_buffer(n * dim)``
            (the host default), or None when the source allocated them itself (a device
            source gathers into device memory of its own).
        """
        n = int(ids.numel())
        buffer = take_buffer(n * self.dim)
        rows = buffer[: n * self.dim].view(n, self.dim)
        self.gather_into(ids, rows)
        return rows, buffer

    def rows_in_place(self, ids: np.ndarray | torch.Tensor) -> IndexedRows | None:
        """The rows of ``ids`` as :class:`~distmb.pipeline.rows.IndexedRows` over a table this
        source holds in memory (no copy), or None when it cannot serve them that way (then
        use :meth:`gather_into`). Counted as served rows like a gather."""
        ids_np = self._check_ids(ids)
        table = self._table_in_place(ids_np)
        if table is None:
            return None
        self.rows_served += ids_np.size
        return IndexedRows(table, torch.from_numpy(ids_np))

    def _table_in_place(self, ids: np.ndarray) -> torch.Tensor | None:
        """A contiguous CPU tensor (float32, or a two-byte table: ``rows.TABLE_DTYPES``)
        whose rows ``ids`` (checked int64) are this source's rows of those ids, or None (the
        default: rows must be gathered)."""
        return None

    def counters(self) -> dict[str, int]:
        return {"rows_served": self.rows_served, "bytes_read": self.bytes_read}

    def check(self) -> None:
        """Raise an error of the gathers so far that the source defers instead of
        synchronising with the device per gather (the default: none is deferred). The
        trainer calls it once per epoch, after the epoch's last batch and before its loss is
        judged, so that a bad id is named as such, not as the non-finite loss it caused."""
        return None

    def inspect(self, traces: list[np.ndarray]) -> None:
        """The next ``len(traces)`` gathers will request ``traces[i]`` (int64, unique ids),
        in this order. Only a source with :attr:`wants_trace` uses it."""
        return None

    def reset_counters(self) -> None:
        self.rows_served = 0
        self.bytes_read = 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_rows={self.num_rows}, dim={self.dim})"

    @abstractmethod
    def _read_into(self, ids: np.ndarray, out: torch.Tensor) -> None:
        """Fill ``out`` (float32[ids.size, dim]) with the rows of ``ids`` (checked int64)."""

    def _check_ids(self, ids: np.ndarray | torch.Tensor) -> np.ndarray:
        if isinstance(ids, torch.Tensor):
            ids = ids.detach().cpu().numpy()
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise ValueError(
                f"{type(self).__name__}: ids must be a 1-D integer array, got "
                f"{arr.dtype}{list(arr.shape)}"
            )
        arr = np.ascontiguousarray(arr, dtype=np.int64)
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= self.num_rows):
            raise IndexError(
                f"{type(self).__name__}: ids must be in [0, {self.num_rows}), got "
                f"[{int(arr.min())}, {int(arr.max())}]"
            )
        return arr


def as_row_table(table: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """The table as a float32 CPU tensor sharing its memory when it can be one (a float32 numpy
    array, memory maps included), so that :func:`take_rows` gathers with PyTorch's
    thread-parallel ``index_select``; otherwise the table itself. Call it once, at
    construction: PyTorch warns (once) about read-only arrays, which are never written here."""
    if isinstance(table, torch.Tensor):
        return table
    if table.dtype == np.float32 and table.ndim == 2 and table.flags.c_contiguous:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "non-writable array": read only
            return torch.from_numpy(table)
    return table


def take_rows(table: np.ndarray | torch.Tensor, ids: np.ndarray, out: torch.Tensor) -> None:
    """``out[:] = table[ids]`` for a CPU tensor (thread-parallel ``index_select``) or a
    numpy array of another dtype or layout (``np.take``, then cast)."""
    if isinstance(table, torch.Tensor):
        if table.dtype == torch.float32:
            torch.index_select(table, 0, torch.from_numpy(ids), out=out)
        else:
            out.copy_(torch.index_select(table, 0, torch.from_numpy(ids)))
    else:
        out.copy_(torch.from_numpy(np.take(table, ids, axis=0).astype(np.float32)))


class HostRowReader(Protocol):
    """Where :class:`~distmb.pipeline.features.device.DeviceFeatures` reads the rows its
    cache misses, when it is not a host table
    (:class:`~distmb.pipeline.features.zero_copy.HostRows` over one): the rows of an
    out-of-core host cache (:class:`~distmb.pipeline.features.tiered.HostCacheRows`).

    Attributes:
        device: where :meth:`gather` delivers rows.
        num_rows, dim: the table's shape, also as ``shape`` (``(num_rows, dim)``).
        dtype: the rows' dtype; ``row_bytes``: one row's bytes in it.
    """

    device: torch.device
    num_rows: int
    dim: int
    dtype: torch.dtype
    row_bytes: int

    @property
    def shape(self) -> tuple[int, int]: ...

    def gather(self, sorted_ids: torch.Tensor) -> torch.Tensor:
        """[n, dim] of :attr:`dtype` on :attr:`device`: rows ``sorted_ids`` (int64[n] on
        :attr:`device`, ascending, distinct, in range)."""
        ...
