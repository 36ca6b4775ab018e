"""The process-wide settings of a run (threads, allocator, kernels) and its output paths,
applied before anything is built (the kernels once the training device is known)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from distmb.config.train import TrainConfig
from distmb.core.malloc import configure_malloc
from distmb.engine.outputs import prepare_checkpoint_dir, prepare_results_file
from distmb.engine.tensorboard import prepare_tensorboard_dir
from distmb.nn.kernels.dispatch import resolve_kernels, set_kernels

if TYPE_CHECKING:
    import torch


def prepare_outputs(config: TrainConfig, rank: int) -> None:
    """Check and create the run's output paths before any work (every rank writes into the
    checkpoint directory, which rank 0 holds for the run; rank 0 alone writes the results).
    Idempotent."""
    if config.checkpoint_dir:
        prepare_checkpoint_dir(
            config.checkpoint_dir,
            resume=config.resume,
            overwrite=config.overwrite_checkpoint,
            hold=rank == 0,
        )
    if config.results and rank == 0:
        prepare_results_file(config.results)
    if config.tensorboard and rank == 0:
        prepare_tensorboard_dir(config.tensorboard)


def set_threads(config: TrainConfig) -> str | None:
    """``--threads``: PyTorch's and the C++ kernels' thread counts. Returns a warning when
    ``--threads`` or ``--loader-threads`` exceeds the cores this process may run on (allowed:
    the threads then take turns)."""
    warning = None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    asked = max(config.threads or 0, config.loader_threads or 0)
    if cores is not None and asked > cores:
        warning = (
            f"distmb.train: warning: {asked} threads (--threads / --loader-threads) exceed "
            f"the {cores} core(s) this process may use; the threads will take turns"
        )
    if config.threads is not None:
        import torch

        from distmb import _C

        torch.set_num_threads(config.threads)
        _C.set_num_threads(config.threads)
    return warning


def configure_process(config: TrainConfig, rank: int, log: Callable[[str], None]) -> None:
    """``--malloc``: from here on, glibc keeps each batch's freed buffers for the next batch
    instead of unmapping them (distmb/core/malloc.py; loading and partitioning came before;
    rank 0 logs where the policy cannot apply)."""
    note = configure_malloc(config.malloc)
    if note and rank == 0:
        log(f"distmb: {note}")


def configure_kernels(config: TrainConfig, device: torch.device) -> str:
    """``--kernels`` on the training ``device``: resolve it (``auto``: the Triton kernels on a
    GPU where Triton is installed, else the fused ones, which run on the CPU and fall back to
    PyTorch ops on a GPU; :func:`~distmb.nn.kernels.dispatch.resolve_kernels`) and select it
    for every layer of this process. Returns the implementation selected."""
    kernels = resolve_kernels(config.kernels, device)
    set_kernels(kernels)
    return kernels
