"""``distmb-partition``: split a dataset into P parts on disk (format version 1)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from distmb.config.constants import MAX_SEED
from distmb.config.options import refuse_empty
from distmb.core import progress
from distmb.core.errors import InputError, exit_on_user_error, output_error
from distmb.core.machine import MAX_THREADS
from distmb.core.progress import Progress
from distmb.data.store.format import FEATURE_LAYOUTS
from distmb.partition.assign import ASSIGNMENT_METHOD, METHODS, check_method_options
from distmb.partition.pipeline import (
    DEFAULT_TRAIN_TOLERANCE,
    DEFAULT_VERTEX_TOLERANCE,
    assignment_record,
    check_partition_args,
    check_rebalance_args,
    default_memory_budget_gib,
    format_report,
    load_assignment,
    open_assignment,
    partition_graph,
)

#: The command (error lines, ``--help``).
PROG = "distmb-partition"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Partition a graph with METIS (balanced vertices and training vertices) "
        "into P parts: solid and halo vertices, ID maps, send lists (docs/partition-format.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--dataset",
        default="synthetic",
        help="dataset spec: synthetic[:k=v,...] | planetoid:DIR | npz:FILE | "
        "ogb:DIR | edgelist:DIR (docs/datasets.md)",
    )
    p.add_argument("--parts", type=int, help="number of parts P (one per rank); required")
    p.add_argument("--out", help="output directory (must not exist); required")
    p.add_argument(
        "--method",
        choices=METHODS,
        default=None,
        help="(default: metis) metis: min edge cut (pymetis); kaminpar: min edge cut with "
        "KaMinPar, faster and leaner than METIS, byte-identical per seed only with --threads 1 "
        "(pip install "
        "'distmb[kaminpar]'); random: balanced random, for graphs too big for either; "
        "parmetis: ParMETIS over the ranks of mpiexec, each reading a slice of the edges "
        "(ogb:DIR; docs/partitioning-at-scale.md)",
    )
    p.add_argument(
        "--assignment",
        metavar="FILE.npy",
        help="instead of --method: the part of every vertex, computed elsewhere (int32 or "
        "int64[N] .npy, values in [0, --parts)); rebalanced and written as METIS' would be. "
        "Under mpiexec with ogb:DIR, every rank writes its own parts "
        "(docs/partitioning-at-scale.md)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed (same seed -> byte-identical output; for kaminpar only with --threads 1)",
    )
    p.add_argument(
        "--balance-edges",
        action="store_true",
        help="also balance in-edges per part (third METIS constraint; --method metis only)",
    )
    p.add_argument(
        "--train-tolerance",
        type=float,
        default=DEFAULT_TRAIN_TOLERANCE,
        help="allowed training-vertex imbalance max/mean - 1 after rebalancing",
    )
    p.add_argument(
        "--vertex-tolerance",
        type=float,
        default=DEFAULT_VERTEX_TOLERANCE,
        help="allowed vertex-count imbalance max/mean - 1 after rebalancing "
        "(only non-training vertices move)",
    )
    p.add_argument(
        "--memory-budget",
        type=float,
        default=default_memory_budget_gib(),
        metavar="GIB",
        help="when the process with METIS would exceed this (graph and features, plus METIS at "
        "~128 B per adjacency entry and ~160 B per vertex), METIS partitions the uniform edge "
        "sample that fits (default: 60%% of physical memory; recorded in partition.json)",
    )
    p.add_argument(
        "--replicate-halo-features",
        action="store_true",
        help="store halo vertices' features in each part (layer 0 needs no traffic)",
    )
    p.add_argument(
        "--features-layout",
        choices=FEATURE_LAYOUTS,
        default="npy",
        help="npy: features.npy per part; ooc: one raw file per part with rows at offsets "
        "aligned for direct I/O, read out of core by `--features ooc` (docs/out-of-core.md)",
    )
    p.add_argument(
        "--convert",
        metavar="DIR",
        help="instead of partitioning: rewrite the existing partition DIR's features in "
        "--features-layout, in place (crash-safe; no other option applies)",
    )
    p.add_argument(
        "--no-symmetrize",
        action="store_true",
        help="keep a directed input directed (default: add every edge in reverse)",
    )
    p.add_argument(
        "--split-seed",
        type=int,
        default=0,
        help="seed of the stratified split for datasets that ship none",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="OpenMP and KaMinPar threads (default: all)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.add_argument("--quiet", action="store_true", help="print only the final table")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The parsed flags, checked as far as that needs no data (:func:`check_args`).

    Raises:
        SystemExit: argparse's usage errors and ``--help``.
        InputError: a flag's value, naming the flag.
    """
    args = build_parser().parse_args(argv)
    check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """Check every flag that can be checked without loading the dataset: required and
    excluding flags, empty paths, ``--parts``, ``--out``, ``--method``'s options, ``--threads``,
    the seeds, the tolerances, ``--memory-budget`` and the ``--assignment`` file (readable,
    its dtype and its parts; its length needs the graph). Sets ``args.method`` (the default,
    or :data:`ASSIGNMENT_METHOD` with ``--assignment``).

    Raises:
        InputError: naming the flag and what was expected.
    """
    for flag in ("--dataset", "--out", "--assignment", "--convert"):
        refuse_empty(flag, getattr(args, flag[2:]))
    if args.convert is not None:
        return
    for flag, value in (("--parts", args.parts), ("--out", args.out)):
        if value is None:
            raise InputError(f"{flag} is required (or --convert DIR to convert a partition)")
    if args.assignment is not None and args.method is not None:
        raise InputError(
            f"--assignment gives the assignment; --method {args.method} cannot be used with it"
        )
    if args.assignment is not None:
        args.method = ASSIGNMENT_METHOD
    args.method = args.method or "metis"
    check_partition_args(None, args.parts, args.out, method=args.method, overwrite=args.overwrite)
    check_method_options(args.method, balance_edges=args.balance_edges)
    if args.threads is not None and not 1 <= args.threads <= MAX_THREADS:
        raise InputError(f"--threads must be in [1, {MAX_THREADS}], got {args.threads}")
    for flag, seed in (("--seed", args.seed), ("--split-seed", args.split_seed)):
        if not 0 <= seed <= MAX_SEED:
            raise InputError(f"{flag} must be in [0, {MAX_SEED}], got {seed}")
    check_rebalance_args(args.train_tolerance, args.vertex_tolerance, args.memory_budget)
    if args.assignment is not None:
        open_assignment(args.assignment, args.parts)


@exit_on_user_error(PROG)
def main(argv: list[str] | None = None) -> int:
    from distmb.comm.mpienv import is_mpi_launch

    if is_mpi_launch():  # every rank parses the same flags: a bad one is reported once
        from mpi4py import MPI

        from distmb.cli.usage import parse_on_ranks

        args = parse_on_ranks(MPI.COMM_WORLD, PROG, lambda: parse_args(argv))
    else:
        args = parse_args(argv)
    progress.configure(enabled=not args.quiet)  # the loaders' and the writer's progress
    if args.convert is not None:
        from distmb.partition.convert import convert_features

        try:
            convert_features(args.convert, args.features_layout, Progress(quiet=args.quiet))
        except OSError as exc:  # a full disk while rewriting the rows: one line
            raise output_error("partition", args.convert, exc) from exc
        print(f"{args.convert}: features in the {args.features_layout} layout")
        return 0
    if args.threads is not None:
        from distmb import _C

        _C.set_num_threads(args.threads)
    from distmb.data import load_dataset

    log = Progress(quiet=args.quiet)
    if args.method == "parmetis":
        return _main_parmetis(args, log)
    if args.assignment is not None and mpi_world_size() > 1:
        return _main_distributed(args, log)
    log(f"loading {args.dataset}")
    graph = load_dataset(args.dataset, symmetrize=not args.no_symmetrize, seed=args.split_seed)
    log(graph.summary())
    for note in graph.notes:
        log(f"  {note}")
    part_of, extra = None, None
    if args.assignment is not None:
        part_of = load_assignment(args.assignment, graph.num_nodes, args.parts)
        extra = assignment_record(args.assignment)
    meta = partition_graph(
        graph,
        args.parts,
        args.out,
        method=args.method,
        seed=args.seed,
        balance_edges=args.balance_edges,
        train_tolerance=args.train_tolerance,
        vertex_tolerance=args.vertex_tolerance,
        memory_budget_gib=args.memory_budget,
        replicate_halo_features=args.replicate_halo_features,
        features_layout=args.features_layout,
        overwrite=args.overwrite,
        progress=log,
        part_of=part_of,
        extra_options=extra,
    )
    print(format_report(meta, graph.nbytes))
    print(f"partition written to {args.out}")
    return 0


def _write_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options of the distributed writer (:mod:`distmb.partition.distwrite`)."""
    return {
        "balance_edges": args.balance_edges,
        "train_tolerance": args.train_tolerance,
        "vertex_tolerance": args.vertex_tolerance,
        "memory_budget_gib": args.memory_budget,
        "replicate_halo_features": args.replicate_halo_features,
        "features_layout": args.features_layout,
        "overwrite": args.overwrite,
    }


def _main_parmetis(args: argparse.Namespace, log: Progress) -> int:
    """``--method parmetis``: the MPI job of :mod:`distmb.partition.distributed` (run under
    ``mpiexec``); rank 0 prints the report."""
    from distmb.partition.distributed import partition_parmetis

    _end_job_on_stop_signal()
    meta = partition_parmetis(
        args.dataset,
        args.parts,
        args.out,
        seed=args.seed,
        symmetrize=not args.no_symmetrize,
        log=log,
        **_write_options(args),
    )
    return _report(args, meta)


def _main_distributed(args: argparse.Namespace, log: Progress) -> int:
    """``--assignment FILE`` under ``mpiexec``: every rank writes its own parts
    (:mod:`distmb.partition.distwrite`); rank 0 prints the report."""
    from distmb.partition.distwrite import partition_distributed

    _end_job_on_stop_signal()
    path = args.assignment
    meta = partition_distributed(
        args.dataset,
        args.parts,
        args.out,
        lambda num_nodes: load_assignment(path, num_nodes, args.parts),
        method=ASSIGNMENT_METHOD,
        seed=args.seed,
        symmetrize=not args.no_symmetrize,
        extra_options=assignment_record(path),
        progress=log,
        **_write_options(args),
    )
    return _report(args, meta)


def _report(args: argparse.Namespace, meta: dict[str, Any] | None) -> int:
    """Rank 0 (the one with ``meta``) prints the per-part table."""
    if meta is not None:
        print(format_report(meta))
        print(f"partition written to {args.out}")
    return 0


def _end_job_on_stop_signal() -> None:
    """Under ``mpiexec -n P`` (P > 1), Ctrl-C and SIGTERM end the job with one line and
    exit 130 or 143 (:func:`~distmb.core.signals.end_job_on_stop_signal`)."""
    if mpi_world_size() > 1:
        from mpi4py import MPI

        from distmb.core.signals import end_job_on_stop_signal

        end_job_on_stop_signal("distmb-partition", MPI.COMM_WORLD.rank)


def mpi_world_size() -> int:
    """Ranks of the MPI job this process belongs to; 1 outside one (no launcher's variables
    set: mpi4py is then not even imported)."""
    from distmb.comm.mpienv import is_mpi_launch

    if not is_mpi_launch():
        return 1
    from mpi4py import MPI

    return int(MPI.COMM_WORLD.size)


if __name__ == "__main__":
    sys.exit(main())
