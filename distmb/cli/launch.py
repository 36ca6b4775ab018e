"""Starting a run: the on-the-fly partition of ``--dataset`` for P ranks, whether an MPI
launcher started us, and one rank's error handling (:func:`run_on_ranks`: an error on any
rank aborts the job), under an MPI launcher or torchrun. A rank's part is opened by
:func:`distmb.engine.build.data.open_own_part` and checked against the other ranks' by
:func:`distmb.engine.build.data.check_same_partition`.

This module sits above both the runtime and the partitioner (``distmb.partition``), so
neither imports the other's entry points: the runtime packages never import the partitioner.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from distmb.cli.usage import UsageExit
from distmb.comm import RankGroup, launch_communicator
from distmb.comm.mpienv import is_mpi_launch, is_torchrun_launch
from distmb.core.errors import DistmbError, InputError, OutputError
from distmb.core.signals import end_job_on_stop_signal, wait_if_stopping

#: Part of the ``--partition-cache`` key: bump it when a loader's output or the partition
#: format changes, so that no run reuses a partition of the old data (the key is computed
#: before any rank loads the dataset). 2: the synthetic generator's features were rescaled.
PARTITION_CACHE_REVISION = 2


def partition_cache_dir(cache_root: str, spec: str, parts: int, seed: int) -> Path:
    """Where ``--dataset SPEC`` is partitioned for ``parts`` ranks: keyed on the spec, the rank
    count, the seed, :data:`PARTITION_CACHE_REVISION` and the dataset's files (names, sizes,
    modification times), so a changed dataset is partitioned again instead of reused."""
    ident = f"{spec}|{parts}|{seed}|{PARTITION_CACHE_REVISION}|{dataset_fingerprint(spec)}"
    key = hashlib.sha256(ident.encode()).hexdigest()[:16]
    name = "".join(c if c.isalnum() else "-" for c in spec.split(":")[0])
    return Path(cache_root) / f"{name}-p{parts}-{key}"


def dataset_fingerprint(spec: str) -> str:
    """sha256 of ``(relative path, size, mtime_ns)`` of every file behind ``spec`` (a file,
    or a directory walked in sorted order, without the loaders' own binary caches); empty
    for the generated ``synthetic`` datasets, whose spec says everything. Cheap: no file is
    read."""
    from distmb.data.datasets import parse_spec
    from distmb.data.datasets.ogb_cache import CACHE_DIRNAME

    kind, arg = parse_spec(spec)
    if kind == "synthetic":
        return ""
    root = Path(arg)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(
            path
            for path in root.rglob("*")
            if path.is_file() and CACHE_DIRNAME not in path.relative_to(root).parts
        )
    else:
        raise InputError(f"--dataset {spec}: {arg} does not exist")
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        rel = path.name if path == root else str(path.relative_to(root))
        digest.update(f"{rel}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def ensure_partition(comm: RankGroup, spec: str, cache_root: str, seed: int, log) -> str:
    """Rank 0 partitions ``spec`` into the cache (unless already there); the others wait and
    use the directory rank 0 chose. An error on rank 0 is re-raised on every rank, so nobody
    waits forever."""
    out: Path | None = None
    error = None
    if comm.rank == 0:
        try:
            out = partition_cache_dir(cache_root, spec, comm.size, seed)
            if not (out / "partition.json").is_file():
                from distmb.data import load_dataset
                from distmb.partition import partition_graph

                graph = load_dataset(spec, seed=seed)
                log(f"partitioning {graph.summary()} into {comm.size} parts at {out}")
                partition_graph(
                    graph, comm.size, out, seed=seed, replicate_halo_features=True, overwrite=True
                )
        except Exception as exc:  # noqa: BLE001 - forwarded to every rank below
            kind = "" if isinstance(exc, DistmbError) else f"{type(exc).__name__}: "
            error = (isinstance(exc, OSError), f"{kind}{exc}")  # OSError: a full disk, ...
    error, out = comm.bcast((error, out), root=0)
    if error is not None:
        failed_writing, message = error
        raise (OutputError if failed_writing else InputError)(
            f"--dataset {spec}: partitioning on rank 0 failed: {message}"
        )
    return str(out)


#: Seconds a failing rank waits after writing its message and before it aborts the job, so
#: the launcher forwards the message before it tears the job down.
ABORT_GRACE_S = 0.5


def is_multi_rank_launch() -> bool:
    """Whether a launcher started this process as one rank of several: an MPI launcher
    (:func:`~distmb.comm.mpienv.is_mpi_launch`) or torchrun
    (:func:`~distmb.comm.mpienv.is_torchrun_launch`)."""
    return is_mpi_launch() or is_torchrun_launch()


def run_on_ranks(prog: str, body: Callable[[RankGroup], None]) -> int:
    """Run ``body(comm)`` as one rank of a multi-rank job (``mpirun -np P python -m PROG``,
    or ``torchrun --nproc_per_node P -m PROG``; :func:`~distmb.comm.launch_communicator`).

    Any error on any rank aborts the whole job (``MPI_Abort``; under torchrun the rank exits
    and torchrun stops the others), so a dead rank never leaves the others waiting: a
    :class:`DistmbError` as one line ``PROG: error: [rank i] ...`` with its exit code,
    anything else with its traceback (exit 1). Ctrl-C and SIGTERM end the job with one line,
    ``PROG: interrupted`` (exit 130) or ``PROG: terminated`` (exit 143), and no traceback
    (:func:`~distmb.core.signals.end_job_on_stop_signal`). argparse's ``--help`` and flag
    errors exit every rank alike (they all parse the same flags); parsed through
    :func:`~distmb.cli.usage.parse_on_ranks`, they are printed once and need no abort. So
    are the errors of set-up steps run through :func:`~distmb.cli.usage.agree_on_ranks`
    (once when every rank met the same, else by each rank that met one, naming it): every
    rank raises :class:`~distmb.cli.usage.UsageExit` with one code. The torch.distributed
    group, if any, is torn down when ``body`` returns.

    Returns:
        0 when ``body`` returned on this rank.
    """
    comm = launch_communicator()
    # Ctrl-C, SIGTERM: one line, no tracebacks (torchrun signals every worker itself).
    end_job_on_stop_signal(prog, comm.rank, lone_line=comm.launcher == "mpi")
    try:
        body(comm)
        comm.close_torch_distributed()
    except SystemExit as exc:  # argparse --help / bad flags: every rank exits alike
        # An error every rank knows of, reported (parse_on_ranks, agree_on_ranks): every
        # rank leaves with its code, no abort needed.
        if exc.code not in (0, None) and not isinstance(exc, UsageExit):
            comm.abort(int(exc.code) if isinstance(exc.code, int) else 2)
        comm.close_torch_distributed()
        raise
    except DistmbError as exc:
        wait_if_stopping()  # a stop signal's exit, not this error, ends the job
        _report_and_abort(comm, f"{prog}: error: [rank {comm.rank}] {exc}\n", exc.exit_code)
    except BaseException as exc:
        wait_if_stopping()
        _report_and_abort(
            comm,
            f"{prog}: [rank {comm.rank}] failed: {type(exc).__name__}: {exc}\n"
            + traceback.format_exc(),
            1,
        )
    return 0


def _report_and_abort(comm: RankGroup, message: str, code: int) -> None:
    """Write ``message`` to stderr in one write (the summary line first), give the launcher
    :data:`ABORT_GRACE_S` to forward it, then abort every rank with ``code``."""
    sys.stderr.write(message)
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_S)
    comm.abort(code)


def check_srun_mpi() -> None:
    """Refuse a task of ``srun`` started without an MPI plugin (``--mpi=none``, some sites'
    default): every task would train alone, as rank 0 of 1, on the same outputs.

    Raises:
        InputError: naming ``srun --mpi=pmix`` (or ``pmi2``) as the fix.
    """
    tasks = os.environ.get("SLURM_STEP_NUM_TASKS", "")
    if tasks.isdigit() and int(tasks) > 1 and not is_mpi_launch():
        raise InputError(
            f"srun started {tasks} tasks without an MPI plugin, so each would train alone; "
            "launch with srun --mpi=pmix (or --mpi=pmi2: see srun --mpi=list and "
            "slurm/README.md)"
        )
