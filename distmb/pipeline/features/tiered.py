"""Out-of-core features on the device path: the disk, a host cache, a device cache, the batch
(Ginex's superbatch cache, GNNLab's static device cache and PyTorch-Direct's device reads of
host rows, together).

:class:`TieredFeatures` is composed of the two existing caches, each unchanged:

- the **host cache**, a :class:`~distmb.pipeline.features.cached.CachedFeatures` over the
  part's row file (``--cache-policy``, ``--feature-cache-mb``): the rows it holds are read
  from memory, the others from disk with ``O_DIRECT``;
- the **device cache**, a :class:`~distmb.pipeline.features.device.DeviceFeatures`
  (``--device-cache-policy``, ``--device-cache-mb``, ``--match-reorder``'s Match) whose
  misses are read from the host cache instead of an in-memory table:
  :class:`HostCacheRows` gathers them through the host cache into a host buffer (pinned on
  CUDA) and copies them to the device in one transfer (on CPU tensors the host cache's
  rows are the rows).

A gather of ``ids`` looks them up in the device cache; its distinct missed ids (ascending,
less those Match takes from the previous gather) are one gather of the host cache, which
serves its hits from memory and reads its misses from disk. The superbatch plan is shared:
the BatchLoader hands :meth:`TieredFeatures.inspect` the ids of a superbatch's gathers, and
the host cache (``belady``) plans exactly the gathers it will be asked for
(:meth:`~distmb.pipeline.features.device.DeviceFeatures.planned_loads`: the device cache's
misses, per gather). Every row is the file's row (``--feature-dtype bfloat16``: the host
cache's rows, normalised and rounded as read; the device cache holds and receives them in two
bytes a value): training is bit-identical to the device path over an in-memory table of the
same dtype.

Counters: each cache keeps its own (the host cache's ``lookups``, ``hits``, ``rows_read``,
``bytes_read`` from disk; the device cache's ``lookups``, ``hits``, ``misses``,
``rows_loaded``, ``bytes_h2d``), reported per epoch as ``feature_cache`` and
``device_cache``; :meth:`TieredFeatures.counters` lists both, prefixed ``host_`` and
``device_``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from distmb.core.host_reads import to_host
from distmb.pipeline.features.cached import CachedFeatures
from distmb.pipeline.features.device import DeviceFeatures, build_device_features
from distmb.pipeline.features.normalize import FeatureNormalization, NormalizedFeatures
from distmb.pipeline.features.protocol import FeatureSource, TakeBuffer
from distmb.pipeline.features.zero_copy import resolve_device

#: A host buffer grows to this many times the request that outgrew it.
STAGING_GROWTH = 1.5


class HostCacheRows:
    """The rows of an out-of-core host cache as a
    :class:`~distmb.pipeline.features.protocol.HostRowReader`: where the device cache reads its
    misses.

    Args:
        cache: the host cache: float32 rows, or bfloat16 rows (``--feature-dtype bfloat16``;
            it normalises and rounds each row as it reads it from disk).
        device: where :meth:`gather` delivers rows.
        normalization: ``--normalize-features``, applied to every row read (None: as stored;
            ignored where the cache normalises its rows itself).

    Attributes:
        dtype: the cache's dtype, the rows' that :meth:`gather` delivers: a bfloat16 cache's
            rows cross to the device in two bytes a value (exactly: they are rounded already).
        source: what :meth:`gather` reads: the cache (normalised), or, inside
            :meth:`filling`, the cache read without changing it.
    """

    def __init__(
        self,
        cache: CachedFeatures,
        device: torch.device | str,
        normalization: FeatureNormalization | None = None,
    ) -> None:
        self.cache = cache
        self.device = resolve_device(device)
        self.normalization = cache.normalization_on_read(normalization)
        self.num_rows, self.dim = cache.num_rows, cache.dim
        self.dtype = cache.finish.dtype
        self.row_bytes = self.dim * self.dtype.itemsize
        self.source = self._normalized(cache)
        self._staging = torch.empty(0, dtype=torch.float32)
        self._sent = torch.empty(0, dtype=self.dtype)  # pinned, two-byte rows (CUDA)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_rows, self.dim)

    def _normalized(self, source: FeatureSource) -> FeatureSource:
        if self.normalization is None:
            return source
        return NormalizedFeatures(source, self.normalization)

    @contextmanager
    def filling(self) -> Iterator[None]:
        """Within: :meth:`gather` reads through the host cache without changing it or
        consuming a plan (:meth:`CachedFeatures.lookup_only`): the device cache's one-off
        fill is no request of training."""
        self.source = self._normalized(self.cache.lookup_only())
        try:
            yield
        finally:
            self.source = self._normalized(self.cache)

    def gather(self, sorted_ids: torch.Tensor) -> torch.Tensor:
        """[n, dim] of :attr:`dtype` on :attr:`device`: rows ``sorted_ids`` (int64[n],
        ascending, distinct, on :attr:`device`), one gather of the host cache."""
        ids = to_host(sorted_ids).numpy()
        if self.device.type == "cpu":
            # New rows: the device cache may keep them (Match).
            return self.source.gather(ids).to(self.dtype)
        n = ids.size * self.dim
        two_bytes = self.dtype != torch.float32
        if self._staging.numel() < n:
            size = int(n * STAGING_GROWTH)
            self._staging = torch.empty(size, dtype=torch.float32, pin_memory=not two_bytes)
            if two_bytes:
                self._sent = torch.empty(size, dtype=self.dtype, pin_memory=True)
        rows = self._staging[:n].view(ids.size, self.dim)
        self.source.gather_into(ids, rows)
        if two_bytes:
            rows = self._sent[:n].view(ids.size, self.dim).copy_(rows)
        # Synchronous: the buffers are refilled by the next gather.
        return rows.to(self.device)

    def __repr__(self) -> str:
        return f"HostCacheRows({self.cache!r}, device={self.device})"


class TieredFeatures(FeatureSource):
    """Rows of an out-of-core table through a host cache and a device cache, gathered onto
    the device (see the module docstring).

    Args:
        host_cache: the host cache.
        device_cache: the device cache, reading its misses from ``host_cache`` (built by
            :func:`build_tiered_features`).

    Attributes:
        wants_trace: the host cache plans superbatches (``belady``).
    """

    def __init__(self, host_cache: CachedFeatures, device_cache: DeviceFeatures) -> None:
        host = device_cache.host
        if not isinstance(host, HostCacheRows) or host.cache is not host_cache:
            raise ValueError("TieredFeatures: the device cache must read from the host cache")
        super().__init__(device_cache.num_rows, device_cache.dim)
        self.host_cache = host_cache
        self.device_cache = device_cache
        self.device = device_cache.device
        self.wants_trace = host_cache.wants_trace

    @property
    def has_halo(self) -> bool:
        return self.device_cache.has_halo

    # -- counters -----------------------------------------------------------------------------
    def reset_counters(self) -> None:
        super().reset_counters()
        self.device_cache.reset_counters()
        self.host_cache.reset_counters()

    def counters(self) -> dict[str, int]:
        return {
            "rows_served": self.rows_served,
            "bytes_read": self.bytes_read,
            **{f"device_{k}": v for k, v in self.device_cache.counters().items()},
            **{f"host_{k}": v for k, v in self.host_cache.counters().items()},
        }

    # -- planning and gathering ---------------------------------------------------------------
    def inspect(self, traces: Sequence[np.ndarray]) -> None:
        """The next gathers request ``traces[i]`` in order: the host cache plans the reads
        the device cache will make of it (:meth:`DeviceFeatures.planned_loads`)."""
        if self.wants_trace and traces:
            self.host_cache.inspect(self.device_cache.planned_loads(traces))

    def gather_device(self, ids: np.ndarray | torch.Tensor) -> torch.Tensor:
        """float32[n, dim] on the device: the rows of ``ids`` (int64[n], any order, repeats
        allowed, on any device) in that order."""
        with self._counting_disk_reads():
            rows = self.device_cache.gather_device(ids)
        self.rows_served += int(rows.shape[0])
        return rows

    def gather_batch_rows(
        self, ids: torch.Tensor, take_buffer: TakeBuffer
    ) -> tuple[torch.Tensor, None]:
        """The BatchLoader's gather: :meth:`gather_device`'s rows, in device memory of their
        own (no host buffer is taken)."""
        return self.gather_device(ids), None

    def rows_in_place(self, ids: np.ndarray | torch.Tensor) -> None:
        """Never: the rows are gathered on the device."""
        return None

    def _read_into(self, ids: np.ndarray, out: torch.Tensor) -> None:
        with self._counting_disk_reads():
            self.device_cache.gather_into(ids, out)

    @contextmanager
    def _counting_disk_reads(self) -> Iterator[None]:
        """Add the host cache file's bytes read within to :attr:`bytes_read`."""
        file = self.host_cache.file
        before = file.bytes_read
        try:
            yield
        finally:
            self.bytes_read += int(file.bytes_read - before)

    def __repr__(self) -> str:
        return f"TieredFeatures({self.host_cache!r}, {self.device_cache!r})"


def build_tiered_features(
    host_cache: CachedFeatures,
    device: torch.device | str,
    normalization: FeatureNormalization | None = None,
    **device_cache: Any,
) -> TieredFeatures:
    """A :class:`TieredFeatures` over ``host_cache``: the device cache is
    :func:`~distmb.pipeline.features.device.build_device_features` with the keyword
    arguments ``device_cache`` (from ``cache_mb`` on) over the host cache's rows, normalised
    by ``normalization``; its hot rows are read once through the host cache without
    changing it, and the host cache's counters start from zero."""
    rows = HostCacheRows(host_cache, device, normalization)
    with rows.filling():
        cache = build_device_features(rows, device, **device_cache)
    host_cache.reset_counters()
    return TieredFeatures(host_cache, cache)
