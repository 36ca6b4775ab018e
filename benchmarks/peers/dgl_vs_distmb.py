"""distmb against DGL, side by side in one run: the same graph, model, batches and threads.

distmb's side runs in this process (distmb's venv: ``Trainer.train_epoch`` on the whole
graph as one rank, by default ``--prefetch 0`` so that mini-batch creation is timed inline, as
DGL's ``DataLoader`` with ``num_workers=0`` runs it; ``--prefetch N`` and ``--dgl-workers N``
compare both sides with their batches made ahead instead: distmb's loader thread, DGL's worker
processes). DGL's side runs in a subprocess with the
DGL venv's python (``benchmarks/peers/setup_dgl.sh``; ``dgl_worker.py``), reading the graph
from the one ``.npz`` this script writes (``peer_graph.py``): both train on identical data.

Matched: GraphSAGE (``SAGEConv('mean')``, DGL's example model) or GAT (``GATConv``, heads
concatenated in hidden layers and averaged in the last; distmb's GAT applies bias and ReLU
before the attention, DGL's after the aggregation: the same work), layers = fan-outs listed
input layer first for both (DGL's ``NeighborSampler([5, 10, 15])`` gives the seeds 15
neighbours, as distmb's ``--fanout 5,10,15``), hidden width, heads, dropout, Adam with the
same learning rate, batch size, ``torch.set_num_threads`` and ``OMP_NUM_THREADS`` (set
before torch is imported, here and in the worker). The training split is cut to a whole
number of batches (seeded), so both sides run the same number of batches of the same size.

Timing: a warm-up round, then measured rounds; a round is one epoch of each side, the order
alternating (distmb first, then DGL first, ...), so drift on a shared machine hits both
alike. The phases have the same boundaries on both sides: MBC = sampling (distmb's C++
sampler; ``next()`` of DGL's DataLoader) + feature/label gather; FWD = model + loss; BWD =
``zero_grad`` + ``backward``; OPT = ``optimizer.step``; MBC wait = the training loop's time
getting its next batch (MBC itself when inline; distmb's wait for its loader thread, or
``next()`` waiting for DGL's workers plus DGL's gather, when made ahead: then distmb's MBC is
the loader thread's time, off the loop's path, and DGL's sampling only the wait). Medians over
the measured epochs, distmb/DGL ratios (< 1: distmb faster), mean block sizes per layer (the
same fan-outs give the same sizes), and after the last epoch exact val/test accuracy on both
sides (layer-wise full-neighbour inference), a check that both learn the same task.

    benchmarks/peers/setup_dgl.sh                           # once: the DGL venv
    python benchmarks/peers/dgl_vs_distmb.py --threads 2    # -> results/peers_dgl.{json,png}
    python benchmarks/peers/dgl_vs_distmb.py --model gat --out results/peers_dgl_gat.json
    python benchmarks/peers/dgl_vs_distmb.py --prefetch 2 --dgl-workers 1 \
        --out results/peers_dgl_ahead.json                  # batches made ahead, both sides
    python benchmarks/peers/dgl_vs_distmb.py --quick        # smoke run on a tiny graph
    python benchmarks/peers/dgl_vs_distmb.py --replot results/peers_dgl.json   # PNG only

(with distmb's python, ``PYTHONPATH`` the repository root when distmb is not installed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import peer_graph

from distmb.core.errors import DistmbError
from distmb.core.malloc import DEFAULT_MALLOC_POLICY, MALLOC_POLICIES

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULTS = REPO / "results"
#: The DGL venv's python that setup_dgl.sh builds.
DEFAULT_DGL_PYTHON = HERE / ".venv-dgl" / "bin" / "python"
WORKER = HERE / "dgl_worker.py"
#: Every reply line of the worker starts with this (``dgl_worker.REPLY_PREFIX``).
REPLY_PREFIX = "@@dgl-worker "

#: The products-shaped synthetic graph (distmb.data.datasets.synthetic_config.SHAPES["products"]).
DEFAULT_DATASET = "synthetic:shape=products"
#: --quick: a tiny graph of the same shape, small batches, one measured round.
QUICK = dict(nodes=4000, batch_size=250, hidden=32, epochs=1, warmup=1)

#: Phases on both sides, in the order they run (``distmb.engine.timers.PHASES`` less ARed,
#: which one rank does not have, with MBC split into sampling and gather).
PHASES = ("sample", "gather", "fwd", "bwd", "opt")
#: Per-epoch numbers of which the medians and ratios are reported.
METRICS = ("epoch_time", "epoch_cpu", "mbc", "mbc_wait", *PHASES, "other")
#: The training loop's path through an epoch: getting the batch, then the model's phases.
LOOP_PHASES = ("mbc_wait", "fwd", "bwd", "opt")
#: Metrics in seconds per epoch (the phases are also reported in milliseconds per batch).
EPOCH_METRICS = ("epoch_time", "epoch_cpu")
LABELS = {
    "epoch_time": "epoch",
    "epoch_cpu": "epoch CPU",
    "mbc": "MBC",
    "mbc_wait": "MBC wait",
    "sample": "sampling",
    "gather": "gather",
    "fwd": "FWD",
    "bwd": "BWD",
    "opt": "OPT",
    "other": "other",
}
SIDES = ("distmb", "dgl")
#: --dgl-gat choices as the figure names them.
GAT_LABELS = {"dgl": "DGL's GATConv", "paper": "distmb's equation on DGL ops"}

#: OMP_WAIT_POLICY values of --omp-wait-policy, and the choice that leaves it unset.
WAIT_POLICIES = ("passive", "active")
DEFAULT_POLICY = "default"

#: Seconds the worker may take to start and load the graph, and per epoch or evaluation.
DEFAULT_WORKER_TIMEOUT_S = 3600.0
#: Seconds the worker gets to exit after ``quit`` before it is killed.
QUIT_GRACE_S = 10.0
#: Lines of the worker's stderr shown when it fails.
LOG_TAIL_LINES = 40


class PeerError(RuntimeError):
    """The DGL worker is missing, failed or stopped answering."""


# -- the graph both sides read ---------------------------------------------------------------
def whole_batches(train_idx: np.ndarray, batch_size: int, seed: int) -> np.ndarray:
    """int64 ascending: a seeded random subset of ``train_idx`` of a multiple of
    ``batch_size`` vertices (all of them when there are fewer than one batch), so that
    distmb's even split and DGL's fixed-size batches are the same batches sizes."""
    keep = (train_idx.size // batch_size) * batch_size or train_idx.size
    if keep == train_idx.size:
        return train_idx
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(train_idx, size=keep, replace=False))


def graph_arrays(graph: Any) -> dict[str, np.ndarray]:
    """A distmb :class:`~distmb.data.graph.Graph` as the arrays of :mod:`peer_graph` (int64
    CSR: a graph may hold int32 indices, the hand-over format and DGL take int64)."""
    return {
        "indptr": np.asarray(graph.indptr, dtype=np.int64),
        "indices": np.asarray(graph.indices, dtype=np.int64),
        "features": graph.features,
        "labels": graph.labels,
        "train_idx": graph.train_idx,
        "val_idx": graph.val_idx,
        "test_idx": graph.test_idx,
        "num_classes": np.array(graph.num_classes, dtype=np.int64),
    }


def export_graph(graph: Any, path: Path) -> None:
    """Write ``graph`` to ``path`` in :mod:`peer_graph`'s format, atomically."""
    from distmb.core.atomic import write_atomic

    arrays = graph_arrays(graph)
    write_atomic(path, lambda f: peer_graph.write_graph_arrays(f, arrays))


# -- DGL's side ------------------------------------------------------------------------------
class DGLPeer:
    """The DGL worker subprocess: one JSON command per line in, one reply line out.

    Args:
        python: the DGL venv's interpreter.
        env: its environment (threads set).
        log_path: where its stderr goes (shown when it fails).
        timeout_s: seconds to wait for any one reply.
    """

    def __init__(self, python: Path, env: dict[str, str], log_path: Path, timeout_s: float):
        if not Path(python).is_file():
            raise PeerError(
                f"--dgl-python {python}: no such interpreter; build the DGL venv with "
                "benchmarks/peers/setup_dgl.sh (or point --dgl-python at one with dgl)"
            )
        self.log_path = log_path
        self.timeout_s = timeout_s
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [str(python), "-u", str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
            cwd=HERE,
        )
        self._replies: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        """Queue the reply lines; other stdout lines go to the log."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(REPLY_PREFIX):
                self._replies.put(line[len(REPLY_PREFIX) :])
            else:
                self._log.write(line)
        self._replies.put(None)  # end of output: the worker exited

    def call(self, cmd: str, **fields: Any) -> dict[str, Any]:
        """Send one command and return its reply (without ``ok``)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise PeerError(f"the DGL worker exited before {cmd!r}{self._tail()}") from None
        try:
            line = self._replies.get(timeout=self.timeout_s)
        except queue.Empty:
            raise PeerError(
                f"the DGL worker did not answer {cmd!r} within {self.timeout_s:g} s "
                f"(--worker-timeout){self._tail()}"
            ) from None
        if line is None:
            raise PeerError(f"the DGL worker exited during {cmd!r}{self._tail()}")
        reply = json.loads(line)
        if not reply.pop("ok", False):
            raise PeerError(f"the DGL worker failed on {cmd!r}:\n{reply.get('error', reply)}")
        return reply

    def _tail(self) -> str:
        self._log.flush()
        lines = self.log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        return f"; its log ({self.log_path}) ends:\n" + "\n".join(lines) if lines else ""

    def close(self) -> None:
        """Ask the worker to quit; kill it if it does not."""
        if self.proc.poll() is None:
            try:
                self.call("quit")
                self.proc.wait(timeout=QUIT_GRACE_S)
            except (PeerError, subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> DGLPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- distmb's side ---------------------------------------------------------------------------
def distmb_blocks(trainer: Any, epoch: int) -> list[dict[str, float]]:
    """Mean ``n_src``, ``n_dst`` and edges per layer over the batches of ``epoch`` (sampled
    again with the trainer's sampler, untimed; the same blocks the epoch trained on)."""
    sizes = [
        [[b.n_src, b.n_dst, b.num_edges] for b in trainer.sampler.sample(seeds, epoch, i)]
        for i, seeds in enumerate(trainer.epoch_batches(epoch))
    ]
    return [
        {"n_src": float(s), "n_dst": float(d), "edges": float(e)}
        for s, d, e in np.mean(np.array(sizes, dtype=np.float64), axis=0)
    ]


def with_other(record: dict[str, Any], made_ahead: bool) -> dict[str, Any]:
    """``record`` plus ``mbc_wait`` (the loop's time getting batches: distmb's ``load_wait``
    when ``made_ahead``, else the MBC phases, which then ran on the loop) and ``other``:
    epoch time in none of :data:`LOOP_PHASES` (the loop's bookkeeping)."""
    wait = record["load_wait"] if made_ahead else record["sample"] + record["gather"]
    out = {**record, "mbc_wait": wait}
    out["other"] = out["epoch_time"] - sum(out[p] for p in LOOP_PHASES)
    return out


# -- the run ---------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--dataset", default=DEFAULT_DATASET, help="distmb dataset spec")
    p.add_argument(
        "--nodes", type=int, help="vertices of a synthetic dataset (appended to its spec)"
    )
    p.add_argument("--model", choices=("sage", "gat"), default="sage")
    p.add_argument("--fanout", default="5,10,15", help="per layer, input layer first")
    p.add_argument("--hidden", type=int, default=256, help="hidden width (per head for GAT)")
    p.add_argument("--heads", type=int, default=4, help="GAT attention heads")
    p.add_argument(
        "--dgl-gat",
        choices=tuple(GAT_LABELS),
        default="dgl",
        help="DGL's GAT layer: its own GATConv (bias and ReLU after the aggregation), or "
        "distmb's equation 2 (bias and ReLU before the attention) on DGL's kernels",
    )
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--lr", type=float, help="Adam's learning rate (default: distmb's per model)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="both sides")
    p.add_argument(
        "--omp-wait-policy",
        choices=(*WAIT_POLICIES, DEFAULT_POLICY),
        default="passive",
        help="OMP_WAIT_POLICY of both sides ('default': OpenMP's own, i.e. the variable "
        "unset); passive keeps idle threads from spinning on cores that other threads need",
    )
    p.add_argument("--epochs", type=int, default=3, help="measured epochs per side")
    p.add_argument("--warmup", type=int, default=1, help="untimed epochs per side first")
    p.add_argument("--kernels", choices=("fused", "torch"), default="fused", help="distmb's")
    p.add_argument(
        "--malloc",
        choices=MALLOC_POLICIES,
        default=DEFAULT_MALLOC_POLICY,
        help="distmb's --malloc (its default: retain); DGL's side keeps glibc's defaults",
    )
    p.add_argument(
        "--no-gather-in-place",
        dest="gather_in_place",
        action="store_false",
        help="distmb's --no-gather-in-place: gather all of block 0's input rows (by default "
        "its fused SAGEConv reads the neighbours' rows from the feature table through their ids)",
    )
    p.add_argument(
        "--prefetch",
        type=int,
        default=0,
        help="distmb's --prefetch: batches its loader thread makes ahead (0: inline, as DGL "
        "with --dgl-workers 0)",
    )
    p.add_argument(
        "--dgl-workers",
        type=int,
        default=0,
        help="num_workers of DGL's DataLoader (persistent worker processes making batches "
        "ahead; 0: inline)",
    )
    p.add_argument("--eval-batch-size", type=int, default=4096)
    p.add_argument("--no-eval", action="store_true", help="skip the accuracy check")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dgl-python", type=Path, default=DEFAULT_DGL_PYTHON)
    p.add_argument("--worker-timeout", type=float, default=DEFAULT_WORKER_TIMEOUT_S, help="seconds")
    p.add_argument("--workdir", type=Path, help="for the graph file (default: a temporary one)")
    p.add_argument(
        "--out",
        type=Path,
        help="JSON (+ .png); default results/peers_dgl.json, with --quick the work directory's",
    )
    p.add_argument(
        "--replot", type=Path, help="only re-draw the PNG of this JSON result (no measuring)"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()),
    )
    return p


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Apply ``--quick`` and check the flags (SystemExit with the flag's name)."""
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    for flag in ("threads", "epochs", "batch_size", "hidden", "heads", "eval_batch_size"):
        if getattr(args, flag) < 1:
            sys.exit(f"dgl_vs_distmb: --{flag.replace('_', '-')} must be >= 1")
    for flag in ("warmup", "prefetch", "dgl_workers"):
        if getattr(args, flag) < 0:
            sys.exit(f"dgl_vs_distmb: --{flag.replace('_', '-')} must be >= 0")
    try:
        args.fanout = (
            [int(f) for f in args.fanout.split(",")]
            if isinstance(args.fanout, str)
            else args.fanout
        )
    except ValueError:
        sys.exit(f"dgl_vs_distmb: --fanout {args.fanout!r}: expected integers like 5,10,15")
    if not args.fanout or min(args.fanout) < 1:
        sys.exit(f"dgl_vs_distmb: --fanout {args.fanout}: expected positive integers")
    if args.replot is None and not args.dgl_python.is_file():
        sys.exit(
            f"dgl_vs_distmb: --dgl-python {args.dgl_python}: no such interpreter; build the "
            "DGL venv with benchmarks/peers/setup_dgl.sh (or point --dgl-python at one with dgl)"
        )
    if args.nodes is not None:
        if not args.dataset.startswith("synthetic"):
            sys.exit("dgl_vs_distmb: --nodes needs a synthetic --dataset")
        sep = "," if ":" in args.dataset else ":"
        args.dataset = f"{args.dataset}{sep}nodes={args.nodes}"
    return args


def command_line(args: argparse.Namespace) -> str:
    """The command that repeats this run, every setting explicit."""
    parts = [
        "python",
        "benchmarks/peers/dgl_vs_distmb.py",
        "--dataset",
        args.dataset,
        "--model",
        args.model,
        "--fanout",
        ",".join(map(str, args.fanout)),
        "--hidden",
        str(args.hidden),
        "--heads",
        str(args.heads),
        "--dgl-gat",
        args.dgl_gat,
        "--batch-size",
        str(args.batch_size),
        "--dropout",
        str(args.dropout),
        "--lr",
        str(args.lr),
        "--threads",
        str(args.threads),
        "--epochs",
        str(args.epochs),
        "--warmup",
        str(args.warmup),
        "--kernels",
        args.kernels,
        "--malloc",
        args.malloc,
        *([] if args.gather_in_place else ["--no-gather-in-place"]),
        "--prefetch",
        str(args.prefetch),
        "--dgl-workers",
        str(args.dgl_workers),
        "--eval-batch-size",
        str(args.eval_batch_size),
        "--seed",
        str(args.seed),
        "--omp-wait-policy",
        args.omp_wait_policy,
    ]
    if args.no_eval:
        parts.append("--no-eval")
    return shlex.join(parts)


def main(argv: list[str] | None = None) -> None:
    args = resolve(build_parser().parse_args(argv))
    if args.replot is not None:
        png = args.replot.with_suffix(".png")
        plot(json.loads(args.replot.read_text()), png)
        print(f"wrote {png} from {args.replot}")
        return
    # Before torch is imported (here and in the worker): OpenMP reads these at start-up.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    if args.omp_wait_policy == DEFAULT_POLICY:
        os.environ.pop("OMP_WAIT_POLICY", None)
    else:
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="peers-dgl-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        run(args, workdir)
    except (PeerError, DistmbError) as err:  # bad input or a failed worker: one message
        sys.exit(f"dgl_vs_distmb: {err}")
    finally:
        if args.workdir is None and not args.quick:
            shutil.rmtree(workdir, ignore_errors=True)


def run(args: argparse.Namespace, workdir: Path) -> None:
    import dataclasses

    import torch

    from distmb import __version__ as distmb_version
    from distmb.cli.report import write_json
    from distmb.config.train import TrainConfig
    from distmb.core.machine import cpu_model
    from distmb.data import load_dataset
    from distmb.data.local import LocalGraph
    from distmb.engine import Trainer
    from distmb.engine.build.runtime import set_threads

    load_start = os.getloadavg()[0]
    run_start = time.perf_counter()
    graph = load_dataset(args.dataset)
    train_all = graph.train_idx.size
    graph = dataclasses.replace(
        graph, train_idx=whole_batches(graph.train_idx, args.batch_size, args.seed)
    )
    graph_file = workdir / "graph.npz"
    export_graph(graph, graph_file)
    config = TrainConfig(
        model=args.model,
        layers=len(args.fanout),
        fanout=tuple(args.fanout),
        hidden=args.hidden,
        heads=args.heads,
        batch_size=args.batch_size,
        dropout=args.dropout,
        lr=args.lr,
        threads=args.threads,
        seed=args.seed,
        epochs=args.warmup + args.epochs,
        eval_every=10**9,
        eval_batch_size=args.eval_batch_size,
        kernels=args.kernels,
        malloc=args.malloc,
        prefetch=args.prefetch,
        gather_in_place=args.gather_in_place,
        progress=False,
    )
    args.lr = config.lr  # the model's default when not given: both sides use it
    set_threads(config)
    trainer = Trainer(LocalGraph.from_graph(graph), config, log=lambda _: None)
    # The worker imports peer_graph from its own directory; distmb's PYTHONPATH stays out.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    print(f"{graph.summary()}; {args.model}, {args.threads} threads", flush=True)
    with DGLPeer(args.dgl_python, env, workdir / "dgl_worker.log", args.worker_timeout) as dgl:
        setup = dgl.call(
            "setup",
            graph=str(graph_file),
            model=args.model,
            fanout=args.fanout,
            hidden=args.hidden,
            heads=args.heads,
            batch_size=args.batch_size,
            dropout=args.dropout,
            lr=args.lr,
            seed=args.seed,
            threads=args.threads,
            eval_batch_size=args.eval_batch_size,
            gat_variant=args.dgl_gat,
            num_workers=args.dgl_workers,
        )
        records: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}

        def epoch_of(side: str, epoch: int) -> dict[str, Any]:
            if side == "distmb":
                cpu = time.process_time()  # every thread of this process
                record = trainer.train_epoch(epoch)
                return {**record, "epoch_cpu": time.process_time() - cpu}
            return dgl.call("epoch", epoch=epoch)

        rounds = args.warmup + args.epochs
        for epoch in range(rounds):
            order = SIDES if epoch % 2 == 0 else SIDES[::-1]
            for side in order:
                made_ahead = side == "distmb" and args.prefetch > 0
                record = with_other(epoch_of(side, epoch), made_ahead)
                record["measured"] = epoch >= args.warmup
                records[side].append(record)
                print(
                    f"epoch {epoch} {side:6s} {record['epoch_time']:7.2f} s  "
                    + "  ".join(f"{LABELS[p]} {record[p]:.2f}" for p in ("mbc", "fwd", "bwd"))
                    + f"  loss {record['loss']:.4f}"
                    + ("" if record["measured"] else "  (warm-up)"),
                    flush=True,
                )
        blocks = {"distmb": distmb_blocks(trainer, 0), "dgl": records["dgl"][0]["blocks"]}
        accuracy: dict[str, dict[str, float]] = {}
        if not args.no_eval:
            accuracy["distmb"] = trainer.evaluate()
            accuracy["dgl"] = dgl.call("evaluate")
    iterations = records["distmb"][0]["iterations"]
    median = {side: medians(records[side]) for side in SIDES}
    fastest = {
        side: {
            m: round(min(r[m] for r in records[side] if r["measured"]), 4) for m in EPOCH_METRICS
        }
        for side in SIDES
    }
    ratio = {
        m: round(median["distmb"][m] / median["dgl"][m], 3) for m in METRICS if median["dgl"][m] > 0
    }
    degrees = graph.in_degree()
    result = {
        "benchmark": "peers_dgl",
        "command": command_line(args),
        "dataset": args.dataset,
        "summary": graph.summary(),
        "degree": {"mean": float(degrees.mean()), "max": int(degrees.max())},
        "train_vertices": {"used": int(graph.train_idx.size), "split": int(train_all)},
        "settings": {
            "model": args.model,
            "fanout_input_layer_first": args.fanout,
            "hidden": args.hidden,
            "heads": args.heads if args.model == "gat" else None,
            "dgl_gat": args.dgl_gat if args.model == "gat" else None,
            "batch_size": args.batch_size,
            "iterations_per_epoch": iterations,
            "dropout": args.dropout,
            "optimizer": "Adam",
            "lr": args.lr,
            "threads": args.threads,
            "warmup_epochs": args.warmup,
            "measured_epochs": args.epochs,
            "distmb_kernels": args.kernels,
            "distmb_prefetch": args.prefetch,
            "distmb_malloc": args.malloc,
            "distmb_gather_in_place": args.gather_in_place,
            "dgl_num_workers": args.dgl_workers,
            "seed": args.seed,
        },
        "machine": {
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_1min": {"start": load_start, "end": os.getloadavg()[0]},
            "OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"],
            "OMP_WAIT_POLICY": args.omp_wait_policy,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
        "wall_seconds": round(time.perf_counter() - run_start, 1),
        "versions": {
            "distmb": {
                "distmb": distmb_version,
                "commit": git_commit(),
                "torch": torch.__version__,
                "numpy": np.__version__,
                "python": platform.python_version(),
                "torch_threads": torch.get_num_threads(),
            },
            "dgl": {**setup["versions"], "torch_threads": setup["torch_threads"]},
        },
        "median_seconds_per_epoch": median,
        "median_ms_per_batch": {
            side: {
                m: round(1000 * v / iterations, 2)
                for m, v in median[side].items()
                if m not in EPOCH_METRICS
            }
            for side in SIDES
        },
        "ratio_distmb_over_dgl": ratio,
        # The fastest measured epoch of each side: on a shared machine other jobs only add
        # time, so the minimum is the least disturbed measurement.
        "min_seconds_per_epoch": fastest,
        "ratio_of_min_epoch_time": round(
            fastest["distmb"]["epoch_time"] / fastest["dgl"]["epoch_time"], 3
        ),
        # The same ratio round by round: both epochs of a round ran minutes apart at most, so
        # on a shared machine its spread says how much the load moved the median ratio.
        "epoch_time_ratio_per_round": [
            round(a["epoch_time"] / b["epoch_time"], 3)
            for a, b in zip(records["distmb"], records["dgl"], strict=True)
            if a["measured"]
        ],
        "blocks_mean_per_layer": blocks,
        "accuracy": accuracy,
        "final_loss": {side: records[side][-1]["loss"] for side in SIDES},
        "per_epoch": {
            side: [{k: v for k, v in r.items() if k != "blocks"} for r in records[side]]
            for side in SIDES
        },
    }
    out = args.out or (workdir / "peers_dgl.json" if args.quick else RESULTS / "peers_dgl.json")
    write_json(out, result, indent=2)
    plot(result, out.with_suffix(".png"))
    print_summary(result)
    print(f"wrote {out} and {out.with_suffix('.png')}\nreproduce: {result['command']}")


def medians(records: list[dict[str, Any]]) -> dict[str, float]:
    """Median of every metric over the measured epochs (seconds per epoch)."""
    measured = [r for r in records if r["measured"]]
    return {m: round(statistics.median(r[m] for r in measured), 4) for m in METRICS}


def git_commit() -> str:
    """The repository's HEAD commit, ``-dirty`` appended when the work tree has changes
    (``"unknown"`` outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=40"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def print_summary(result: dict[str, Any]) -> None:
    """The medians (epoch: seconds; phases: milliseconds per batch), ratios and accuracy."""
    print(f"{'median':10s} {'distmb':>10s} {'DGL':>10s} {'distmb/DGL':>11s}")
    for m in METRICS:
        if m in EPOCH_METRICS:
            table, unit = result["median_seconds_per_epoch"], "s/epoch"
        else:
            table, unit = result["median_ms_per_batch"], "ms/batch"
        ratio = result["ratio_distmb_over_dgl"].get(m)
        print(
            f"{LABELS[m]:10s} {table['distmb'][m]:10.3f} {table['dgl'][m]:10.3f} "
            f"{'' if ratio is None else f'{ratio:11.3f}'}  {unit}"
        )
    print(
        f"fastest epoch: distmb {result['min_seconds_per_epoch']['distmb']['epoch_time']:.3f} s, "
        f"DGL {result['min_seconds_per_epoch']['dgl']['epoch_time']:.3f} s, ratio "
        f"{result['ratio_of_min_epoch_time']:.3f}; per round: "
        + ", ".join(f"{r:.3f}" for r in result["epoch_time_ratio_per_round"])
    )
    for side, acc in result["accuracy"].items():
        print(f"{side}: val {acc['val_acc']:.4f}  test {acc['test_acc']:.4f}")


def plot(result: dict[str, Any], path: Path) -> None:
    """Left: median seconds per epoch, stacked by phase (by the loop's phases when either
    side makes batches ahead: its MBC then overlaps the others), per side. Middle: distmb/DGL ratio
    of every metric's median (below 1: distmb faster). Right: every epoch's time, round by
    round (how much the machine's load moved them)."""
    from distmb.cli.report import save_figure
    from distmb.core.plotting import panels, reference_line, rotate_labels, set_scale

    fig, (left, middle, right) = panels(3)
    median = result["median_seconds_per_epoch"]
    names = ["distmb", f"DGL {result['versions']['dgl']['dgl']}"]
    bottom = [0.0, 0.0]
    settings = result["settings"]
    ahead = settings.get("distmb_prefetch", 0) > 0 or settings.get("dgl_num_workers", 0) > 0
    for phase in (*(LOOP_PHASES if ahead else PHASES), "other"):
        values = [max(median[side].get(phase, 0.0), 0.0) for side in SIDES]
        left.bar(names, values, bottom=bottom, label=LABELS[phase])
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    left.set_ylabel("median seconds per epoch")
    left.set_title("epoch time by phase")
    left.legend(fontsize="small")
    ratios = result["ratio_distmb_over_dgl"]
    shown = [m for m in METRICS if m in ratios and m != "other"]
    bars = middle.bar([LABELS[m] for m in shown], [ratios[m] for m in shown], color="tab:green")
    middle.bar_label(bars, fmt="%.2f", fontsize="small")
    reference_line(middle, 1.0, "equal time")
    set_scale(middle, [ratios[m] for m in shown] + [1.0])
    middle.set_ylabel("distmb / DGL (medians)")
    middle.set_title("time ratio (< 1: distmb faster)")
    rotate_labels(middle)
    middle.margins(y=0.12)  # room for the bar labels
    middle.legend(fontsize="small")
    width = 0.4
    for k, (side, name) in enumerate(zip(SIDES, names, strict=True)):
        epochs = result["per_epoch"][side]
        right.bar(
            [r["epoch"] + (k - 0.5) * width for r in epochs],
            [r["epoch_time"] for r in epochs],
            width,
            label=name,
        )
    warmup = result["settings"]["warmup_epochs"]
    if warmup:
        right.axvspan(-0.5, warmup - 0.5, color="grey", alpha=0.15, label="warm-up")
    right.set_xticks(range(len(result["per_epoch"]["distmb"])))
    right.set_xlabel("round (one epoch of each side)")
    right.set_ylabel("seconds")
    right.set_title("every epoch")
    right.legend(fontsize="small")
    variant = settings.get("dgl_gat")
    model = settings["model"] + (f" (DGL side: {GAT_LABELS[variant]})" if variant else "")
    load = result["machine"]["load_average_1min"]
    fig.suptitle(
        f"{result['summary']}\n{model}, fan-out "
        f"{','.join(map(str, settings['fanout_input_layer_first']))}, batch "
        f"{settings['batch_size']}, {settings['threads']} threads"
        + (
            f", batches made ahead (distmb prefetch {settings['distmb_prefetch']}, DGL "
            f"workers {settings['dgl_num_workers']})"
            if ahead
            else ""
        )
        + f", {result['machine']['cpu']}, "
        f"load average {load['start']:.1f} -> {load['end']:.1f}",
        fontsize="medium",
    )
    save_figure(fig, path, dpi=110)


if __name__ == "__main__":
    main()
