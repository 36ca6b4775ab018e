"""A device feature cache over zero-copy host rows (GNNLab's PreSC cache, PyTorch-Direct's
direct host reads, FastGL's Match).

:class:`DeviceFeatures` holds the hot rows of a feature table in device memory (sized in MiB,
``--device-cache-mb``) and gathers every other row on the device straight from pinned host
memory (:class:`~distmb.pipeline.features.zero_copy.HostRows`). Which rows are hot is
decided once, before training, by the same ranking as the host cache
(:func:`distmb.pipeline.features.presample.static_hot_ids`):

- ``presc``: the rows pre-sampling (its own random stream, ``--presample-epochs``) requested
  most, ties by in-degree (GNNLab's PreSC#1);
- ``degree``: the highest in-degree rows;
- ``none``: no cache, every row from host memory.

A gather of ``ids`` (int64, any order, repeats allowed) has two back ends (``backend``).

The **sync-free** one (``"triton"``; ``"auto"`` takes it on CUDA) makes no host
synchronisation in steady state, so that the launch queue never stalls on the gather:

1. sorts the ids (``torch.sort``, repeats kept; ``perm``: where each sorted id goes), so
   that the device reads host rows in ascending order, as PyTorch-Direct's zero-copy wants;
2. in one Triton kernel (:mod:`distmb.pipeline.features.gather_triton`), looks every sorted
   id up in the device directory (``int32[num_rows]``: the slot, or -1) and reads its row
   from the cache when it has a slot, else from host memory (zero-copy on CUDA), as float32;
3. writes each row to ``out[perm[i]]``, which puts the rows back in the requested order;
4. counts, in the same kernel and on the device, the hits, the distinct misses (a missed
   sorted id that differs from its predecessor: ``rows_loaded``, as the torch back end
   counts them) and the ids outside ``[0, num_rows)``.

Each position reads its own row, so a missed id requested twice is read twice (sorted, the
repeats sit side by side: lanes of one warp reading one address make one request). The
BatchLoader's ids, a block's sources, are distinct; for requests with repeats ``bytes_h2d``
counts each distinct row once, a lower bound of the PCIe traffic.

Nothing is read back per gather: ``lookups`` and ``rows_served`` are the requests' sizes
(known on the host); the other counters stay on the device until a check point reads them,
in one host read: :meth:`counters` (once per epoch in the engine), a counter's property,
:meth:`reset_counters` or :meth:`check`. The BatchLoader's gather
(:meth:`gather_batch_rows`, ids from the sampler's blocks) defers its range check to the
same read: an id outside the table reads nothing (its address is clamped into the table,
its loads are masked off, its row is NaN) and is counted, and the next check point raises
the ``IndexError`` an immediate check raises, naming the range and the smallest and largest
ids seen. The public :meth:`gather_device` still checks its ids at once (one host read).

The **torch** one (``"torch"``, and ``"auto"`` off CUDA: the CPU runs keep their numbers and
their speed) uses PyTorch ops, each host synchronisation a visible one:

1. looks every id up in the directory and copies the hits from the cache
   (``torch.nonzero`` of the hits);
2. deduplicates and sorts the misses (``torch.nonzero``, ``torch.unique``), so that the
   device reads each missed row once, in ascending order;
3. with ``reuse_previous`` (FastGL's *Match*), takes the missed rows that the previous gather
   already brought from host memory from that gather's rows (device memory) instead of
   reading them again;
4. reads the rest from host memory (zero-copy on CUDA) and puts every row back in the
   requested order.

Match (``reuse_previous``) and an out-of-core :class:`HostRowReader` behind the cache always
take the torch back end: both need the misses' distinct ids as a tensor of their own, whose
size is data-dependent (Match keeps them for the next gather; a reader reads exactly those
rows, from its host cache and its file).

Every gather returns exactly the table's rows (cast to float32). With ``dtype``
(``--feature-dtype float16`` or ``bfloat16``) the host rows and the cache store the table in
that dtype: a gather returns the stored values (the table's, rounded once) as float32, and a
missed row moves half the bytes over PCIe. Counters, per
:meth:`reset_counters`, the same under both back ends: ``lookups`` (ids requested, with
repeats), ``hits`` (of those, ids in the cache), ``misses``, ``rows_loaded`` (distinct rows
read from host memory), ``rows_reused`` (distinct missed rows taken from the previous
gather) and ``bytes_h2d`` (``rows_loaded`` times the row's bytes in the table's dtype: what
crossed PCIe).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import torch

from distmb.core.host_reads import host_values, to_host
from distmb.pipeline.features import gather_triton
from distmb.pipeline.features.cached import cache_rows
from distmb.pipeline.features.gather_triton import (
    STAT_DISTINCT_MISSES,
    STAT_HIGH,
    STAT_HITS,
    STAT_LOW,
    STAT_OUT_OF_RANGE,
)
from distmb.pipeline.features.presample import static_hot_ids
from distmb.pipeline.features.protocol import FeatureSource, HostRowReader, TakeBuffer
from distmb.pipeline.features.zero_copy import HostRows
from distmb.pipeline.sample import idmap_triton
from distmb.pipeline.sample.host import NeighborSampler

#: Policies of the device feature cache (``--device-cache-policy``,
#: :mod:`distmb.pipeline.features.device`).
DEVICE_CACHE_POLICIES: tuple[str, ...] = ("presc", "degree", "none")

#: Directory value of a row that is not cached.
NOT_CACHED = gather_triton.NOT_CACHED
#: Bytes of directory per row of the table (int32 slot).
DIRECTORY_BYTES_PER_ROW = 4

#: Gather back ends (module docstring): ``"auto"`` is the sync-free Triton gather on a CUDA
#: device (where it can run and the cache allows it), else torch ops.
GatherBackend = Literal["auto", "triton", "torch"]
GATHER_BACKENDS: tuple[str, ...] = ("auto", "triton", "torch")


def resolve_gather_backend(
    backend: str, device: torch.device, *, reuse_previous: bool, host_reader: bool
) -> str:
    """``"triton"`` or ``"torch"``: the back end a :class:`DeviceFeatures` on ``device``
    gathers with (``host_reader``: its misses come from a :class:`HostRowReader`).

    Raises:
        ValueError: an unknown back end, or ``"triton"`` where it cannot run (Triton absent,
            a CPU device without ``TRITON_INTERPRET=1``) or with Match or a host reader.
    """
    if backend not in GATHER_BACKENDS:
        raise ValueError(f"device gather back end {backend!r}: expected one of {GATHER_BACKENDS}")
    usable, why = idmap_triton.usable(device)
    if reuse_previous or host_reader:
        why = "Match (reuse_previous) and a HostRowReader take the torch back end"
        usable = False
    if backend == "auto":
        return "triton" if usable and device.type == "cuda" else "torch"
    if backend == "triton" and not usable:
        raise ValueError(f"device gather back end 'triton' cannot run on {device}: {why}")
    return backend


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
        backend: ``"auto"``, ``"triton"`` (sync-free) or ``"torch"`` (module docstring;
            :func:`resolve_gather_backend`); the one taken is :attr:`backend`.
        dtype: the dtype the host rows and the cache store the table in (``--feature-dtype``,
            :data:`~distmb.pipeline.features.storage.STORAGE_DTYPES`); None: the table's.
            Gathers return float32 whatever it is. Not with a :class:`HostRowReader`.

    Attributes:
        gather_programs: the sync-free gather's cap on its programs per column block (each
            then loops over row blocks, leaving the rest of the GPU to other streams'
            kernels: :mod:`~distmb.pipeline.features.gather_triton`); None (default): one
            program per row block. Set it between gathers; the rows are the same either way.
    """

    gather_programs: int | None = None

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
        backend: GatherBackend = "auto",
        dtype: torch.dtype | None = None,
    ) -> None:
        if policy not in DEVICE_CACHE_POLICIES:
            raise ValueError(
                f"device cache policy must be one of {DEVICE_CACHE_POLICIES}, got {policy!r}"
            )
        if capacity < 0:
            raise ValueError(f"device cache capacity must be >= 0 rows, got {capacity}")
        if isinstance(table, np.ndarray | torch.Tensor):
            self.host: HostRows | HostRowReader = HostRows(
                table, device, align_rows=align_rows, dtype=dtype
            )
        elif dtype is not None and dtype != table.dtype:
            raise ValueError(
                f"DeviceFeatures: a HostRowReader serves {table.dtype} rows; it cannot store "
                f"them as {dtype}"
            )
        else:
            self.host = table
        super().__init__(self.host.num_rows, self.host.dim)
        self.device = self.host.device
        self.backend = resolve_gather_backend(
            backend,
            self.device,
            reuse_previous=reuse_previous,
            host_reader=not isinstance(self.host, HostRows),
        )
        # The sync-free back end's counters and range check, on the device (module
        # docstring). Only the kernel writes the counts (they grow from construction on;
        # _seen: their values at the last read): no reset on the reading thread's stream
        # can race with a gather on the BatchLoader's producer stream. _pending: a gather
        # may have added to them since the last read.
        self._stats = gather_triton.new_stats(self.device)
        self._seen = [0] * gather_triton.STATS_SIZE  # only its counts are used
        self._pending = False
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
        """Zero the counters; a deferred range error still pending is raised first
        (:meth:`check`), so that a reset never hides it."""
        self.check()
        super().reset_counters()
        self.lookups = 0
        self._hits = 0
        self._rows_loaded = 0
        self.rows_reused = 0

    def check(self) -> None:
        """Read the sync-free gathers' device counters into the host ones (one host read,
        none when no such gather ran since the last check) and raise the deferred range
        error if one of their ids was outside the table (module docstring).

        The counts read are those of the gathers the calling thread's CUDA stream is
        ordered after: every gather made on it, and those of a BatchLoader's producer
        stream up to the last batch handed over (the hand-over makes the consumer's stream
        wait for it); the engine reads them after the epoch's last batch.

        Raises:
            IndexError: an id outside ``[0, num_rows)`` reached :meth:`gather_batch_rows`
                since the last check; the message names the range and the smallest and
                largest ids gathered since the last such error. The counters are read (and
                the error cleared) first.
        """
        if not self._pending:
            return
        self._pending = False  # before the read: a gather made meanwhile sets it again
        stats, seen = host_values(self._stats), self._seen
        self._seen = stats
        self._hits += stats[STAT_HITS] - seen[STAT_HITS]
        self._rows_loaded += stats[STAT_DISTINCT_MISSES] - seen[STAT_DISTINCT_MISSES]
        bad = stats[STAT_OUT_OF_RANGE] - seen[STAT_OUT_OF_RANGE]
        if bad:
            low, high = stats[STAT_LOW], stats[STAT_HIGH]
            # The next error names the ids seen after this one (the run stops here anyway:
            # this write cannot race with a gather that matters).
            self._stats[STAT_LOW:].copy_(gather_triton.new_stats(self.device)[STAT_LOW:])
            raise IndexError(
                f"DeviceFeatures: ids must be in [0, {self.num_rows}), got [{low}, {high}] "
                f"({bad} ids outside it, gathered by the BatchLoader since the last check; "
                "their rows were NaN)"
            )

    @property
    def hits(self) -> int:
        """Ids found in the cache since the last reset (a check point: :meth:`check`)."""
        self.check()
        return self._hits

    @property
    def rows_loaded(self) -> int:
        """Distinct rows read from host memory per gather, summed since the last reset (a
        check point: :meth:`check`)."""
        self.check()
        return self._rows_loaded

    @property
    def misses(self) -> int:
        return self.lookups - self.hits

    @property
    def bytes_h2d(self) -> int:
        """Bytes read from host memory since the last reset (the rows' values)."""
        return self.rows_loaded * self.host.row_bytes

    @property
    def bytes_read(self) -> int:  # FeatureSource's counter: here the same as bytes_h2d
        return self.bytes_h2d

    @bytes_read.setter
    def bytes_read(self, value: int) -> None:
        # FeatureSource's constructor and reset_counters zero it; it follows rows_loaded.
        if value != 0:
            raise AttributeError("DeviceFeatures.bytes_read follows rows_loaded; set neither")

    def counters(self) -> dict[str, int]:
        self.check()
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
        allowed, on any device) in that order. The ids' range is checked at once (one host
        read).

        Raises:
            IndexError: an id outside ``[0, num_rows)``.
            ValueError: ``ids`` not a 1-D integer array or tensor.
        """
        ids_t = self._device_ids(ids)
        out = self._gather(ids_t)
        self.rows_served += int(ids_t.numel())
        return out

    def gather_batch_rows(
        self, ids: torch.Tensor, take_buffer: TakeBuffer
    ) -> tuple[torch.Tensor, None]:
        """The BatchLoader's gather: :meth:`gather_device`'s rows, on :attr:`device`, in
        memory of their own (no host buffer is taken). With the sync-free back end it makes
        no host synchronisation: the range of ``ids`` (a block's sources) is checked at the
        next check point (:meth:`check`) instead."""
        if self.backend != "triton":
            return self.gather_device(ids), None
        ids_t = self._device_ids(ids, check_range=False)
        out = self._gather_sync_free(ids_t)
        self.rows_served += int(ids_t.numel())
        return out, None

    def rows_in_place(self, ids: np.ndarray | torch.Tensor) -> None:
        """Never: the rows are gathered on the device (see :meth:`gather_batch_rows`)."""
        return None

    def _read_into(self, ids: np.ndarray, out: torch.Tensor) -> None:
        # The FeatureSource protocol's CPU output: gathered on the device, then copied back
        # (the training path uses gather_batch_rows and keeps the rows there).
        out.copy_(self._gather(torch.from_numpy(ids).to(self.device)))

    def _device_ids(
        self, ids: np.ndarray | torch.Tensor, *, check_range: bool = True
    ) -> torch.Tensor:
        """int64 ``ids`` on the device, their shape and dtype checked (metadata: no host
        read) and, with ``check_range``, their range (one host read of a device tensor)."""
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
        if check_range and ids.numel():
            low, high = host_values(torch.stack(torch.aminmax(ids)))
            if low < 0 or high >= self.num_rows:
                raise IndexError(
                    f"DeviceFeatures: ids must be in [0, {self.num_rows}), got [{low}, {high}]"
                )
        return ids

    def _gather(self, ids: torch.Tensor) -> torch.Tensor:
        """float32[n, dim]: the rows of checked int64 ``ids`` on the device, by
        :attr:`backend`."""
        if self.backend == "triton":
            return self._gather_sync_free(ids)
        return self._gather_torch(ids)

    def _gather_sync_free(self, ids: torch.Tensor) -> torch.Tensor:
        """The sync-free back end's four steps (module docstring) for int64 ``ids`` on the
        device, in range or not (an id outside reads nothing and is counted)."""
        self.lookups += int(ids.numel())
        sorted_ids, perm = torch.sort(ids)
        assert isinstance(self.host, HostRows)  # resolve_gather_backend saw to it
        out = gather_triton.gather_rows(
            sorted_ids,
            perm,
            self._slot_of,
            self.cache,
            self.host.view,
            self.num_rows,
            self._stats,
            self.gather_programs,
        )
        self._pending = self._pending or bool(ids.numel())
        return out

    def _gather_torch(self, ids: torch.Tensor) -> torch.Tensor:
        """The torch back end's four steps (module docstring), for checked int64 ``ids`` on
        the device."""
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
            self._hits += int(hit_pos.numel())
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
        self._rows_loaded += loaded  # bytes_read follows
        if self.reuse_previous:
            self._prev_ids, self._prev_rows = unique, rows
        return rows

    def __repr__(self) -> str:
        return (
            f"DeviceFeatures(num_rows={self.num_rows}, dim={self.dim}, device={self.device}, "
            f"policy={self.policy}, capacity={self.capacity}, "
            f"reuse_previous={self.reuse_previous}, backend={self.backend})"
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
    backend: GatherBackend = "auto",
    dtype: torch.dtype | None = None,
) -> DeviceFeatures:
    """A :class:`DeviceFeatures` of ``cache_mb`` MiB of rows (in the stored dtype: ``dtype``,
    default the table's) filled by ``policy``, ranked by
    :func:`~distmb.pipeline.features.presample.static_hot_ids` (``presc`` pre-samples with its
    own stream derived from ``seed``; the training batches are never seen). The arguments
    from ``degree`` to ``seed`` are those of that function (``degree``: one entry per row of
    ``table``, halo rows included); ``n_solid``, ``backend`` and ``dtype`` are
    :class:`DeviceFeatures`'."""
    if policy not in DEVICE_CACHE_POLICIES:
        raise ValueError(
            f"device cache policy must be one of {DEVICE_CACHE_POLICIES}, got {policy!r}"
        )
    num_rows, dim = int(table.shape[0]), int(table.shape[1])
    stored = dtype if dtype is not None else table.dtype
    itemsize = stored.itemsize if isinstance(stored, torch.dtype) else np.dtype(stored).itemsize
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
        backend=backend,
        dtype=dtype,
    )
