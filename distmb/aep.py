"""Asynchronous Embedding Push (Algorithm 2 of DistGNN-MB) over per-layer HECs.

Per iteration ``k`` of ``M`` (all ranks run the same ``M``), for every layer ``l``:

1. :meth:`AsyncEmbeddingPush.prepare` (before the forward pass): if ``k >= d``, finish the
   exchange started at ``k - d`` and store what arrived in ``HEC[l]``; then look up this
   batch's halo leaves of block ``l``. Misses lose their edges (``Block.drop_sources``).
   Layer 0 reads replicated halo features instead when the partition has them.
2. :meth:`AsyncEmbeddingPush.push` (during the forward pass, once layer ``l``'s input is
   known): if ``k < M - d``, take block ``l``'s solid sources that some peer holds as halo
   (``send_lists``), keep at most ``nc`` per peer (sampled without replacement with
   probability proportional to in-degree), and start the non-blocking all-to-all-v of their
   ``VID_o`` and detached layer-``l`` inputs.
3. :meth:`AsyncEmbeddingPush.end_iteration`: every cache's ages advance by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from distmb.comm import Communicator, EmbeddingPush
from distmb.data.graph import csr_row_positions
from distmb.data.store import PartitionStore
from distmb.hec import LIFESPAN_UNBOUNDED, HistoricalEmbeddingCache
from distmb.sampling import Block

#: Paper defaults (DESIGN.md): lines per layer, rows per peer, life-span, delay.
DEFAULT_HEC_SIZE = 1_000_000
DEFAULT_HEC_NC = 2000
DEFAULT_HEC_LIFESPAN = 2
DEFAULT_HEC_DELAY = 1


@dataclass
class HecConfig:
    """``--hec-*`` flags. ``enabled=False`` (``--no-hec``) drops every halo leaf."""

    enabled: bool = True
    size: int = DEFAULT_HEC_SIZE
    nc: int = DEFAULT_HEC_NC
    lifespan: int = DEFAULT_HEC_LIFESPAN
    delay: int = DEFAULT_HEC_DELAY


class AsyncEmbeddingPush:
    """The AEP state of one rank: one cache and one push queue per layer that needs them.

    Args:
        comm: the ranks.
        store: this rank's part (send lists, ``orig_ids``, ``in_degree``, halo features).
        layer_dims: input width of every layer (``model.layer_dims()``).
        config: cache size, push cap, life-span, delay.
        seed: seed of the degree-weighted push sampling.
    """

    def __init__(
        self,
        comm: Communicator,
        store: PartitionStore,
        layer_dims: list[int],
        config: HecConfig,
        seed: int,
    ) -> None:
        self.comm = comm
        self.cfg = config
        self.seed = seed
        self.n_solid = store.n_solid
        self.orig_ids = np.asarray(store.orig_ids)
        self.halo_features = store.halo_features
        self.degree = np.asarray(store.in_degree[: store.n_solid], dtype=np.float64)
        self.peer_ptr, self.peer_ids = _peers_of_solid(store, comm.size)
        self.num_layers = len(layer_dims)
        self.layer_dims = list(layer_dims)
        # Layer 0 needs no cache when halo features are replicated.
        self.uses_cache = [
            config.enabled and not (layer == 0 and self.halo_features is not None)
            for layer in range(self.num_layers)
        ]
        self.caches: list[HistoricalEmbeddingCache | None] = [
            HistoricalEmbeddingCache(
                config.size, dim, LIFESPAN_UNBOUNDED if layer == 0 else config.lifespan
            )
            if self.uses_cache[layer]
            else None
            for layer, dim in enumerate(layer_dims)
        ]
        self.pushes: list[EmbeddingPush | None] = [
            EmbeddingPush(comm, dim, config.delay) if self.uses_cache[layer] else None
            for layer, dim in enumerate(layer_dims)
        ]
        self.epoch = 0
        #: Halo rows the batches needed per layer from other ranks: the traffic of an exact
        #: pull (layer 0 counted even when replicated features make it free here).
        self.rows_needed = [0] * self.num_layers
        #: Optional recorder for tests: receives ("push"|"load", k, layer, tags, rows, hit).
        self.record = None

    # -- before the forward pass -----------------------------------------------------------
    def prepare(
        self, blocks: list[Block], k: int, num_iters: int
    ) -> tuple[list[Block], list[torch.Tensor]]:
        """Receive and store delayed pushes, then load every block's halo leaves.

        Returns:
            The blocks (halo leaves that missed lose their edges) and, per layer,
            float32[n_halo, dim] halo input rows (zeros for misses).
        """
        out_blocks, halo_rows = [], []
        for layer, block in enumerate(blocks):
            push = self.pushes[layer]
            if push is not None and k >= self.cfg.delay:
                tags, rows = push.finish()
                self.caches[layer].store(tags, rows)
            halo_p = block.src_ids[block.n_computed :].numpy()
            dim = self.layer_dims[layer]
            self.rows_needed[layer] += block.n_halo  # what an exact pull would move
            if block.n_halo == 0:
                out_blocks.append(block)
                halo_rows.append(torch.empty((0, dim)))
            elif layer == 0 and self.halo_features is not None:
                out_blocks.append(block)
                idx = halo_p - self.n_solid
                halo_rows.append(torch.from_numpy(np.take(self.halo_features, idx, axis=0)))
            elif self.caches[layer] is None:  # --no-hec: drop every halo leaf
                keep = torch.ones(block.n_src, dtype=torch.bool)
                keep[block.n_computed :] = False
                out_blocks.append(block.drop_sources(keep))
                halo_rows.append(torch.zeros((block.n_halo, dim)))
            else:
                tags = self.orig_ids[halo_p]
                full = torch.empty((block.n_halo, dim))
                hit = self.caches[layer].lookup_into(tags, full)  # misses come back as zeros
                if self.record is not None:
                    self.record("load", k, layer, tags, full.numpy().copy(), hit.numpy().copy())
                if bool(hit.all()):
                    out_blocks.append(block)
                else:
                    keep = torch.ones(block.n_src, dtype=torch.bool)
                    keep[block.n_computed :] = hit
                    out_blocks.append(block.drop_sources(keep))
                halo_rows.append(full)
        return out_blocks, halo_rows

    # -- during the forward pass -----------------------------------------------------------
    def push(
        self, layer: int, block: Block, x_computed: torch.Tensor, k: int, num_iters: int
    ) -> None:
        """Start pushing this batch's boundary rows of layer ``layer`` to the peers.

        Args:
            x_computed: float32[block.n_computed, dim], the layer's input rows of the
                block's solid sources (detached here).
        """
        push = self.pushes[layer]
        if push is None or k >= num_iters - self.cfg.delay:
            return
        solid = block.src_ids[: block.n_computed].numpy()
        counts_per_src = self.peer_ptr[solid + 1] - self.peer_ptr[solid]
        pos = np.repeat(np.arange(solid.size), counts_per_src)
        peer = self.peer_ids[csr_row_positions(self.peer_ptr[solid], counts_per_src)]
        chosen_pos, counts = self._cap_per_peer(pos, peer, solid, k, layer)
        rows = x_computed.detach()[torch.from_numpy(chosen_pos)].numpy()
        tags = self.orig_ids[solid[chosen_pos]]
        if self.record is not None:
            self.record("push", k, layer, tags, rows.copy(), counts.copy())
        push.start(counts, tags, rows)

    def _cap_per_peer(
        self, pos: np.ndarray, peer: np.ndarray, solid: np.ndarray, k: int, layer: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Group candidates by peer; keep at most ``nc`` per peer, drawn without replacement
        with probability proportional to in-degree (Efraimidis-Spirakis keys)."""
        order = np.argsort(peer, kind="stable")
        pos, peer = pos[order], peer[order]
        counts = np.bincount(peer, minlength=self.comm.size).astype(np.int64)
        nc = self.cfg.nc
        if counts.max(initial=0) <= nc:
            return pos, counts
        rng = np.random.default_rng([self.seed, self.epoch, k, layer, self.comm.rank])
        keep = []
        bounds = np.concatenate([[0], np.cumsum(counts)])
        for j in range(self.comm.size):
            group = pos[bounds[j] : bounds[j + 1]]
            if group.size > nc:
                weight = np.maximum(self.degree[solid[group]], 1.0)
                keys = np.log(rng.random(group.size)) / weight
                group = np.sort(group[np.argpartition(-keys, nc - 1)[:nc]])
                counts[j] = nc
            keep.append(group)
        return np.concatenate(keep), counts

    def end_iteration(self) -> None:
        """Ages advance once per iteration."""
        for cache in self.caches:
            if cache is not None:
                cache.advance()

    # -- checkpointing ----------------------------------------------------------------------
    def cache_state(self) -> dict[str, np.ndarray]:
        """The valid lines of every cache, as ``layer{l}_tags`` / ``_ages`` / ``_rows`` arrays
        (see :meth:`HistoricalEmbeddingCache.state`). Taken between epochs, when no push is
        in flight (pushes stop ``d`` iterations before the end of an epoch)."""
        out: dict[str, np.ndarray] = {}
        for layer, cache in enumerate(self.caches):
            if cache is not None:
                for key, value in cache.state().items():
                    out[f"layer{layer}_{key}"] = value
        return out

    def cache_keys(self) -> set[str]:
        """The array names :meth:`cache_state` returns for this rank's caches."""
        return {
            f"layer{layer}_{key}"
            for layer, cache in enumerate(self.caches)
            if cache is not None
            for key in ("tags", "ages", "rows")
        }

    def restore_caches(self, arrays: dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`cache_state`.

        Raises:
            ValueError: the arrays do not hold exactly this rank's caches (other layers, or
                rows of another width or dtype: :meth:`HistoricalEmbeddingCache.store`).
        """
        expected = self.cache_keys()
        if set(arrays) != expected:
            raise ValueError(f"cache state holds {sorted(arrays)}, expected {sorted(expected)}")
        for layer, cache in enumerate(self.caches):
            if cache is not None:
                cache.restore(
                    {key: arrays[f"layer{layer}_{key}"] for key in ("tags", "ages", "rows")}
                )

    # -- statistics ------------------------------------------------------------------------
    def stats(self) -> dict[str, list[float]]:
        """Per layer: lookups, hits, rows and bytes pushed, communication wait (seconds)."""
        out: dict[str, list[float]] = {
            k: [] for k in ("lookups", "hits", "rows_pushed", "bytes_pushed", "comm_wait")
        }
        out["bytes_needed"] = [
            n * (8 + 4 * dim) for n, dim in zip(self.rows_needed, self.layer_dims, strict=True)
        ]
        for cache, push in zip(self.caches, self.pushes, strict=True):
            c = cache.counters() if cache is not None else {"lookups": 0, "hits": 0}
            out["lookups"].append(c["lookups"])
            out["hits"].append(c["hits"])
            s = push.stats if push is not None else None
            out["rows_pushed"].append(s.rows_sent if s else 0)
            out["bytes_pushed"].append(s.bytes_sent if s else 0)
            out["comm_wait"].append(s.wait_s if s else 0.0)
        return out

    def reset_stats(self) -> None:
        self.rows_needed = [0] * self.num_layers
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
