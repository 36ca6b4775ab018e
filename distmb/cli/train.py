"""``python -m distmb.train``: mini-batch training of GraphSAGE or GAT.

With no arguments it trains GraphSAGE on the built-in synthetic dataset (about a minute on
two cores). Defaults follow Table 2 of the DistGNN-MB paper.
"""

from __future__ import annotations

import argparse
import sys

from distmb.config.train import TrainConfig, build_parser, config_from_args
from distmb.core import progress
from distmb.core.errors import exit_on_user_error

#: The command (error lines, ``--help``).
PROG = "distmb.train"


def main(argv: list[str] | None = None) -> int:
    """Entry point: multi-rank when started by an MPI launcher or torchrun, else single
    rank."""
    from distmb.cli.launch import is_multi_rank_launch

    if is_multi_rank_launch():
        return main_distributed(argv)
    return main_single(argv)


def main_distributed(argv: list[str] | None) -> int:
    """One rank of ``mpirun -np P python -m distmb.train`` (or ``torchrun --nproc_per_node
    P -m distmb.train``). A bad flag is reported once, by rank 0
    (:func:`~distmb.cli.usage.parse_on_ranks`), and so is an error of the set-up that every
    rank meets alike (:func:`run_distributed`); any later error on any rank aborts the whole
    job, so a dead rank never leaves the others waiting."""
    from distmb.cli.launch import run_on_ranks
    from distmb.cli.usage import parse_on_ranks

    def parse() -> argparse.Namespace:
        args = build_parser().parse_args(argv)
        config_from_args(args)  # validated here, so that a bad value is reported once
        return args

    return run_on_ranks(PROG, lambda comm: run_distributed(parse_on_ranks(comm, PROG, parse), comm))


def run_distributed(args: argparse.Namespace, comm) -> None:
    """One rank of a multi-rank run: its part (partitioned on the fly for ``--dataset``), its
    device (resolved once, here), its halo scheme and collectives' library, then
    :func:`train`.

    The set-up steps that may refuse the run (the flags that need no data, the outputs, the
    partition, the device) run through :func:`~distmb.cli.usage.agree_on_ranks`, one
    all-gather after each: an error that every rank meets alike (a flag, a missing
    ``--part-dir``) is printed once, by rank 0; one that only some ranks meet (a file of one
    part) by those ranks, naming them; every rank then exits with the same code. Each step's
    collectives are reached by every rank (the partitioning's broadcast, the partition's
    all-gathers: :func:`~distmb.engine.build.data.check_same_partition`), and the file reads
    that may fail on one rank alone (:func:`~distmb.engine.build.data.open_own_part`) come
    before none, so no rank is left waiting. Errors from the halo scheme on (training
    included) abort the job (:func:`~distmb.cli.launch.run_on_ranks`).
    """
    import torch

    from distmb.cli.launch import ensure_partition
    from distmb.cli.usage import agree_on
    from distmb.data.local import LocalGraph
    from distmb.engine.build import make_halo_scheme
    from distmb.engine.build.data import check_same_partition, open_own_part
    from distmb.engine.build.runtime import prepare_outputs, set_threads
    from distmb.engine.device import (
        check_comm_launch,
        gpu_identity,
        resolve_comm,
        shares_gpu,
        torch_backend,
        training_device,
        uses_device_path,
    )
    from distmb.nn.user import is_model_spec, load_model_class

    config = config_from_args(args)

    def prepare() -> str | None:  # before partitioning or loading anything
        check_comm_launch(config.comm, comm.launcher)
        if is_model_spec(config.model):
            load_model_class(config.model)  # importable, before any data is read
        prepare_outputs(config, comm.rank)
        return set_threads(config)

    agree = agree_on(comm, PROG)
    warning = agree(prepare)
    progress.configure(config.progress and comm.rank == 0, config.progress_every)
    if warning and comm.rank == 0:
        print(warning, file=sys.stderr, flush=True)

    def log(line: str) -> None:
        if comm.rank == 0:
            print(line, flush=True)

    part_dir = config.part_dir or agree(
        lambda: ensure_partition(
            comm, config.dataset or "synthetic", config.partition_cache, config.seed, log
        )
    )
    store = agree(lambda: open_own_part(part_dir, comm.size, comm.rank, verify=config.verify))
    agree(lambda: check_same_partition(comm, part_dir, store))
    log(f"{comm.size} ranks on {part_dir}; rank 0: {store}")
    # Every rank asks for its node-local rank here, at the same point (it may be a collective).
    local_rank = comm.local_rank()
    device = agree(lambda: training_device(config, local_rank))
    # On the device path the HEC's tables live on the training device: halo rows arrive there.
    cache_device = device if uses_device_path(config, device) else None
    halo = make_halo_scheme(comm, store, config, cache_device=cache_device)
    shared = False
    if device.type == "cuda":
        import socket

        shared = shares_gpu(comm.allgather((socket.gethostname(), gpu_identity(device))))
        log(f"{comm.size} ranks on GPUs" + (" (shared by several ranks)" if shared else ""))
    if resolve_comm(config.comm, device, shared, comm.launcher) == "torch":
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL's communicator binds to the current GPU
        backend = torch_backend(device)
        comm.use_torch_distributed(backend, device)
        log(
            "--comm torch: gradient all-reduce over torch.distributed "
            f"({comm.size} ranks, {backend}; in buckets during the backward pass), HEC push "
            "and exact exchanges over its all-to-all"
            + (" (started by torchrun, without MPI)" if comm.launcher != "mpi" else "")
        )
    # run_on_ranks tears the torch.distributed group down once this returns (not on an
    # error: the job is aborted then, and a teardown barrier would wait for the dead).
    train(LocalGraph.from_store(store), config, comm=comm, halo=halo, log=log, device=device)


def train(
    local, config: TrainConfig, *, comm=None, halo=None, log=print, device=None
) -> list[dict]:
    """Build the trainer, print what is trained, fit, print the final accuracy.

    Args:
        device: the training device when resolved already (multi-rank runs); default: the
            trainer resolves ``config.device``.
    """
    import torch

    from distmb.engine import Trainer

    trainer = Trainer(local, config, comm=comm, halo=halo, log=log, device=device)
    params = sum(p.numel() for p in trainer.model.parameters())
    per_rank = " per rank" if trainer.num_ranks > 1 else ""
    halo_text = f"; halo leaves: {trainer.halo.describe()}" if trainer.num_ranks > 1 else ""
    loader = trainer.loader
    loading = "synchronous loading" if loader.synchronous else f"prefetch {loader.prefetch}"
    log(
        f"training {config.model} ({config.layers} layers, hidden {config.hidden}"
        + (f", {config.heads} heads" if config.model == "gat" else "")
        + f", {params} parameters), fan-out {','.join(map(str, config.fanout))}, batch "
        f"{config.batch_size}{per_rank}, lr {config.lr}, {config.epochs} epochs, "
        f"{torch.get_num_threads()} thread(s){per_rank}, {loading}{halo_text}"
    )
    data_note, *device_notes = trainer.parts.notes
    log(data_note + (" (rank 0)" if trainer.num_ranks > 1 else ""))
    for note in device_notes:
        log(note)
    history = trainer.fit()
    last = next((r for r in reversed(history) if "test_acc" in r), None)
    if last is not None:
        log(final_line(last, trainer.selection.best))
    return history


def final_line(last: dict, best) -> str:
    """The run's last line: the last evaluated epoch's val and test accuracy, then those of
    the best validation epoch (``best``: a :class:`~distmb.engine.selection.BestEpoch`, or
    None without validation vertices)."""
    line = (
        f"final: epoch {last['epoch']}: val {100 * last['val_acc']:.2f}%  "
        f"test {100 * last['test_acc']:.2f}%"
    )
    if best is not None:
        line += (
            f"  |  best val: epoch {best.epoch}: val {100 * best.val_acc:.2f}%  "
            f"test {100 * best.test_acc:.2f}%"
        )
    return line


@exit_on_user_error(PROG)
def main_single(argv: list[str] | None = None) -> int:
    from distmb.cli.launch import check_srun_mpi
    from distmb.core.dirlock import release_directory
    from distmb.engine.build.data import load_local
    from distmb.engine.build.runtime import prepare_outputs, set_threads

    config = config_from_args(build_parser().parse_args(argv))
    check_srun_mpi()  # srun --mpi=none: P lone ranks, not one job
    prepare_outputs(config, rank=0)  # before loading anything; holds --checkpoint-dir
    try:
        progress.configure(config.progress, config.progress_every)  # the loaders' progress
        warning = set_threads(config)
        if warning:
            print(warning, file=sys.stderr, flush=True)

        def log(line: str) -> None:
            print(line, flush=True)

        train(load_local(config, log), config, log=log)
    finally:
        if config.checkpoint_dir:
            release_directory(config.checkpoint_dir)  # also after an error (in-process use)
    return 0


if __name__ == "__main__":
    sys.exit(main())
