"""A device feature cache over zero-copy host rows (GNNLab's PreSC cache, PyTorch-Direct's
direct host reads, FastGL's Match).

:class:`DeviceFeatures` holds the hot rows of a feature table in device memory (sized in MiB,
``--device-cache-mb``) and gathers every other row on the device straight from pinned host
memory (:class:`~distmb.pipeline.features.zero_copy.HostRows`). Which rows are hot is decided once,
before
training, by the same ranking as the host cache
(:func:`distmb.pipeline.features.presample.static_hot_ids`):

- ``presc``: the rows pre-sampling (its own random stream, ``--presample-epochs``) requested
  most, ties by in-degree (GNNLab's PreSC#1);
- ``degree``: the highest in-degree rows;
- ``none``: no cache, every row from host memory.

A gather of ``ids`` (int64, any order, repeats allowed):

1. looks every id up in a device directory (``int32[num_rows]``: the slot, or -1) and copies
   the hits from the cache;
2. deduplicates and sorts the misses (``torch.unique``), so that the device reads each missed
   row once, in ascending order;
3. with ``reuse_previous`` (FastGL's *Match*), takes the missed rows that the previous gather
   already brought from host memory from that gather's rows (device memory) instead of
   reading them again;
4. reads the rest from host memory (zero-copy on CUDA) and puts every row back in the
   requested order.

Every gather returns exactly the table's rows (cast to float32). Counters, per
:meth:`reset_counters`: ``lookups`` (ids requested, with repeats), ``hits`` (of those, ids in
the cache), ``misses``, ``rows_loaded`` (distinct rows read from host memory),
``rows_reused`` (distinct missed rows taken from the previous gather) and ``bytes_h2d``
(``rows_loaded`` times the row's bytes in the table's dtype: what crossed PCIe).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch

from distmb.core.host_reads import host_values, to_host
from distmb.pipeline.features.cached import cache_rows
from distmb.pipeline.features.presample import static_hot_ids
from distmb.pipeline.features.protocol import FeatureSource, TakeBuffer
from distmb.pipeline.features.zero_copy import HostRows
from distmb.pipeline.sample.host import NeighborSampler

#: Policies of the device feature cache (``--device-cache-policy``,
#: :mod:`distmb.pipeline.features.device`).
DEVICE_CACHE_POLICIES: tuple[str, ...] = ("presc", "degree", "none")

#: Directory value of a row that is not cached.
NOT_CACHED = -1
#: Bytes of directory per row of the table (int32 slot).
DIRECTORY_BYTES_PER_ROW = 4


class HostRowReader(Protocol):
    """Where :class:`DeviceFeatures` reads the rows its cache misses, when it is not a host
    table (:class:`~distmb.pipeline.features.zero_copy.HostRows` over one): the rows of an
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


class DeviceFeatures(FeatureSource):
    """Rows of a host feature table, gathered onto ``device`` through a static device cache
    (see the module docstring).

    Args:
        table: [num_rows, dim] float16/32/64 (numpy array, memory map or CPU tensor), or
            a :class:`HostRowReader` that serves the misses (then ``align_rows`` is unused).
        device: ``cuda`` (pinned host table read zero-copy) or ``cpu`` (same logic, for tests).
        capacity: rows the cache holds (clamped to the table; 0: no cache).
        hot_ids: int64 row ids by decreasing priority (distinct, in range); the first
            ``capacity`` are cached. Needed when ``capacity > 0``.
        policy: the name of the policy that ranked ``hot_ids`` (``none``: no cache whatever
            ``capacity``), for the record.
        reuse_previous: FastGL's Match: reuse the previous gather's host rows.
        align_rows: pad the host rows to 128 bytes (:class:`HostRows`).
        n_solid: a part's solid rows when ``table`` also holds its replicated halo rows
            after them (solid rows, then halo rows by ``VID_p``, as
            :class:`~distmb.pipeline.features.PartFeatures`): then :attr:`has_halo` is True
            and the BatchLoader gathers block 0's halo rows too. Default: every row is solid.
    """

    def __init__(
        self,
        table: np.ndarray | torch.Tensor | HostRowReader,
        device: torch.device | str,
        capacity: int,
        *,
        hot_ids: np.ndarray | None = None,
        policy: str = "presc",
        reuse_previous: bool = False,
        align_rows: bool = True,
        n_solid: int | None = None,
    ) -> None:
        if policy not in DEVICE_CACHE_POLICIES:
            raise ValueError(
                f"device cache policy must be one of {DEVICE_CACHE_POLICIES}, got {policy!r}"
            )
        if capacity < 0:
            raise ValueError(f"device cache capacity must be >= 0 rows, got {capacity}")
        self.host: HostRows | HostRowReader = (
            HostRows(table, device, align_rows=align_rows)
            if isinstance(table, np.ndarray | torch.Tensor)
            else table
        )
        super().__init__(self.host.num_rows, self.host.dim)
        self.device = self.host.device
        self.n_solid = self.num_rows if n_solid is None else int(n_solid)
        if not 0 <= self.n_solid <= self.num_rows:
            raise ValueError(f"DeviceFeatures: n_solid {n_solid} outside [0, {self.num_rows}]")
        self.policy = policy
        self.reuse_previous = reuse_previous
        self.capacity = 0 if policy == "none" else min(int(capacity), self.num_rows)
        self._slot_of: torch.Tensor | None = None
        self.cache = torch.empty((0, self.dim), dtype=self.host.dtype, device=self.device)
        if self.capacity:
            if hot_ids is None:
                raise ValueError(f"device cache policy {policy!r} needs hot_ids")
            self._fill(np.asarray(hot_ids))
        self._prev_ids: torch.Tensor | None = None  # sorted distinct ids of the last host read
        self._prev_rows: torch.Tensor | None = None
        self.reset_counters()

    # -- filling ------------------------------------------------------------------------------
    def _fill(self, hot_ids: np.ndarray) -> None:
        """Cache the first ``capacity`` of ``hot_ids`` (read once, in id order)."""
        if hot_ids.ndim != 1 or (hot_ids.size and hot_ids.dtype.kind not in "iu"):
            raise ValueError(f"hot_ids must be a 1-D integer array, got {hot_ids.dtype}")
        chosen = np.sort(hot_ids[: self.capacity].astype(np.int64))
        if chosen.size and (chosen[0] < 0 or chosen[-1] >= self.num_rows):
            raise ValueError(f"hot_ids must be row ids in [0, {self.num_rows})")
        if chosen.size > 1 and not np.all(chosen[1:] != chosen[:-1]):
            raise ValueError("hot_ids must not repeat an id")
        self.capacity = int(chosen.size)
        ids = torch.from_numpy(chosen).to(self.device)
        self.cache = self.host.gather(ids).clone()
        self._slot_of = torch.full(
            (self.num_rows,), NOT_CACHED, dtype=torch.int32, device=self.device
        )
        self._slot_of[ids] = torch.arange(chosen.size, dtype=torch.int32, device=self.device)

    def cached_ids(self) -> np.ndarray:
        """int64[capacity]: the cached row ids, ascending."""
        if self._slot_of is None:
            return np.zeros(0, dtype=np.int64)
        return torch.nonzero(self._slot_of != NOT_CACHED).flatten().cpu().numpy()

    @property
    def has_halo(self) -> bool:
        """Whether halo ids (``>= n_solid``) can be gathered (the table holds replicated
        halo rows)."""
        return self.num_rows > self.n_solid

    def resident(self) -> torch.Tensor:
        """bool[num_rows] on the device: whether each row is in the cache."""
        if self._slot_of is None:
            return torch.zeros(self.num_rows, dtype=torch.bool, device=self.device)
        return self._slot_of != NOT_CACHED

    # -- counters -----------------------------------------------------------------------------
    def reset_counters(self) -> None:
        super().reset_counters()
        self.lookups = 0
        self.hits = 0
        self.rows_loaded = 0
        self.rows_reused = 0

    @property
    def misses(self) -> int:
        return self.lookups - self.hits

    @property
    def bytes_h2d(self) -> int:
        """Bytes read from host memory since the last reset (the rows' values)."""
        return self.rows_loaded * self.host.row_bytes

    def counters(self) -> dict[str, int]:
        return {
            "rows_served": self.rows_served,
            "lookups": self.lookups,
            "hits": self.hits,
            "misses": self.misses,
            "rows_loaded": self.rows_loaded,
            "rows_reused": self.rows_reused,
            "bytes_h2d": self.bytes_h2d,
        }

    @property
    def memory_bytes(self) -> int:
        """Device bytes held: the cached rows and the directory."""
        if not self.capacity:
            return 0
        return self.capacity * self.host.row_bytes + self.num_rows * DIRECTORY_BYTES_PER_ROW

    def planned_loads(self, traces: Sequence[np.ndarray]) -> list[np.ndarray]:
        """What the next ``len(traces)`` gathers will read from the host rows, if they come in
        this order with nothing between them: ``traces[i]`` are the i-th gather's ids
        (int64, any order, repeats allowed). Returns one int64 array (ascending, distinct)
        per :meth:`HostRowReader.gather` they will make, in order: the misses of the cache,
        less those Match takes from the gather before; a gather that reads nothing makes
        none. Changes nothing."""
        resident = to_host(self.resident()).numpy()
        previous = to_host(self._prev_ids).numpy() if self._prev_ids is not None else None
        loads: list[np.ndarray] = []
        for trace in traces:
            ids = np.asarray(trace, dtype=np.int64)
            missed = np.unique(ids[~resident[ids]])
            if not missed.size:
                continue  # _gather reads nothing and keeps the previous rows
            load = missed
            if self.reuse_previous:
                if previous is not None and previous.size:
                    load = missed[~np.isin(missed, previous, assume_unique=True)]
                previous = missed
            if load.size:
                loads.append(load)
        return loads

    def forget_previous(self) -> None:
        """Drop the previous gather's rows (the next gather reuses nothing)."""
        self._prev_ids = self._prev_rows = None

    # -- gathering ----------------------------------------------------------------------------
    def gather_device(self, ids: np.ndarray | torch.Tensor) -> torch.Tensor:
        """float32[n, dim] on the device: the rows of ``ids`` (int64[n], any order, repeats
        allowed, on any device) in that order."""
        ids_t = self._device_ids(ids)
        out = self._gather(ids_t)
        self.rows_served += int(ids_t.numel())
        return out

    def gather_batch_rows(
        self, ids: torch.Tensor, take_buffer: TakeBuffer
    ) -> tuple[torch.Tensor, None]:
        """The BatchLoader's gather: :meth:`gather_device`'s rows, on :attr:`device`, in
        memory of their own (no host buffer is taken)."""
        return self.gather_device(ids), None

    def rows_in_place(self, ids: np.ndarray | torch.Tensor) -> None:
        """Never: the rows are gathered on the device (see :meth:`gather_batch_rows`)."""
        return None

    def _read_into(self, ids: np.ndarray, out: torch.Tensor) -> None:
        # The FeatureSource protocol's CPU output: gathered on the device, then copied back
        # (the training path uses gather_batch_rows and keeps the rows there).
        out.copy_(self._gather(torch.from_numpy(ids).to(self.device)))

    def _device_ids(self, ids: np.ndarray | torch.Tensor) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor):
            return torch.from_numpy(self._check_ids(ids)).to(self.device)
        integer = not (
            ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool
        )
        if ids.ndim != 1 or (ids.numel() and not integer):
            raise ValueError(
                "DeviceFeatures: ids must be a 1-D integer tensor, got "
                f"{ids.dtype}{list(ids.shape)}"
            )
        ids = ids.to(device=self.device, dtype=torch.int64)
        if ids.numel():
            low, high = host_values(torch.stack(torch.aminmax(ids)))
            if low < 0 or high >= self.num_rows:
                raise IndexError(
                    f"DeviceFeatures: ids must be in [0, {self.num_rows}), got [{low}, {high}]"
                )
        return ids

    def _gather(self, ids: torch.Tensor) -> torch.Tensor:
        """The four steps of the module docstring, for checked int64 ``ids`` on the device."""
        n = int(ids.numel())
        out = torch.empty((n, self.dim), dtype=torch.float32, device=self.device)
        self.lookups += n
        if not n:
            return out
        if self._slot_of is not None:
            slot = self._slot_of[ids]
            hit = slot != NOT_CACHED
            hit_pos = torch.nonzero(hit).flatten()
            if hit_pos.numel():
                out[hit_pos] = self.cache[slot[hit_pos].long()].to(torch.float32)
            miss_pos = torch.nonzero(~hit).flatten()
            self.hits += int(hit_pos.numel())
        else:
            miss_pos = torch.arange(n, device=self.device)
        if miss_pos.numel():
            unique, inverse = torch.unique(ids[miss_pos], sorted=True, return_inverse=True)
            rows = self._load(unique)
            out[miss_pos] = rows[inverse].to(torch.float32)
        return out

    def _load(self, unique: torch.Tensor) -> torch.Tensor:
        """Rows of ``unique`` (sorted distinct ids, none cached) in the table's dtype: the
        previous gather's where it read them (``reuse_previous``), else from host memory."""
        prev = self._prev_ids
        if not self.reuse_previous or prev is None or not prev.numel():
            rows = self.host.gather(unique)
            loaded = int(unique.numel())
        else:
            pos = torch.searchsorted(prev, unique).clamp_(max=prev.numel() - 1)
            found = prev[pos] == unique
            reuse = torch.nonzero(found).flatten()
            load = torch.nonzero(~found).flatten()
            rows = torch.empty(
                (unique.numel(), self.dim), dtype=self.host.dtype, device=self.device
            )
            if reuse.numel():
                assert self._prev_rows is not None
                rows[reuse] = self._prev_rows[pos[reuse]]
            if load.numel():
                rows[load] = self.host.gather(unique[load])  # a sorted subset: still sorted
            loaded = int(load.numel())
            self.rows_reused += int(reuse.numel())
        self.rows_loaded += loaded
        self.bytes_read += loaded * self.host.row_bytes
        if self.reuse_previous:
            self._prev_ids, self._prev_rows = unique, rows
        return rows

    def __repr__(self) -> str:
        return (
            f"DeviceFeatures(num_rows={self.num_rows}, dim={self.dim}, device={self.device}, "
            f"policy={self.policy}, capacity={self.capacity}, reuse_previous={self.reuse_previous})"
        )


def build_device_features(
    table: np.ndarray | torch.Tensor | HostRowReader,
    device: torch.device | str,
    cache_mb: float,
    policy: str,
    *,
    degree: np.ndarray,
    make_sampler: Callable[[int], NeighborSampler],
    train_idx: np.ndarray,
    batch_size: int,
    presample_epochs: int,
    seed: int,
    reuse_previous: bool = False,
    align_rows: bool = True,
    n_solid: int | None = None,
) -> DeviceFeatures:
    """A :class:`DeviceFeatures` of ``cache_mb`` MiB of rows (in the table's dtype) filled by
    ``policy``, ranked by :func:`~distmb.pipeline.features.presample.static_hot_ids` (``presc``
    pre-samples with its own stream derived from ``seed``; the training batches are never
    seen). The arguments from ``degree`` to ``seed`` are those of that function
    (``degree``: one entry per row of ``table``, halo rows included); ``n_solid`` is
    :class:`DeviceFeatures`'."""
    if policy not in DEVICE_CACHE_POLICIES:
        raise ValueError(
            f"device cache policy must be one of {DEVICE_CACHE_POLICIES}, got {policy!r}"
        )
    num_rows, dim = int(table.shape[0]), int(table.shape[1])
    itemsize = int(np.dtype(str(table.dtype).removeprefix("torch.")).itemsize)
    capacity = cache_rows(cache_mb, dim, num_rows, itemsize) if policy != "none" else 0
    hot = None
    if capacity:
        if np.asarray(degree).size != num_rows:
            raise ValueError(
                f"degree has {np.asarray(degree).size} entries, the table {num_rows} rows"
            )
        hot = static_hot_ids(
            policy, degree, make_sampler, train_idx, batch_size, presample_epochs, seed
        )
    return DeviceFeatures(
        table,
        device,
        capacity,
        hot_ids=hot,
        policy=policy,
        reuse_previous=reuse_previous,
        align_rows=align_rows,
        n_solid=n_solid,
    )
