"""Multi-rank training: one rank per part, data-parallel model, HEC + AEP for halo rows.

Data path per iteration (every rank, same order of collectives):
sample (local part) -> gather solid features -> AEP.prepare (finish delayed pushes, store in
HEC, load halo leaves) -> forward layer by layer (AEP.push of each layer's input) -> loss ->
backward -> gradient all-reduce -> optimizer step -> HEC ages advance.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distmb.aep import AsyncEmbeddingPush, HecConfig
from distmb.checkpoint import (
    load_cache_state,
    remove_cache_states,
    save_cache_state,
    save_checkpoint,
)
from distmb.comm import Communicator
from distmb.data.local import LocalGraph
from distmb.data.store import PartitionStore, read_meta
from distmb.errors import InputError, PartitionError
from distmb.evaluate import correct_counts, layerwise_inference
from distmb.exact import ExactBatchSampler
from distmb.sampling import Block
from distmb.trainer import TrainConfig, Trainer, append_jsonl, format_epoch, split_batches


class DistributedTrainer(Trainer):
    """:class:`Trainer` for one rank of ``comm``, training on part ``comm.rank``."""

    def __init__(
        self,
        comm: Communicator,
        store: PartitionStore,
        config: TrainConfig,
        hec: HecConfig,
        *,
        exact_remote: bool = False,
        log=print,
    ) -> None:
        self.comm = comm
        self.rank = comm.rank
        self.num_ranks = comm.size
        self.store = store
        local = LocalGraph.from_store(store)
        super().__init__(local, config, grad_sync=comm.allreduce_gradients, log=log)
        if exact_remote:  # no halo leaves: no caches, no pushes
            hec = dataclasses.replace(hec, enabled=False)
        self.aep = AsyncEmbeddingPush(comm, store, self.model.layer_dims(), hec, config.seed)
        #: ``--exact-remote``: DistDGL-like exact batches (no halo leaves, no cache).
        self.exact = (
            ExactBatchSampler(comm, store, self.sampler, config.fanout) if exact_remote else None
        )
        if config.resume:
            self._restore_caches()

    # -- iterations --------------------------------------------------------------------------
    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """The same number M of batches on every rank: ``M = max over ranks of
        ceil(n_train / batch_size)`` (``Allreduce MAX``), and each rank splits its shuffled
        training vertices into M batches whose sizes differ by at most one. Every training
        vertex is seen once per epoch and no batch exceeds ``--batch-size``; a rank with
        fewer than M training vertices repeats them, one per batch, so no batch is empty.

        Also records the global batch sizes (``Allreduce SUM``) for :meth:`loss_weight`."""
        order = self.shuffled_train(epoch)
        num_iters = int(self.comm.allreduce_max(-(-order.size // self.cfg.batch_size)))
        batches = split_batches(order, num_iters)
        sizes = np.array([b.size for b in batches], dtype=np.int64)
        self._global_batch = self.comm.allreduce_sum(sizes)
        return batches

    def loss_weight(self, iteration: int, batch_size: int) -> float:
        """``P / global batch size``: after the gradient all-reduce averages over the P ranks,
        every seed of the global batch has the same weight, whatever its rank's share."""
        return self.comm.size / float(self._global_batch[iteration])

    def sample_batch(
        self, seeds: np.ndarray, epoch: int, iteration: int
    ) -> tuple[list[Block], torch.Tensor]:
        if self.exact is not None:
            return self.exact.sample(seeds, epoch, iteration)
        return super().sample_batch(seeds, epoch, iteration)

    def forward_batch(
        self, blocks: list[Block], x: torch.Tensor, epoch: int, iteration: int, num_iters: int
    ) -> torch.Tensor:
        if self.exact is not None:  # whole computation graph is local: no halo leaves
            return self.model(blocks, x)
        self.aep.epoch = epoch
        blocks, halo_rows = self.aep.prepare(blocks, iteration, num_iters)
        h = x
        for layer, block in enumerate(blocks):
            self.aep.push(layer, block, h, iteration, num_iters)
            x_src = torch.cat([h, halo_rows[layer]]) if block.n_halo else h
            h = self.model.forward_layer(layer, block, x_src)
        self.aep.end_iteration()
        return h

    # -- exact evaluation --------------------------------------------------------------------
    def _halo_rows(self, layer: int, h_solid: np.ndarray | torch.Tensor) -> np.ndarray:
        """Halo input rows of ``layer`` for exact evaluation: replicated features at layer 0
        when the partition has them, else one synchronous halo exchange."""
        store = self.store
        if layer == 0 and store.halo_features is not None:
            return np.asarray(store.halo_features)
        rows = h_solid if isinstance(h_solid, np.ndarray) else h_solid.numpy()
        return self.comm.halo_exchange(
            rows, store.send_ptr, store.send_ids, np.asarray(store.halo_owner)
        )

    def evaluate(self) -> dict[str, float]:
        """Layer-wise full-neighbour inference over every part, with one synchronous halo
        exchange per layer; accuracies are summed over ranks."""
        start = time.perf_counter()
        logits = layerwise_inference(
            self.model, self.local, self.sampler, self.cfg.eval_batch_size, self._halo_rows
        )
        labels = self.local.labels
        counts = np.array(
            [
                *correct_counts(logits, labels, self.local.val_idx),
                *correct_counts(logits, labels, self.local.test_idx),
            ],
            dtype=np.int64,
        )
        total = self.comm.allreduce_sum(counts)
        return {
            "val_acc": float(total[0] / total[1]) if total[1] else float("nan"),
            "test_acc": float(total[2] / total[3]) if total[3] else float("nan"),
            "eval_time": round(time.perf_counter() - start, 4),
        }

    # -- epochs, statistics, checkpoints -----------------------------------------------------
    def fit(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        for epoch in range(self.start_epoch, cfg.epochs):
            self.aep.reset_stats()
            if self.exact is not None:
                self.exact.reset_stats()
            record = self.train_epoch(epoch)
            record.update(self._global_stats(record))
            if (epoch + 1) % cfg.eval_every == 0 or epoch == cfg.epochs - 1:
                record.update(self.evaluate())
            self.history.append(record)
            if self.rank == 0:
                self.log(format_epoch(record) + format_hec(record))
                if cfg.results:
                    append_jsonl(
                        cfg.results,
                        {
                            **record,
                            "model": cfg.model,
                            "ranks": self.comm.size,
                            "dataset": self.local.identity["graph_name"],
                        },
                    )
            if cfg.checkpoint_dir:
                self._save(epoch)
        return self.history

    def _global_stats(self, record: dict[str, Any]) -> dict[str, Any]:
        """Cross-rank view of the epoch: loss averaged, phases at their maximum, load
        imbalance, HEC hit rates and traffic summed."""
        stats = self.aep.stats()
        local = np.array(
            [
                record["loss"],
                record["train_acc"],
                *stats["lookups"],
                *stats["hits"],
                *stats["rows_pushed"],
                *stats["bytes_pushed"],
                *stats["bytes_needed"],
                self.exact.bytes_sent if self.exact is not None else 0,
            ],
            dtype=np.float64,
        )
        total = self.comm.allreduce_sum(local)
        n_layers = len(stats["lookups"])
        lookups = total[2 : 2 + n_layers]
        hits = total[2 + n_layers : 2 + 2 * n_layers]
        rows = total[2 + 2 * n_layers : 2 + 3 * n_layers]
        nbytes = total[2 + 3 * n_layers : 2 + 4 * n_layers]
        needed = total[2 + 4 * n_layers : 2 + 5 * n_layers]
        out = {
            "loss": float(total[0] / self.comm.size),
            "train_acc": float(total[1] / self.comm.size),
            "hec_hit_rate": [
                float(h / lk) if lk else None for h, lk in zip(hits, lookups, strict=True)
            ],
            "rows_pushed": [int(r) for r in rows],
            "bytes_pushed": int(nbytes.sum()),
            "bytes_exact_pull": [int(b) for b in needed],
            "bytes_exact_remote": int(total[-1]),
            "comm_wait": round(self.comm.allreduce_max(sum(stats["comm_wait"])), 4),
            "imbalance": round(
                self.comm.allreduce_max(record["epoch_time"])
                / max(self.comm.allreduce_min(record["epoch_time"]), 1e-9),
                3,
            ),
        }
        for phase in ("epoch_time", "mbc", "fwd", "bwd", "ared", "opt"):
            out[phase] = round(self.comm.allreduce_max(record[phase]), 4)
        return out

    def _save(self, epoch: int) -> None:
        """Every rank writes its cache lines for ``epoch``; then rank 0 writes the checkpoint
        (model, optimizer, every rank's RNG state) that names ``epoch``; then the ranks drop
        their older cache files. A crash at any point leaves a checkpoint whose cache files
        exist (or, between the first two steps, an older checkpoint with its own files)."""
        directory = self.cfg.checkpoint_dir
        save_cache_state(directory, epoch, self.rank, self.aep.cache_state())
        states = self.comm.allgather(torch.get_rng_state())  # also: every cache file is written
        if self.rank == 0:
            state = self._state(epoch)
            state["torch_rng_per_rank"] = states
            save_checkpoint(directory, state)
        self.comm.barrier()  # nobody runs ahead of a checkpoint that is still being written
        remove_cache_states(directory, self.rank, keep_epoch=epoch)

    def _restore_caches(self) -> None:
        """Refill the caches as they were after the resumed epoch, so a resumed run repeats an
        uninterrupted one exactly. When some rank has no file, or the saved caches are not
        this run's (``--no-hec`` or ``--exact-remote`` changed between the runs), all ranks
        start with empty caches, which refill within ``d + ls`` iterations."""
        arrays = load_cache_state(self.cfg.checkpoint_dir, self.start_epoch - 1, self.rank)
        usable = arrays is not None and set(arrays) == self.aep.cache_keys()
        if self.comm.allreduce_min(1.0 if usable else 0.0) == 1.0:
            self.aep.restore_caches(arrays)
        elif self.rank == 0:
            self.log(
                "resume: the checkpoint holds no matching HEC state for every rank; "
                "caches start empty"
            )


def format_hec(r: dict[str, Any]) -> str:
    """The multi-rank part of the epoch line: HEC hit rates, traffic, wait, imbalance."""
    rates = "/".join("-" if h is None else f"{100 * h:.0f}%" for h in r["hec_hit_rate"])
    if r.get("bytes_exact_remote"):
        traffic = f"exact remote {r['bytes_exact_remote'] / 2**20:.1f} MiB"
    else:
        traffic = f"HEC hit {rates}  pushed {r['bytes_pushed'] / 2**20:.1f} MiB"
    return f"  |  {traffic}  wait {r['comm_wait']:.2f}s  imbalance {r['imbalance']:.2f}"


def open_part(comm: Communicator, part_dir: str) -> PartitionStore:
    """Open part ``rank`` of ``part_dir`` on every rank, after checking on every rank that
    the partition has one part per rank and that all ranks see the same graph."""
    num_parts = int(read_meta(part_dir)["num_parts"])  # every rank reads the same file
    if num_parts != comm.size:
        raise PartitionError(
            f"--part-dir {part_dir} has {num_parts} parts but {comm.size} ranks run; "
            f"use mpirun -np {num_parts}"
        )
    store = PartitionStore(part_dir, comm.rank)
    mine = (store.meta["graph_sha256"], store.num_parts, store.meta["partitioner"].get("seed"))
    everyone = comm.allgather(mine)
    odd = [r for r, other in enumerate(everyone) if other != everyone[0]]
    if odd:
        raise PartitionError(
            f"--part-dir {part_dir}: rank(s) {odd} opened a partition of another graph or "
            f"partitioning than rank 0 (graph sha256 {everyone[0][0][:12]}...)"
        )
    train_counts = comm.allgather(int(store.counts["n_train"]))
    empty = [r for r, n in enumerate(train_counts) if n == 0]
    if empty:
        raise PartitionError(
            f"--part-dir {part_dir}: part(s) {empty} have no training vertices; use fewer ranks"
        )
    return store


def partition_cache_dir(cache_root: str, spec: str, parts: int, seed: int) -> Path:
    """Where ``--dataset SPEC`` is partitioned for ``parts`` ranks."""
    key = hashlib.sha256(f"{spec}|{parts}|{seed}".encode()).hexdigest()[:16]
    name = "".join(c if c.isalnum() else "-" for c in spec.split(":")[0])
    return Path(cache_root) / f"{name}-p{parts}-{key}"


def ensure_partition(comm: Communicator, spec: str, cache_root: str, seed: int, log) -> str:
    """Rank 0 partitions ``spec`` into the cache (unless already there); the others wait.
    An error on rank 0 is re-raised on every rank, so nobody waits forever."""
    out = partition_cache_dir(cache_root, spec, comm.size, seed)
    error = None
    if comm.rank == 0 and not (out / "partition.json").is_file():
        try:
            from distmb.data import load_dataset
            from partition import partition_graph

            graph = load_dataset(spec, seed=seed)
            log(f"partitioning {graph.summary()} into {comm.size} parts at {out}")
            partition_graph(
                graph, comm.size, out, seed=seed, replicate_halo_features=True, overwrite=True
            )
        except Exception as exc:  # noqa: BLE001 - forwarded to every rank below
            error = f"{type(exc).__name__}: {exc}"
    error = comm.comm.bcast(error, root=0)
    if error is not None:
        raise InputError(f"--dataset {spec}: partitioning on rank 0 failed: {error}")
    return str(out)


def is_mpi_launch() -> bool:
    """Whether this process was started by an MPI launcher (mpirun, mpiexec, srun)."""
    import os

    markers = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
    return any(m in os.environ for m in markers)
