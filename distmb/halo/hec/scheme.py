"""The historical-embedding-cache halo scheme: Asynchronous Embedding Push (Algorithm 2 of
DistGNN-MB) over per-layer HECs.

Per iteration (step) ``k`` of ``M`` (all ranks run the same ``M``), for every layer ``l``:

1. :meth:`HistoricalEmbeddingScheme.after_sample` (before the forward pass): if ``k >= d``,
   finish the exchange started at ``k - d`` and store what arrived in ``HEC[l]``; then look
   up this batch's halo leaves of block ``l``. Misses lose their edges
   (``Block.drop_sources``). Layer 0 reads replicated halo features instead when the
   partition has them.
2. :meth:`HistoricalEmbeddingScheme.layer_input` (during the forward pass, once layer ``l``'s
   input is known): if ``k < M - d``, take block ``l``'s solid sources that some peer holds
   as halo (``send_lists``), keep at most ``nc`` per peer (sampled without replacement with
   probability proportional to in-degree, counter-based keys:
   :mod:`distmb.halo.hec.push_select`; on the block's device), and start the non-blocking
   all-to-all-v of their ``VID_o`` and detached layer-``l`` inputs.
3. :meth:`HistoricalEmbeddingScheme.end_iteration`: every cache's ages advance by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from distmb.comm import RankGroup
from distmb.core.host_reads import host_scalar
from distmb.data.store.store import PartitionStore
from distmb.halo.hec.contract import CACHE_STATE_KEYS, LIFESPAN_UNBOUNDED, EmbeddingCache
from distmb.halo.hec.device import DeviceHistoricalCache
from distmb.halo.hec.host import HistoricalEmbeddingCache
from distmb.halo.hec.push_select import (
    PushTables,
    push_call_key,
    select_push_device,
    select_push_host,
)
from distmb.halo.hec.transport import EmbeddingTransport, make_push
from distmb.halo.scheme import HaloScheme
from distmb.pipeline.minibatch import MiniBatch
from distmb.pipeline.sample.blocks import Block


@dataclass(frozen=True)
class HecSettings:
    """The historical embedding cache of a multi-rank run (:attr:`TrainConfig.hec`).

    Args:
        enabled: ``False`` (``--no-hec``) drops every halo leaf instead.
        size: cache lines per layer (cs).
        nc: rows pushed per peer and layer per iteration at most.
        lifespan: iterations a cached embedding stays usable (ls).
        delay: iterations between a push and its use (d).
    """

    enabled: bool
    size: int
    nc: int
    lifespan: int
    delay: int


class HistoricalEmbeddingScheme(HaloScheme):
    """The AEP state of one rank: one cache (:class:`~distmb.halo.hec.contract.EmbeddingCache`)
    and one push queue per layer that needs them.

    Args:
        comm: the ranks.
        store: this rank's part (send lists, ``orig_ids``, ``in_degree``, halo features).
        config: cache size, push cap, life-span, delay.
        seed: seed of the degree-weighted push sampling.
        cache_device: ``None`` (the default) keeps the caches in the C++
            :class:`HistoricalEmbeddingCache`; a device puts them in
            :class:`~distmb.halo.hec.device.DeviceHistoricalCache` tables there (same lines,
            hits and counters). Halo rows then come back as tensors on that device; the tags
            pushed by peers are validated once by the partition loader, so a GPU cache runs
            unchecked (no synchronisation per call).
    """

    name = "hec"
    reads_input_rows = True  # pushes layer 0's rows to the peers
    stateful = True

    def __init__(
        self,
        comm: RankGroup,
        store: PartitionStore,
        config: HecSettings,
        seed: int,
        cache_device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.cache_device = None if cache_device is None else torch.device(cache_device)
        self.comm = comm
        self.cfg = config
        self.seed = seed
        self.orig_ids = np.asarray(store.orig_ids)
        self.replicated_halo = store.replicated
        self.degree = np.asarray(store.in_degree[: store.n_solid], dtype=np.float64)
        peer_ptr, peer_ids = _peers_of_solid(store, comm.size)
        #: What the push choice reads (host arrays), and its copies per device.
        self._tables = PushTables.on_host(peer_ptr, peer_ids, self.orig_ids, self.degree)
        self._tables_on: dict[torch.device, PushTables] = {}
        #: Lines per cache: only this part's halo vertices are ever pushed here, so more than
        #: ``n_halo`` lines would never be used (``--hec-size`` is an upper bound).
        self.capacity = max(1, min(config.size, store.n_halo))
        self.caches: list[EmbeddingCache | None] = []
        self.pushes: list[EmbeddingTransport | None] = []
        #: ``orig_ids`` on :attr:`cache_device` (int64[n_local]) when the caches live there:
        #: halo tags are looked up without leaving the device.
        self._orig_ids_device: torch.Tensor | None = None
        if self.cache_device is not None:
            self._orig_ids_device = torch.from_numpy(
                np.array(self.orig_ids, dtype=np.int64)  # a writable copy (memory-mapped)
            ).to(self.cache_device)
        #: Optional recorder for tests: receives ("push"|"load", k, layer, tags, rows, hit).
        self.record = None

    def setup(self, layer_dims: list[int]) -> None:
        super().setup(layer_dims)
        # Layer 0 needs no cache when halo features are replicated.
        uses_cache = [not (layer == 0 and self.replicated_halo) for layer in range(self.num_layers)]
        self.caches = [
            self._new_cache(dim, LIFESPAN_UNBOUNDED if layer == 0 else self.cfg.lifespan)
            if uses_cache[layer]
            else None
            for layer, dim in enumerate(layer_dims)
        ]
        self.pushes = [
            make_push(self.comm, dim, self.cfg.delay) if uses_cache[layer] else None
            for layer, dim in enumerate(layer_dims)
        ]

    def _new_cache(self, dim: int, lifespan: int) -> EmbeddingCache:
        if self.cache_device is None:
            return HistoricalEmbeddingCache(self.capacity, dim, lifespan)
        return DeviceHistoricalCache(
            self.capacity,
            dim,
            lifespan,
            device=self.cache_device,
            checked=self.cache_device.type == "cpu",
        )

    def describe(self) -> str:
        cfg = self.cfg
        where = "" if self.cache_device is None else f" on {self.cache_device}"
        return (
            f"HEC cs={self.capacity}{where} (--hec-size {cfg.size}, at most the part's halo "
            f"vertices; rank {self.comm.rank}) nc={cfg.nc} ls={cfg.lifespan} d={cfg.delay}"
        )

    def schedule_warning(self, num_steps: int) -> str | None:
        if num_steps > self.cfg.delay:
            return None
        return (
            f"HEC: an epoch has {num_steps} iteration(s), not more than --hec-delay "
            f"{self.cfg.delay}: pushes start only when their delivery falls in the same epoch, "
            "so no embedding is ever pushed and every halo leaf misses; use a smaller "
            "--batch-size or --hec-delay"
        )

    # -- before the forward pass -----------------------------------------------------------
    def after_sample(self, batch: MiniBatch, step: int, num_steps: int) -> None:
        """Receive and store the pushes started ``d`` steps ago, then load every block's
        halo leaves (misses come back as zero rows and lose their edges)."""
        if step >= self.cfg.delay:
            for push, cache in zip(self.pushes, self.caches, strict=True):
                if push is not None:
                    tags, rows = push.finish()
                    cache.store(tags, rows)
        super().after_sample(batch, step, num_steps)

    def _fill(self, layer: int, block: Block, step: int) -> tuple[Block, torch.Tensor]:
        """Load the halo leaves' rows from ``HEC[layer]``; drop the edges of the misses.

        With a device cache, the tags are looked up from a device copy of ``orig_ids`` and
        the edge filter runs on the block's device: nothing crosses the host but the
        all-hit test (one flag)."""
        cache = self.caches[layer]
        halo_p = block.src_ids[block.n_computed :]
        if self._orig_ids_device is not None:
            tags = self._orig_ids_device[halo_p.to(self.cache_device)]
            device = self.cache_device
        else:
            tags = self.orig_ids[halo_p.cpu().numpy()]
            device = torch.device("cpu")
        full = torch.empty((block.n_halo, self.layer_dims[layer]), device=device)
        hit = cache.lookup_into(tags, full)  # misses come back as zeros
        if self.record is not None:
            self.record(
                "load",
                step,
                layer,
                np.asarray(tags.cpu() if isinstance(tags, torch.Tensor) else tags),
                full.cpu().numpy().copy(),
                hit.cpu().numpy().copy(),
            )
        if host_scalar(hit.all()):  # the one read of a device cache's load
            return block, full
        keep = torch.ones(block.n_src, dtype=torch.bool, device=block.device)
        keep[block.n_computed :] = hit.to(block.device)
        return block.drop_sources(keep), full.to(block.device)

    # -- during the forward pass -----------------------------------------------------------
    def layer_input(
        self, batch: MiniBatch, layer: int, h: torch.Tensor, step: int, num_steps: int
    ) -> torch.Tensor:
        """Start pushing this batch's boundary rows of layer ``layer`` (``h``, the computed
        sources' rows, detached) to the peers, then return the layer's input."""
        self._push(layer, batch.blocks[layer], h, step, num_steps)
        return super().layer_input(batch, layer, h, step, num_steps)

    def _push(
        self, layer: int, block: Block, x_computed: torch.Tensor, k: int, num_iters: int
    ) -> None:
        """Push the chosen rows of ``x_computed`` (float32[n_computed, dim], on the block's
        device) to the peers (:mod:`distmb.halo.hec.push_select`): chosen on the host (numpy)
        for CPU blocks with the C++ caches, else with torch ops on the block's device (the
        GPU path; only the per-peer counts cross to the host). Both choose the same rows."""
        push = self.pushes[layer]
        if push is None or k >= num_iters - self.cfg.delay:
            return
        solid = block.src_ids[: block.n_computed]
        call_key = push_call_key(self.seed, self.epoch, k, layer, self.comm.rank)
        nc, size = self.cfg.nc, self.comm.size
        tags: np.ndarray | torch.Tensor
        if self.cache_device is None and solid.device.type == "cpu":
            solid_np = solid.numpy()
            chosen_np, counts = select_push_host(solid_np, self._tables, nc, size, call_key)
            chosen = torch.from_numpy(chosen_np)
            tags = self.orig_ids[solid_np[chosen_np]]
        else:
            tables = self._device_tables(solid.device)
            chosen, counts = select_push_device(solid, tables, nc, size, call_key)
            tags = tables.orig_ids[solid[chosen]]
        x = x_computed.detach()
        # float32 whatever --precision (a bf16 row has no numpy view for the MPI push).
        rows = x[chosen.to(x.device)].float()
        if self.record is not None:
            host_tags = tags.cpu().numpy() if isinstance(tags, torch.Tensor) else tags
            self.record("push", k, layer, host_tags, rows.cpu().numpy().copy(), counts.copy())
        push.start(counts, tags, rows)

    def _device_tables(self, device: torch.device) -> PushTables:
        """:attr:`_tables` on ``device`` (copied once per device; ``orig_ids`` shared with
        the cache's lookups when they are on the same device)."""
        tables = self._tables_on.get(device)
        if tables is None:
            same = self._orig_ids_device is not None and self._orig_ids_device.device == device
            tables = self._tables.to(device, self._orig_ids_device if same else None)
            self._tables_on[device] = tables
        return tables

    def end_iteration(self) -> None:
        """Ages advance once per iteration."""
        for cache in self.caches:
            if cache is not None:
                cache.advance()

    # -- checkpointing ----------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """The valid lines of every cache, as ``layer{l}_tags`` / ``_ages`` / ``_rows`` arrays
        (see :meth:`~distmb.halo.hec.contract.EmbeddingCache.state`). Taken between epochs,
        when no push is in flight (pushes stop ``d`` iterations before the end of an
        epoch)."""
        out: dict[str, np.ndarray] = {}
        for layer, cache in enumerate(self.caches):
            if cache is not None:
                for key, value in cache.state().items():
                    out[f"layer{layer}_{key}"] = value
        return out

    def state_keys(self) -> set[str]:
        return {
            f"layer{layer}_{key}"
            for layer, cache in enumerate(self.caches)
            if cache is not None
            for key in CACHE_STATE_KEYS
        }

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`state`.

        Raises:
            ValueError: the arrays do not hold exactly this rank's caches (other layers, or
                rows of another width or dtype:
                :meth:`~distmb.halo.hec.contract.EmbeddingCache.store`).
        """
        expected = self.state_keys()
        if set(arrays) != expected:
            raise ValueError(f"cache state holds {sorted(arrays)}, expected {sorted(expected)}")
        for layer, cache in enumerate(self.caches):
            if cache is not None:
                cache.restore({key: arrays[f"layer{layer}_{key}"] for key in CACHE_STATE_KEYS})

    # -- statistics ------------------------------------------------------------------------
    def stats(self) -> dict[str, np.ndarray]:
        out = super().stats()
        for layer, (cache, push) in enumerate(zip(self.caches, self.pushes, strict=True)):
            if cache is not None:
                counters = cache.counters()
                out["lookups"][layer] = counters["lookups"]
                out["hits"][layer] = counters["hits"]
            if push is not None:
                out["rows_pushed"][layer] = push.stats.rows_sent
                out["bytes_pushed"][layer] = push.stats.bytes_sent
                out["rows_received"][layer] = push.stats.rows_received
                out["bytes_received"][layer] = push.stats.bytes_received
                out["comm_wait"][0] += push.stats.wait_s
                out["comm_mpi"][0] += push.stats.mpi_s
                out["comm_mpi_cpu"][0] += push.stats.mpi_cpu_s
        return out

    def reset_stats(self) -> None:
        super().reset_stats()
        for cache, push in zip(self.caches, self.pushes, strict=True):
            if cache is not None:
                cache.reset_counters()
            if push is not None:
                push.stats.reset()


def _peers_of_solid(store: PartitionStore, num_parts: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of the send lists: for every solid vertex, the peers that hold it as halo.

    Returns:
        (peer_ptr int64[n_solid + 1], peer_ids int32[n_send]) as a CSR.
    """
    send_ids = np.asarray(store.send_ids, dtype=np.int64)
    owner = np.repeat(np.arange(num_parts, dtype=np.int32), np.diff(store.send_ptr))
    order = np.argsort(send_ids, kind="stable")
    ptr = np.zeros(store.n_solid + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(np.bincount(send_ids, minlength=store.n_solid))
    return ptr, owner[order]
