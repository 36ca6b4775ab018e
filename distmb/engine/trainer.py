"""The mini-batch training loop of one rank, for one rank and many:

BatchLoader (plan -> sample -> gather, ahead on a thread) -> MiniBatch -> halo scheme (fill
the halo leaves) -> model (one layer loop, the scheme's per-layer hook) -> loss -> backward
-> gradient all-reduce -> optimizer step -> halo scheme's end of iteration; exact
evaluation, checkpoints and a JSON record per epoch. With ``--cuda-graphs`` (one rank) the
forward, loss, backward and optimizer step are one :class:`~distmb.engine.graphed_step.
GraphedStep` over padded static buffers: one CUDA graph replay per iteration on a GPU.

Every rank calls the same collectives in the same order: the epoch's batch count and
global batch sizes (two all-reduces), per iteration the halo scheme's exchanges and the
gradient all-reduce, per epoch the statistics, the evaluation's halo exchanges and the
checkpoint's gather and barrier. One rank is P = 1 (:class:`SingleProcess`): every
collective is the identity and the halo scheme has nothing to do.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from distmb.comm import RankGroup
from distmb.config.train import RESUME_APPLIED, TrainConfig, flag_of
from distmb.core.dirlock import release_directory
from distmb.core.errors import InputError
from distmb.core.progress import ProgressSettings, meter
from distmb.data.local import LocalGraph
from distmb.engine.build.run import build_run
from distmb.engine.checkpoint import (
    BEST_FILE,
    load_cache_state,
    load_checkpoint,
    remove_cache_states,
    save_cache_state,
    save_checkpoint,
)
from distmb.engine.compiled import compiled_forward_for
from distmb.engine.epoch_loss import EpochLoss
from distmb.engine.evaluate import layerwise_inference, split_accuracies
from distmb.engine.graphed_step import graphed_step_for
from distmb.engine.schedule import SCHEDULER_KEY, build_scheduler, restore_schedule
from distmb.engine.selection import SELECTION_KEY, ModelSelection
from distmb.engine.stats import (
    append_jsonl,
    drop_records_from,
    format_epoch,
    format_feature_cache,
    format_hec,
    global_stats,
    rank_records,
)
from distmb.engine.tensorboard import TensorBoardLog
from distmb.engine.timers import PHASES, SECONDS_DIGITS, PhaseTimer
from distmb.engine.work import BlockWork
from distmb.halo.scheme import HaloScheme
from distmb.pipeline.minibatch import MiniBatch
from distmb.pipeline.plan import shuffled, split_batches

#: Multiplier and rank stride of :func:`dropout_seed` (two primes: seeds of different runs
#: and ranks do not collide for any realistic seed or rank count).
DROPOUT_SEED_MULTIPLIER = 1_000_003
DROPOUT_SEED_RANK_STRIDE = 7_919
#: Dropout seeds stay in the non-negative int64 range ``torch.manual_seed`` accepts.
SEED_MODULUS = 2**63


class Trainer:
    """Trains one model on one rank's :class:`LocalGraph`: the loop over the parts
    :func:`~distmb.engine.build.run.build_run` built.

    Args:
        local: the graph this rank samples from (a whole graph, or one part).
        config: the run's configuration (:class:`distmb.config.train.TrainConfig`).
        comm: the ranks (default: :class:`SingleProcess`, one rank without MPI).
        halo: what to do about halo leaves (default: nothing, one rank;
            :func:`distmb.engine.build.make_halo_scheme` picks one for P > 1).
        log: prints one line (rank 0 only in multi-rank runs).
        model: your own model instead of ``config.model``'s (the contract:
            :mod:`distmb.nn.user`, docs/api.md; checked here on a tiny mini-batch). Build
            it identically on every rank (e.g. after ``torch.manual_seed``).
        optimizer: your own optimizer over the model's parameters (default: Adam with
            ``config.lr`` and ``config.weight_decay``).
        device: the training device, when the caller resolved it already
            (:func:`distmb.engine.device.training_device`); default: ``config.device``.
    """

    def __init__(
        self,
        local: LocalGraph,
        config: TrainConfig,
        *,
        comm: RankGroup | None = None,
        halo: HaloScheme | None = None,
        log: Callable[[str], None] = print,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        device: torch.device | None = None,
    ) -> None:
        parts = build_run(
            local,
            config,
            comm=comm,
            halo=halo,
            log=log,
            model=model,
            optimizer=optimizer,
            device=device,
        )
        #: Everything the run is made of (:class:`RunParts`); the most used are below.
        self.parts = parts
        self.local = local
        self.cfg = config
        self.log = log
        self.comm = parts.comm
        self.rank = self.comm.rank
        self.num_ranks = self.comm.size
        self.device = parts.device
        self.precision = parts.precision
        self.model = parts.model
        self.optimizer = parts.optimizer
        self.model_spec = parts.model_spec
        self.normalization = parts.normalization
        self.feature_sources = parts.feature_sources
        #: The host feature source of training, by ``VID_p``.
        self.features = parts.feature_sources.train
        self.sampler = parts.sampler
        self.halo = parts.halo
        self.loader = parts.loader
        self.eval_table = parts.eval_table
        self.watchdog = parts.watchdog
        torch.manual_seed(dropout_seed(config.seed, self.rank))
        self.timer = PhaseTimer(self.device)  # GPU phase times: events, read once an epoch
        self.work = BlockWork(len(config.fanout))
        self._loader_cpu = {"sample_cpu": 0.0, "gather_cpu": 0.0}
        self.start_epoch = 0
        self.history: list[dict[str, Any]] = []
        self.scheduler = build_scheduler(self.optimizer, config)
        self.selection = ModelSelection(config.early_stop)
        self._global_batch = np.zeros(0, dtype=np.int64)
        self._warned: set[str] = set()
        #: ``--cuda-graphs``' step (None without it); its graphs are captured at the first
        #: steps, after the resume below has loaded the optimizer's state.
        self.graphed = graphed_step_for(self) if config.cuda_graphs else None
        #: ``--compile``'s training forward (None without it; :mod:`distmb.engine.compiled`).
        self.compiled = compiled_forward_for(self) if config.compile else None
        # The run's identity in every record: rank 0's, so that all ranks agree (a resumed
        # run keeps the identity and start time of the run it continues).
        self.run_id, self.started = self.comm.allgather(
            (f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}", _now())
        )[0]
        if config.resume:
            self._resume()

    # -- checkpoints -------------------------------------------------------------------------
    def _state(self, epoch: int) -> dict[str, Any]:
        return {
            "epoch": epoch,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            # Dropout on a GPU draws from the device's generator (one rank per GPU).
            "cuda_rng": (
                torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
            ),
            "args": self.cfg.as_dict(),
            "model_spec": self.model_spec,
            "identity": self.local.identity,
            "ranks": self.num_ranks,
            "run_id": self.run_id,
            "started": self.started,
            SELECTION_KEY: self.selection.state(),
            SCHEDULER_KEY: self.scheduler.state_dict() if self.scheduler is not None else None,
            "feature_norm": self.normalization.state() if self.normalization else None,
            "grad_scaler": self.precision.state_dict(),
        }

    def _save(self, epoch: int, best: bool = False) -> None:
        """Every rank writes its halo scheme's state for ``epoch`` (if it has any); then rank
        0 writes the checkpoint (model, optimizer, every rank's RNG state) that names
        ``epoch``; then the ranks drop their older cache files. A crash at any point leaves a
        checkpoint whose cache files exist (or, between the first two steps, an older
        checkpoint with its own files). When ``epoch`` is the best so far (``best``), the same
        state is first written to ``best.pt`` (a resume from the previous checkpoint trains
        the epoch again and rewrites it identically); before there is a best, a ``best.pt``
        in the directory is an older run's and is removed."""
        directory = self.cfg.checkpoint_dir
        if self.halo.stateful:
            save_cache_state(directory, epoch, self.rank, self.halo.state())
        states = self.comm.allgather(torch.get_rng_state())  # also: every cache file is written
        if self.rank == 0:
            state = self._state(epoch)
            state["torch_rng_per_rank"] = states
            if best:
                save_checkpoint(directory, state, BEST_FILE)
            elif self.selection.best is None:
                (Path(directory) / BEST_FILE).unlink(missing_ok=True)
            save_checkpoint(directory, state)
        self.comm.barrier()  # nobody runs ahead of a checkpoint that is still being written
        remove_cache_states(directory, self.rank, keep_epoch=epoch)

    def _resume(self) -> None:
        if not self.cfg.checkpoint_dir:
            raise InputError("--resume needs --checkpoint-dir")
        state = load_checkpoint(
            self.cfg.checkpoint_dir, identity=self.local.identity, args=self.cfg.as_dict()
        )
        saved_spec = state.get("model_spec", self.model_spec)
        if saved_spec != self.model_spec:
            raise InputError(
                f"--resume: the checkpoint in {self.cfg.checkpoint_dir} trained {saved_spec}, "
                f"this run's model is {self.model_spec}"
            )
        saved_ranks = state.get("ranks", 1)
        if saved_ranks != self.num_ranks:
            raise InputError(
                f"--resume: the checkpoint in {self.cfg.checkpoint_dir} was written by "
                f"{saved_ranks} ranks, this run has {self.num_ranks}"
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.precision.load_state_dict(state.get("grad_scaler"))
        # The optimizer state carries the old lr and weight decay: this run's values win
        # (the lr through the schedule, when there is one).
        for group in self.optimizer.param_groups:
            group["weight_decay"] = self.cfg.weight_decay
            if "capturable" in self.optimizer.defaults:  # this run's (--cuda-graphs) too
                group["capturable"] = self.optimizer.defaults["capturable"]
        notes = restore_schedule(
            self.optimizer,
            self.scheduler,
            state.get(SCHEDULER_KEY),
            self.cfg,
            int(state["epoch"]) + 1,
        )
        self.selection.restore(state.get(SELECTION_KEY))
        saved_args = state.get("args", {})
        changed = [
            f"{flag_of(key)} {saved_args[key]!r} -> {getattr(self.cfg, key)!r}"
            for key in RESUME_APPLIED
            if key in saved_args and saved_args[key] != getattr(self.cfg, key)
        ]
        if (changed or notes) and self.rank == 0:
            self.log(f"resume: applied {', '.join(changed + notes)}")
        rng_states = state.get("torch_rng_per_rank", [state["torch_rng"]])
        torch.set_rng_state(rng_states[self.rank])
        if self.device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.start_epoch = int(state["epoch"]) + 1
        self.run_id = str(state.get("run_id", self.run_id))
        self.started = str(state.get("started", self.started))
        if self.cfg.results and self.rank == 0:
            dropped = drop_records_from(self.cfg.results, self.start_epoch)
            if dropped:
                self.log(
                    f"resume: dropped {dropped} record(s) of epochs >= {self.start_epoch} from "
                    f"{self.cfg.results} (written after the last checkpoint; trained again now)"
                )
        if self.halo.stateful:
            self._restore_halo_state()
        if self.rank == 0:
            self.log(f"resumed from {self.cfg.checkpoint_dir} after epoch {state['epoch']}")

    def _restore_halo_state(self) -> None:
        """Refill the caches as they were after the resumed epoch, so a resumed run repeats an
        uninterrupted one exactly. When some rank has no file, or the saved caches are not
        this run's (``--no-hec`` or ``--exact-remote`` changed between the runs), all ranks
        start with empty caches, which refill within ``d + ls`` iterations."""
        arrays = load_cache_state(self.cfg.checkpoint_dir, self.start_epoch - 1, self.rank)
        usable = arrays is not None and set(arrays) == self.halo.state_keys()
        if self.comm.allreduce_min(1.0 if usable else 0.0) == 1.0:
            self.halo.restore(arrays)
        elif self.rank == 0:
            self.log(
                "resume: the checkpoint holds no matching HEC state for every rank; "
                "caches start empty"
            )

    # -- one epoch ---------------------------------------------------------------------------
    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """The same number M of batches on every rank: ``M = max over ranks of
        ceil(n_train / batch_size)`` (``Allreduce MAX``), and each rank splits its shuffled
        training vertices into M batches whose sizes differ by at most one. Every training
        vertex is seen once per epoch and no batch exceeds ``--batch-size``; a rank with
        fewer than M training vertices repeats them, one per batch, so no batch is empty."""
        order = self.shuffled_train(epoch)
        num_iters = int(self.comm.allreduce_max(-(-order.size // self.cfg.batch_size)))
        return split_batches(order, num_iters)

    def shuffled_train(self, epoch: int) -> np.ndarray:
        """int64[n_train]: this rank's training vertices in the epoch's order."""
        return shuffled(self.local.train_idx, self.cfg.seed, epoch)

    def loss_weight(self, step: int) -> float:
        """``P / global batch size`` of step ``step``: after the gradient all-reduce averages
        over the P ranks, every seed of the global batch has the same weight, whatever its
        rank's share (one rank: the mean over the batch)."""
        return self.num_ranks / float(self._global_batch[step])

    def train_epoch(self, epoch: int) -> dict[str, Any]:
        """One pass over the training vertices; returns loss, accuracy and timings."""
        self.model.train()
        self.timer.reset()
        self.work.reset()
        self.comm.allreduce_stats.reset()
        self.loader.load_wait = 0.0
        for owner in self.parts.counters:
            owner.reset_epoch_counters()  # evaluation's reads are not this epoch's
        self.halo.begin_epoch(epoch)
        self.watchdog.at(epoch)
        plan = self.loader.plan(epoch, self.epoch_batches(epoch))
        # Global batch size of every step (``Allreduce SUM``), in production order.
        sizes = np.array([plan.batches[i].size for i in plan.order], dtype=np.int64)
        self._global_batch = self.comm.allreduce_sum(sizes)
        num_steps = len(plan)
        warning = self.halo.schedule_warning(num_steps)
        if warning and self.rank == 0 and warning not in self._warned:
            self._warned.add(warning)
            self.log(f"warning: {warning}")
        losses = EpochLoss(num_steps, self.device)  # read once, at the end of the epoch
        sample_cpu = gather_cpu = 0.0
        bar = meter(
            f"epoch {epoch}",
            num_steps,
            "iterations",
            rate_unit="samples",
            options=self.progress_settings(),
        )
        start = step_start = time.perf_counter()
        for step, batch in enumerate(self.loader(plan)):
            self.watchdog.at(epoch, step)
            self.timer.add("sample", batch.sample_s, batch.sample_span)
            self.timer.add("gather", batch.gather_s, batch.gather_span)
            sample_cpu += batch.sample_cpu_s
            gather_cpu += batch.gather_cpu_s
            self.work.add_sampled(batch.blocks)
            if self.graphed is not None:
                self._graphed_train_step(batch, step, num_steps, losses)
            else:
                self._train_step(batch, step, num_steps, losses)
            self.halo.end_iteration()
            bar.update(1, items=batch.size, loss=losses.latest())
            now = time.perf_counter()
            self.watchdog.iteration_done(now - step_start)
            step_start = now
        bar.close()
        self.timer.resolve()  # the epoch's one wait: its GPU work is done, its events read
        self.loader.features.check()  # a deferred bad-id error first (before the loss's)
        train_time = time.perf_counter() - start
        kept = (
            f"; the last good checkpoint is kept in {self.cfg.checkpoint_dir}"
            if self.cfg.checkpoint_dir
            else ""
        )
        total_loss, correct, seen = losses.finish(epoch, kept)
        sample_s, gather_s = self.timer.seconds["sample"], self.timer.seconds["gather"]
        self.timer.seconds["mbc"] = sample_s + gather_s  # wherever the loader ran them
        self._loader_cpu = {"sample_cpu": sample_cpu, "gather_cpu": gather_cpu}
        return {
            "epoch": epoch,
            "iterations": num_steps,
            "loss": total_loss / max(seen, 1),
            "train_acc": correct / max(seen, 1),
            "epoch_time": round(train_time, 4),
            **self.timer.as_dict(),
            "sample": round(sample_s, 4),
            "gather": round(gather_s, 4),
            "load_wait": round(self.loader.load_wait, 4),
            "samples_per_s": round(seen / train_time, 1) if train_time > 0 else 0.0,
        }

    def _train_step(self, batch: MiniBatch, step: int, num_steps: int, losses: EpochLoss) -> None:
        """Forward, loss, backward, gradient all-reduce and optimizer step of one batch, each
        phase timed (FWD, BWD, ARed, OPT)."""
        with self.timer("fwd"):
            with self.precision.autocast():
                logits = self.forward(batch, step, num_steps)
            logits = logits.float()  # the loss in float32 whatever --precision
            self.work.add_used(batch.blocks)  # after the halo scheme dropped missed leaves
            loss_sum = F.cross_entropy(logits, batch.labels, reduction="sum")
            loss = loss_sum * self.loss_weight(step)
        losses.add(step, loss_sum, logits, batch.labels)
        with self.timer("bwd"):
            self.optimizer.zero_grad(set_to_none=True)
            self.precision.backward(loss)
        with self.timer("ared"):
            self.comm.allreduce_gradients(self.model)
            # After the all-reduce (linear, so the same sum): bucketed all-reduces write
            # the reduced gradients back only once they complete, in the call above, and
            # every rank then sees the same inf/nan when fp16's scaler checks them.
            self.precision.unscale(self.optimizer)
        with self.timer("opt"):
            self.precision.step(self.optimizer)

    def _graphed_train_step(
        self, batch: MiniBatch, step: int, num_steps: int, losses: EpochLoss
    ) -> None:
        """``--cuda-graphs``' step of one batch (one rank): the static buffers' refill and the
        whole step, one graph replay on a GPU, are timed as the forward phase (FWD); BWD, ARed
        and OPT stay 0 (the timers' CUDA events are recorded outside any capture)."""
        assert self.graphed is not None
        with self.timer("fwd"):
            out = self.graphed.step(batch, step, num_steps, self.loss_weight(step))
        self.work.add_used(batch.blocks)  # one rank: the blocks the model ran on
        # The graph's outputs are overwritten by its next replay: the epoch copies the step's
        # row (its loss and correct count, computed in the graph) into its slot.
        losses.add_values(step, out.values, int(batch.labels.shape[0]))

    def rank_detail(
        self, record: dict[str, Any], halo: dict[str, np.ndarray]
    ) -> tuple[dict[str, Any], dict[str, float]]:
        """This rank's own view of the epoch just trained, as ``(counts, times)`` (the
        ``per_rank`` and ``per_rank_time`` entries of the record, docs/design.md "Per-rank
        records"): the sizes of its part, its work (:class:`BlockWork`), HEC lookups and
        traffic per layer and its gradient all-reduce payload; its wall seconds per phase
        and the training and loader threads' CPU seconds.

        Args:
            record: this rank's :meth:`train_epoch` record.
            halo: this rank's :meth:`HaloScheme.stats`.
        """
        local = self.local
        layers = {
            "hec_lookups": "lookups",
            "hec_hits": "hits",
            "rows_pushed": "rows_pushed",
            "bytes_pushed": "bytes_pushed",
            "rows_received": "rows_received",
            "bytes_received": "bytes_received",
        }
        counts: dict[str, Any] = {
            "n_solid": int(local.n_solid),
            "n_halo": int(local.n_local - local.n_solid),
            "n_edges": int(local.indptr[-1]),
            "n_train": int(local.train_idx.size),
            "threads": torch.get_num_threads(),
            "iterations": int(record["iterations"]),
            **self.work.as_dict(),
            **{key: [int(v) for v in halo[name]] for key, name in layers.items()},
            "bytes_exact_remote": int(halo["bytes_exact_remote"][0]),
            "allreduce_calls": self.comm.allreduce_stats.calls,
            "allreduce_payload_bytes": self.comm.allreduce_stats.payload_bytes,
        }
        cpu = {**self.timer.cpu_dict(), **self._loader_cpu}
        comm_cpu = float(halo["comm_mpi_cpu"][0])
        times = {
            **{key: record[key] for key in ("epoch_time", *PHASES, "load_wait")},
            **cpu,
            "comm_wait": float(halo["comm_wait"][0]),
            "comm_mpi": float(halo["comm_mpi"][0]),
            "comm_mpi_cpu": comm_cpu,
            # The training thread's compute: its forward, backward and optimizer CPU seconds
            # without those spent inside the pushes' MPI calls (which run in the forward).
            "compute_cpu": cpu["fwd_cpu"] + cpu["bwd_cpu"] + cpu["opt_cpu"] - comm_cpu,
        }
        return counts, {k: round(float(v), SECONDS_DIGITS) for k, v in times.items()}

    def progress_settings(self) -> ProgressSettings:
        """``--no-progress`` and ``--progress-every``; progress on rank 0 only."""
        return ProgressSettings(
            enabled=self.cfg.progress and self.rank == 0, every=self.cfg.progress_every
        )

    def forward(self, batch: MiniBatch, step: int, num_steps: int) -> torch.Tensor:
        """Logits of the batch's seeds: the halo scheme fills the halo leaves, then the
        model's layer loop runs with the scheme's per-layer hook."""
        self.halo.after_sample(batch, step, num_steps)

        def layer_input(layer: int, _block, h: torch.Tensor) -> torch.Tensor:
            return self.halo.layer_input(batch, layer, h, step, num_steps)

        if self.compiled is not None:  # one rank: no halo rows to add (layer_input's h)
            return self.compiled(batch.blocks, batch.x)
        return self.model(batch.blocks, batch.x, layer_input=layer_input)

    def evaluate(self) -> dict[str, float]:
        """Exact val/test accuracy (layer-wise full-neighbour inference over every part, one
        synchronous halo exchange per layer with several ranks; counts summed over ranks)."""
        start = time.perf_counter()
        features = self.feature_sources.evaluation()
        if self.eval_table is not None:
            self.eval_table.features = features
        logits = layerwise_inference(
            self.model,
            features,
            self.sampler,
            self.cfg.eval_batch_size,
            self.eval_table,
            progress=self.progress_settings(),
            device=self.device,
        )
        acc = split_accuracies(
            self.comm,
            logits,
            self.local.labels,
            {"val": self.local.val_idx, "test": self.local.test_idx},
        )
        return {
            "val_acc": acc["val"],
            "test_acc": acc["test"],
            "eval_time": round(time.perf_counter() - start, 4),
        }

    # -- the run -----------------------------------------------------------------------------
    def fit(self) -> list[dict[str, Any]]:
        """Train from ``start_epoch`` to ``epochs``; returns the per-epoch records."""
        cfg = self.cfg
        self.watchdog.start()  # heartbeats from here on; stopped (together) below
        if self.start_epoch >= cfg.epochs and self.rank == 0:
            self.log(
                f"nothing to train: the checkpoint in {cfg.checkpoint_dir} already ran epochs "
                f"0-{self.start_epoch - 1} and --epochs is {cfg.epochs}; raise --epochs to "
                "continue"
            )
        board = TensorBoardLog(cfg.tensorboard) if cfg.tensorboard and self.rank == 0 else None
        if cfg.early_stop:
            self._check_validation_vertices()
        stopped = self.selection.should_stop  # a resumed run that had stopped early
        if stopped and self.start_epoch < cfg.epochs and self.rank == 0:
            self.log(
                f"nothing to train: the checkpoint in {cfg.checkpoint_dir} had stopped "
                f"({self.selection.stop_reason()}); raise --early-stop to continue"
            )
        for epoch in range(self.start_epoch, cfg.epochs if not stopped else self.start_epoch):
            lr = self.optimizer.param_groups[0]["lr"]  # this epoch's (--lr-schedule)
            record = self.train_epoch(epoch)
            record["lr"] = lr
            halo_stats = self.halo.stats()
            own = self.rank_detail(record, halo_stats)  # before the cross-rank view replaces it
            record.update(global_stats(self.comm, record, halo_stats))
            for owner in self.parts.counters:  # the caches' records (collectives)
                record.update(owner.epoch_stats(self.comm))
            record.update(rank_records(self.comm, *own))
            improved = False
            if (epoch + 1) % cfg.eval_every == 0 or epoch == cfg.epochs - 1:
                record.update(self.evaluate())
                # All-reduced accuracies: every rank takes the same decisions below.
                improved = self.selection.update(epoch, record["val_acc"], record["test_acc"])
            record.update(self.selection.record())
            stopped = self.selection.should_stop
            if stopped:
                record["stopped"] = "early_stop"
            if self.scheduler is not None:
                self.scheduler.step()  # the next epoch's lr; the checkpoint holds it
            self.history.append(record)
            if self.rank == 0:
                line = format_epoch(record) + format_feature_cache(record)
                self.log(line + format_hec(record) if self.num_ranks > 1 else line)
                entry = {
                    **record,
                    "run_id": self.run_id,
                    "started": self.started,
                    "model": self.model_spec,
                    "ranks": self.num_ranks,
                    "dataset": self.local.identity["graph_name"],
                }
                if cfg.results:
                    append_jsonl(cfg.results, entry)
                if board is not None:
                    board.log_epoch(entry)  # the same numbers as the JSON record
            if cfg.checkpoint_dir:
                self._save(epoch, best=improved)
            if stopped:
                if self.rank == 0:
                    self.log(self.selection.stop_reason())
                break
        if board is not None:
            board.close()
        self.watchdog.stop()  # every rank: goodbyes exchanged, no heartbeat left in flight
        if cfg.checkpoint_dir:
            release_directory(cfg.checkpoint_dir)  # the run is over (held by rank 0)
        return self.history

    def _check_validation_vertices(self) -> None:
        """``--early-stop`` needs validation vertices on some rank (one all-reduce)."""
        total = self.comm.allreduce_sum(np.array([self.local.val_idx.size], dtype=np.int64))
        if int(total[0]) == 0:
            raise InputError(
                f"--early-stop {self.cfg.early_stop}: {self.local.identity['graph_name']} has no "
                "validation vertices to select on"
            )


def _now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def dropout_seed(seed: int, rank: int) -> int:
    """Seed of the dropout RNG of ``rank`` (ranks draw different masks; reproducible)."""
    return (seed * DROPOUT_SEED_MULTIPLIER + rank * DROPOUT_SEED_RANK_STRIDE + 1) % SEED_MODULUS
