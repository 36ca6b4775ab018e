"""The mini-batch training loop of one rank: sample -> gather -> forward -> backward ->
(all-reduce) -> step, with exact evaluation, checkpoints and a JSON record per epoch."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from distmb.checkpoint import load_checkpoint, save_checkpoint
from distmb.data.local import LocalGraph
from distmb.errors import DistmbError, InputError
from distmb.evaluate import accuracy, gather_rows, layerwise_inference
from distmb.nn import build_model
from distmb.nn.backend import set_kernels
from distmb.sampling import Block, NeighborSampler
from distmb.timers import PhaseTimer


class TrainingDiverged(DistmbError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""

    exit_code = 3


@dataclass
class TrainConfig:
    """Hyper-parameters and run options (the flags of ``python -m distmb.train``)."""

    model: str = "sage"
    layers: int = 3
    hidden: int = 256
    heads: int = 4
    fanout: tuple[int, ...] = (5, 10, 15)
    aggr: str = "mean"
    batch_size: int = 1000
    lr: float = 0.003
    weight_decay: float = 0.0
    dropout: float = 0.5
    epochs: int = 40
    seed: int = 0
    eval_every: int = 1
    eval_batch_size: int = 4096
    checkpoint_dir: str | None = None
    resume: bool = False
    results: str | None = None
    progress: bool = True
    kernels: str = "fused"

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


class Trainer:
    """Trains one model on one rank's :class:`LocalGraph`.

    Args:
        local: the graph this rank samples from.
        config: hyper-parameters.
        grad_sync: called after backward with the model, before the optimizer step
            (the multi-rank trainer all-reduces gradients here; single rank: nothing).
        log: prints one line (rank 0 only in multi-rank runs).
    """

    #: This rank's index and the number of ranks (the distributed trainer sets both before
    #: initialising).
    rank: int = 0
    num_ranks: int = 1

    def __init__(
        self,
        local: LocalGraph,
        config: TrainConfig,
        *,
        grad_sync: Callable[[torch.nn.Module], None] | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.local = local
        self.cfg = config
        self.grad_sync = grad_sync
        self.log = log
        set_kernels(config.kernels)
        torch.manual_seed(config.seed)  # identical model initialisation on every rank
        self.model = build_model(
            config.model,
            in_dim=local.feat_dim,
            hidden=config.hidden,
            num_classes=local.num_classes,
            num_layers=config.layers,
            heads=config.heads,
            dropout=config.dropout,
            aggr=config.aggr,
        )
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        self.sampler = NeighborSampler(
            local.indptr, local.indices, local.n_solid, local.n_local, config.fanout, config.seed
        )
        torch.manual_seed(dropout_seed(config.seed, self.rank))
        self.timer = PhaseTimer()
        self.start_epoch = 0
        self.history: list[dict[str, Any]] = []
        if config.resume:
            self._resume()

    # -- checkpoints -------------------------------------------------------------------------
    def _state(self, epoch: int) -> dict[str, Any]:
        return {
            "epoch": epoch,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "args": self.cfg.as_dict(),
            "identity": self.local.identity,
            "ranks": self.num_ranks,
        }

    def _resume(self) -> None:
        if not self.cfg.checkpoint_dir:
            raise InputError("--resume needs --checkpoint-dir")
        state = load_checkpoint(
            self.cfg.checkpoint_dir, identity=self.local.identity, args=self.cfg.as_dict()
        )
        saved_ranks = state.get("ranks", 1)
        if saved_ranks != self.num_ranks:
            raise InputError(
                f"--resume: the checkpoint in {self.cfg.checkpoint_dir} was written by "
                f"{saved_ranks} ranks, this run has {self.num_ranks}"
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        rng_states = state.get("torch_rng_per_rank", [state["torch_rng"]])
        torch.set_rng_state(rng_states[self.rank])
        self.start_epoch = int(state["epoch"]) + 1
        if self.rank == 0:
            self.log(f"resumed from {self.cfg.checkpoint_dir} after epoch {state['epoch']}")

    # -- one epoch ---------------------------------------------------------------------------
    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """The epoch's seed batches: the training vertices shuffled by (seed, epoch) and split
        into ``ceil(n_train / batch_size)`` batches whose sizes differ by at most one (no
        ragged last batch)."""
        order = self.shuffled_train(epoch)
        return split_batches(order, -(-order.size // self.cfg.batch_size))

    def shuffled_train(self, epoch: int) -> np.ndarray:
        """int64[n_train]: this rank's training vertices in the epoch's order."""
        rng = np.random.default_rng([self.cfg.seed, epoch])
        return self.local.train_idx[rng.permutation(self.local.train_idx.size)]

    def train_epoch(self, epoch: int) -> dict[str, Any]:
        """One pass over the training vertices; returns loss, accuracy and timings."""
        self.model.train()
        self.timer.reset()
        batches = self.epoch_batches(epoch)
        labels = self.local.labels
        total_loss, correct, seen = 0.0, 0, 0
        bar = tqdm(
            total=len(batches),
            desc=f"epoch {epoch}",
            leave=False,
            file=sys.stderr,
            disable=not (self.cfg.progress and sys.stderr.isatty() and self.rank == 0),
        )
        start = time.perf_counter()
        for it, seeds in enumerate(batches):
            with self.timer("mbc"):
                blocks, x = self.sample_batch(seeds, epoch, it)
                y = torch.from_numpy(labels[seeds])
            with self.timer("fwd"):
                logits = self.forward_batch(blocks, x, epoch, it, len(batches))
                loss_sum = F.cross_entropy(logits, y, reduction="sum")
                loss = loss_sum * self.loss_weight(it, seeds.size)
            loss_value = loss_sum.item() / max(seeds.size, 1)
            if not math.isfinite(loss_value):
                kept = (
                    f"; the last good checkpoint is kept in {self.cfg.checkpoint_dir}"
                    if self.cfg.checkpoint_dir
                    else ""
                )
                raise TrainingDiverged(
                    f"loss is {loss_value} at epoch {epoch}, iteration {it}{kept}; try a lower --lr"
                )
            with self.timer("bwd"):
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
            with self.timer("ared"):
                if self.grad_sync is not None:
                    self.grad_sync(self.model)
            with self.timer("opt"):
                self.optimizer.step()
            total_loss += loss_value * seeds.size
            correct += int((logits.argmax(1) == y).sum())
            seen += seeds.size
            bar.update()
            bar.set_postfix(loss=f"{loss_value:.4f}")
        bar.close()
        train_time = time.perf_counter() - start
        return {
            "epoch": epoch,
            "iterations": len(batches),
            "loss": total_loss / max(seen, 1),
            "train_acc": correct / max(seen, 1),
            "epoch_time": round(train_time, 4),
            **self.timer.as_dict(),
            "samples_per_s": round(seen / train_time, 1) if train_time > 0 else 0.0,
        }

    def sample_batch(
        self, seeds: np.ndarray, epoch: int, iteration: int
    ) -> tuple[list[Block], torch.Tensor]:
        """The batch's blocks and float32[blocks[0].n_computed, F], the input features of
        block 0's computed (solid) sources."""
        blocks = self.sampler.sample(seeds, epoch, iteration)
        x = gather_rows(self.local.features, blocks[0].src_ids[: blocks[0].n_computed])
        return blocks, x

    def loss_weight(self, iteration: int, batch_size: int) -> float:
        """Factor from the batch's summed loss to the loss that is back-propagated: here the
        mean over the batch (``1 / batch_size``)."""
        return 1.0 / max(batch_size, 1)

    def forward_batch(
        self, blocks: list[Block], x: torch.Tensor, epoch: int, iteration: int, num_iters: int
    ) -> torch.Tensor:
        """Logits of the seeds. ``x`` holds the input features of block 0's computed
        (solid) sources; on one rank there are no halo sources."""
        return self.model(blocks, x)

    def evaluate(self) -> dict[str, float]:
        """Exact val/test accuracy (layer-wise full-neighbour inference)."""
        start = time.perf_counter()
        logits = layerwise_inference(self.model, self.local, self.sampler, self.cfg.eval_batch_size)
        return {
            "val_acc": accuracy(logits, self.local.labels, self.local.val_idx),
            "test_acc": accuracy(logits, self.local.labels, self.local.test_idx),
            "eval_time": round(time.perf_counter() - start, 4),
        }

    # -- the run -----------------------------------------------------------------------------
    def fit(self) -> list[dict[str, Any]]:
        """Train from ``start_epoch`` to ``epochs``; returns the per-epoch records."""
        cfg = self.cfg
        for epoch in range(self.start_epoch, cfg.epochs):
            record = self.train_epoch(epoch)
            if (epoch + 1) % cfg.eval_every == 0 or epoch == cfg.epochs - 1:
                record.update(self.evaluate())
            self.history.append(record)
            self.log(format_epoch(record))
            if cfg.results:
                append_jsonl(
                    cfg.results,
                    {**record, "model": cfg.model, "dataset": self.local.identity["graph_name"]},
                )
            if cfg.checkpoint_dir:
                save_checkpoint(cfg.checkpoint_dir, self._state(epoch))
        return self.history


def split_batches(order: np.ndarray, num_batches: int) -> list[np.ndarray]:
    """Split ``order`` into ``num_batches`` consecutive batches whose sizes differ by at most
    one. With fewer vertices than batches, batch ``i`` is ``order[i % n]`` alone, so no batch
    is ever empty (a rank must not skip an iteration's collectives)."""
    if order.size == 0:
        raise ValueError("split_batches: no training vertices")
    if order.size >= num_batches:
        return np.array_split(order, num_batches)
    return [order[i % order.size : i % order.size + 1] for i in range(num_batches)]


def dropout_seed(seed: int, rank: int) -> int:
    """Seed of the dropout RNG of ``rank`` (ranks draw different masks; reproducible)."""
    return (seed * 1_000_003 + rank * 7_919 + 1) % (2**63)


def format_epoch(r: dict[str, Any]) -> str:
    """One line per epoch: loss, accuracies, time and its MBC/FWD/BWD/ARed split."""
    acc = f"train {100 * r['train_acc']:.2f}%"
    if "val_acc" in r:
        acc += f"  val {100 * r['val_acc']:.2f}%  test {100 * r['test_acc']:.2f}%"
    return (
        f"epoch {r['epoch']:3d}  loss {r['loss']:.4f}  {acc}  |  {r['epoch_time']:.2f}s "
        f"(MBC {r['mbc']:.2f}  FWD {r['fwd']:.2f}  BWD {r['bwd']:.2f}  ARed {r['ared']:.2f})  "
        f"{r['samples_per_s']:.0f} samples/s"
    )


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append one JSON object as one line (a single write, flushed)."""
    line = json.dumps(record, allow_nan=True) + "\n"
    with open(path, "a") as f:
        f.write(line)
        f.flush()
