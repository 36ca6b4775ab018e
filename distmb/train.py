"""``python -m distmb.train``: mini-batch training of GraphSAGE or GAT.

With no arguments it trains GraphSAGE on the built-in synthetic dataset (about a minute on
two cores). Defaults follow Table 2 of the DistGNN-MB paper.
"""

from __future__ import annotations

import argparse
import sys
import time

from distmb.aep import DEFAULT_HEC_DELAY, DEFAULT_HEC_LIFESPAN, DEFAULT_HEC_NC, DEFAULT_HEC_SIZE
from distmb.errors import DistmbError, InputError, exit_on_user_error

#: Paper's learning rates (Table 2, single socket) when --lr is not given.
DEFAULT_LR = {"sage": 0.003, "gat": 0.001}
MODELS = ("sage", "gat")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m distmb.train",
        description="Mini-batch GNN training (GraphSAGE / GAT) with local thread-parallel "
        "sampling and exact layer-wise evaluation.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    data = p.add_mutually_exclusive_group()
    data.add_argument(
        "--dataset",
        default=None,
        help="dataset spec (synthetic[:k=v,...] | planetoid:DIR | npz:FILE | ogb:DIR | "
        "edgelist:DIR); default: synthetic",
    )
    data.add_argument("--part-dir", default=None, help="partition directory (distmb-partition)")
    p.add_argument("--model", choices=MODELS, default="sage", help="GNN model")
    p.add_argument("--layers", type=int, default=3, help="number of GNN layers")
    p.add_argument("--hidden", type=int, default=256, help="hidden width (per head for GAT)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (GAT)")
    p.add_argument(
        "--fanout",
        default="5,10,15",
        help="neighbours sampled per layer, input layer first (one per layer; -1 = all)",
    )
    p.add_argument("--aggr", default="mean", help="GraphSAGE aggregator: mean, sum or gcn")
    p.add_argument("--batch-size", type=int, default=1000, help="seed vertices per mini-batch")
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help="Adam learning rate (default: 0.003 for sage, 0.001 for gat)",
    )
    p.add_argument("--weight-decay", type=float, default=0.0, help="Adam weight decay")
    p.add_argument("--dropout", type=float, default=0.5, help="dropout after hidden layers")
    p.add_argument("--epochs", type=int, default=40, help="training epochs")
    p.add_argument("--seed", type=int, default=0, help="seed of model init, shuffling, sampling")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads for sampling and PyTorch (default: all cores)",
    )
    p.add_argument("--eval-every", type=int, default=1, help="evaluate every N epochs")
    p.add_argument(
        "--eval-batch-size",
        type=int,
        default=4096,
        help="destinations per block in layer-wise evaluation",
    )
    p.add_argument(
        "--checkpoint-dir", default=None, help="write a checkpoint here after every epoch (atomic)"
    )
    p.add_argument(
        "--resume", action="store_true", help="continue from --checkpoint-dir's checkpoint"
    )
    p.add_argument(
        "--results",
        default=None,
        help="append one JSON object per epoch to this file (plot: python -m distmb.report FILE)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--kernels",
        choices=("fused", "torch"),
        default="fused",
        help="UPDATE/AGG implementation: fused C++ kernels or PyTorch ops",
    )
    hec = p.add_argument_group("multi-rank (mpirun -np P): historical embedding cache")
    hec.add_argument(
        "--hec-size", type=int, default=DEFAULT_HEC_SIZE, help="cache lines per layer (cs)"
    )
    hec.add_argument(
        "--hec-nc",
        type=int,
        default=DEFAULT_HEC_NC,
        help="rows pushed per peer and layer per iteration at most (nc)",
    )
    hec.add_argument(
        "--hec-lifespan",
        type=int,
        default=DEFAULT_HEC_LIFESPAN,
        help="iterations a cached embedding stays usable (ls)",
    )
    hec.add_argument(
        "--hec-delay",
        type=int,
        default=DEFAULT_HEC_DELAY,
        help="iterations between a push and its use (d)",
    )
    hec.add_argument(
        "--no-hec",
        action="store_true",
        help="drop halo leaves instead (communication-free lower bound)",
    )
    hec.add_argument(
        "--exact-remote",
        action="store_true",
        help="DistDGL-like exact baseline instead of the HEC: sample remote neighbours at "
        "their owners and fetch remote features every iteration (no cache, no staleness)",
    )
    hec.add_argument(
        "--partition-cache",
        default=".cache/distmb-parts",
        help="where --dataset is partitioned for P ranks (rank 0 writes it)",
    )
    return p


def hec_config_from_args(args: argparse.Namespace):
    """Validate the ``--hec-*`` flags."""
    from distmb.aep import HecConfig

    for flag in ("hec_size", "hec_nc", "hec_delay"):
        if getattr(args, flag) < 1:
            raise InputError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.hec_lifespan < 0:
        raise InputError(f"--hec-lifespan must be >= 0, got {args.hec_lifespan}")
    if args.exact_remote and args.no_hec:
        raise InputError("--exact-remote and --no-hec exclude each other (pick one halo scheme)")
    return HecConfig(
        enabled=not args.no_hec,
        size=args.hec_size,
        nc=args.hec_nc,
        lifespan=args.hec_lifespan,
        delay=args.hec_delay,
    )


def parse_fanout(text: str, layers: int) -> tuple[int, ...]:
    """``"5,10,15"`` -> (5, 10, 15); one positive value (or -1) per layer."""
    try:
        fanout = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise InputError(f"--fanout {text!r}: expected comma-separated integers") from None
    if len(fanout) != layers:
        raise InputError(
            f"--fanout {text!r} lists {len(fanout)} values but --layers is {layers}; "
            "give one fan-out per layer"
        )
    if any(f == 0 or f < -1 for f in fanout):
        raise InputError(f"--fanout {text!r}: each value must be >= 1 (or -1 for all)")
    return fanout


def config_from_args(args: argparse.Namespace):
    """Validate the flags and turn them into a :class:`TrainConfig`."""
    from distmb.nn import AGGREGATORS
    from distmb.trainer import TrainConfig

    for flag in (
        "layers",
        "hidden",
        "heads",
        "batch_size",
        "epochs",
        "eval_every",
        "eval_batch_size",
    ):
        if getattr(args, flag) < 1:
            raise InputError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads must be >= 1, got {args.threads}")
    if args.lr is not None and not args.lr > 0:
        raise InputError(f"--lr must be > 0, got {args.lr}")
    if not 0.0 <= args.dropout < 1.0:
        raise InputError(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.weight_decay < 0:
        raise InputError(f"--weight-decay must be >= 0, got {args.weight_decay}")
    if args.aggr not in AGGREGATORS:
        raise InputError(f"--aggr must be one of {', '.join(AGGREGATORS)}, got {args.aggr!r}")
    if args.resume and not args.checkpoint_dir:
        raise InputError("--resume needs --checkpoint-dir")
    return TrainConfig(
        model=args.model,
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        fanout=parse_fanout(args.fanout, args.layers),
        aggr=args.aggr,
        batch_size=args.batch_size,
        lr=args.lr if args.lr is not None else DEFAULT_LR[args.model],
        weight_decay=args.weight_decay,
        dropout=args.dropout,
        epochs=args.epochs,
        seed=args.seed,
        eval_every=args.eval_every,
        eval_batch_size=args.eval_batch_size,
        checkpoint_dir=args.checkpoint_dir,
        resume=args.resume,
        results=args.results,
        progress=not args.no_progress,
        kernels=args.kernels,
    )


def load_local(args: argparse.Namespace, log) -> object:
    """The rank's :class:`LocalGraph` from ``--part-dir`` (one part) or ``--dataset``."""
    from distmb.data import PartitionStore, load_dataset
    from distmb.data.local import LocalGraph

    if args.part_dir:
        store = PartitionStore(args.part_dir, 0)
        if store.num_parts != 1:
            raise InputError(
                f"--part-dir {args.part_dir} has {store.num_parts} parts; a single-rank run "
                f"needs 1 (run under mpirun -np {store.num_parts} for multi-rank training)"
            )
        log(f"partition {args.part_dir}: {store}")
        local = LocalGraph.from_store(store)
    else:
        spec = args.dataset or "synthetic"
        graph = load_dataset(spec, seed=args.seed)
        log(graph.summary())
        for note in graph.notes:
            log(f"  {note}")
        local = LocalGraph.from_graph(graph)
    if local.train_idx.size == 0:
        raise InputError(f"{args.part_dir or args.dataset or 'synthetic'}: no training vertices")
    return local


def main(argv: list[str] | None = None) -> int:
    """Entry point: multi-rank when started by an MPI launcher, else single rank."""
    from distmb.distributed import is_mpi_launch

    if is_mpi_launch():
        return main_distributed(argv)
    return main_single(argv)


def main_distributed(argv: list[str] | None) -> int:
    """One rank of ``mpirun -np P python -m distmb.train``. Any error on any rank aborts
    the whole job (``MPI_Abort``), so a dead rank never leaves the others waiting."""
    import traceback

    from distmb.comm import Communicator

    comm = Communicator()
    try:
        run_distributed(build_parser().parse_args(argv), comm)
    except SystemExit as exc:  # argparse --help / bad flags: every rank exits alike
        if exc.code not in (0, None):
            comm.abort(int(exc.code) if isinstance(exc.code, int) else 2)
        raise
    except DistmbError as exc:
        _report_and_abort(comm, f"distmb.train: error: [rank {comm.rank}] {exc}\n", exc.exit_code)
    except BaseException as exc:
        _report_and_abort(
            comm,
            f"distmb.train: [rank {comm.rank}] failed: {type(exc).__name__}: {exc}\n"
            + traceback.format_exc(),
            1,
        )
    return 0


#: Seconds a failing rank waits after writing its message and before ``MPI_Abort``, so the
#: launcher forwards the message before it tears the job down.
ABORT_GRACE_S = 0.5


def _report_and_abort(comm, message: str, code: int) -> None:
    """Write ``message`` to stderr in one write (the summary line first), give the launcher
    :data:`ABORT_GRACE_S` to forward it, then abort every rank with ``code``."""
    sys.stderr.write(message)
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_S)
    comm.abort(code)


def run_distributed(args: argparse.Namespace, comm) -> None:
    import torch

    from distmb import _C
    from distmb.distributed import DistributedTrainer, ensure_partition, open_part

    config = config_from_args(args)
    hec = hec_config_from_args(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
        _C.set_num_threads(args.threads)

    def log(line: str) -> None:
        if comm.rank == 0:
            print(line, flush=True)

    part_dir = args.part_dir or ensure_partition(
        comm, args.dataset or "synthetic", args.partition_cache, args.seed, log
    )
    store = open_part(comm, part_dir)
    log(f"{comm.size} ranks on {part_dir}; rank 0: {store}")
    trainer = DistributedTrainer(comm, store, config, hec, exact_remote=args.exact_remote, log=log)
    log(
        f"training {config.model} ({config.layers} layers, hidden {config.hidden}), fan-out "
        f"{','.join(map(str, config.fanout))}, batch {config.batch_size} per rank, lr "
        f"{config.lr}, {config.epochs} epochs, {torch.get_num_threads()} threads per rank; HEC "
        + (
            "off (exact remote sampling and feature fetch)"
            if args.exact_remote
            else "off"
            if not hec.enabled
            else f"cs={hec.size} nc={hec.nc} ls={hec.lifespan} d={hec.delay}"
        )
    )
    history = trainer.fit()
    last = next((r for r in reversed(history) if "test_acc" in r), None)
    if last is not None:
        log(f"final: val {100 * last['val_acc']:.2f}%  test {100 * last['test_acc']:.2f}%")


@exit_on_user_error("distmb.train")
def main_single(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = config_from_args(args)
    hec_config_from_args(args)  # validated even though one rank has no halo
    import torch

    from distmb import _C
    from distmb.trainer import Trainer

    if args.threads is not None:
        torch.set_num_threads(args.threads)
        _C.set_num_threads(args.threads)

    def log(line: str) -> None:
        print(line, flush=True)

    local = load_local(args, log)
    trainer = Trainer(local, config, log=log)
    params = sum(p.numel() for p in trainer.model.parameters())
    log(
        f"training {config.model} ({config.layers} layers, hidden {config.hidden}"
        + (f", {config.heads} heads" if config.model == "gat" else "")
        + f", {params} parameters), fan-out {','.join(map(str, config.fanout))}, batch "
        f"{config.batch_size}, lr {config.lr}, {config.epochs} epochs, "
        f"{torch.get_num_threads()} threads"
    )
    history = trainer.fit()
    if history:
        last = next((r for r in reversed(history) if "test_acc" in r), None)
        if last is not None:
            log(f"final: val {100 * last['val_acc']:.2f}%  test {100 * last['test_acc']:.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
