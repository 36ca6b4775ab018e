"""Everything a training run is made of, built once from a
:class:`~distmb.config.train.TrainConfig`: :func:`build_run` returns :class:`RunParts`, which
the trainer's loop (:class:`distmb.engine.trainer.Trainer`) uses without rebuilding or
re-deciding anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from distmb.comm import RankGroup, SingleProcess
from distmb.config.train import TrainConfig
from distmb.data.local import LocalGraph
from distmb.data.store.neighborfile import NeighborFile
from distmb.engine.build.adjacency import describe_adjacency, open_adjacency
from distmb.engine.build.counters import EpochCounters, epoch_counters
from distmb.engine.build.device_stages import (
    DeviceStages,
    match_reorder,
    open_device_stages,
    reading_host_rows,
)
from distmb.engine.build.features import FeatureSources, open_features
from distmb.engine.build.model import build_model_and_optimizer
from distmb.engine.build.runtime import configure_kernels, configure_process, prepare_outputs
from distmb.engine.build.watchdog import Watchdog, collective_watchdog
from distmb.engine.device import check_device, training_device, uses_device_path
from distmb.engine.evaluate import HaloExchange, part_layer_table
from distmb.engine.precision import MixedPrecision
from distmb.halo.scheme import HaloScheme
from distmb.nn.models import BlockModel
from distmb.pipeline.features.normalize import FeatureNormalization, fit_normalization
from distmb.pipeline.loader import BatchLoader
from distmb.pipeline.sample.host import NeighborSampler
from distmb.pipeline.sample.protocol import PartSampler


@dataclass
class RunParts:
    """The parts of one rank's training run (what :func:`build_run` returns).

    Attributes:
        comm: the ranks.
        device: where the model trains (``--device``, resolved once).
        kernels: the layers' implementation (``--kernels`` resolved on ``device``: ``auto``
            is ``triton`` or ``fused``; :func:`~distmb.nn.kernels.dispatch.resolve_kernels`).
        precision: ``--precision``: autocast of the training forward, fp16's gradient scaler.
        model: the model, on ``device``.
        optimizer: its optimizer.
        model_spec: what the model is in checkpoints and records (a built-in's name or a
            ``package.module:Class``).
        adjacency: what the samplers read in-neighbour lists from: the part's array, or the
            out-of-core :class:`NeighborFile` (``--graph-layout ooc``).
        normalization: ``--normalize-features``'s statistics (None: rows as stored).
        feature_sources: the host feature sources of training and evaluation.
        device_stages: the device path's sampler and feature cache, or None on the C++ path.
        sampler: the sampler of training and evaluation.
        halo: the halo scheme, set up for the model's layers.
        loader: the training BatchLoader (sampler, feature source, labels, on ``device``).
        eval_table: the halo exchange of exact evaluation (None on one rank).
        watchdog: ``--collective-timeout``'s watchdog (a no-op one where there is none).
        counters: the owners of per-epoch counters, in the order of their records.
        notes: the run header's lines about the data path (features and neighbour lists,
            then the device path's stages and the layers' kernels where it is taken).
    """

    comm: RankGroup
    device: torch.device
    kernels: str
    precision: MixedPrecision
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    model_spec: str
    adjacency: np.ndarray | NeighborFile
    normalization: FeatureNormalization | None
    feature_sources: FeatureSources
    device_stages: DeviceStages | None
    sampler: PartSampler
    halo: HaloScheme
    loader: BatchLoader
    eval_table: HaloExchange | None
    watchdog: Watchdog
    counters: list[EpochCounters]
    notes: list[str]


def build_run(
    local: LocalGraph,
    config: TrainConfig,
    *,
    comm: RankGroup | None = None,
    halo: HaloScheme | None = None,
    log: Callable[[str], None] = print,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    device: torch.device | None = None,
) -> RunParts:
    """Build one rank's run on ``local``: check and create the outputs, apply the process
    settings, resolve the device and the kernels, then build the model and optimizer, the
    adjacency, the feature sources, the device path's stages, the sampler, the halo scheme,
    the loader, the evaluation's halo exchange and the watchdog, in this order on every rank
    (the collectives among them: ``--normalize-features``'s statistics, the watchdog's
    communicator).

    Args:
        local: the graph this rank samples from (a whole graph, or one part).
        config: the run's configuration.
        comm: the ranks (default: :class:`SingleProcess`).
        halo: the halo scheme (default: nothing to do, one rank;
            :func:`distmb.engine.build.halo.make_halo_scheme` picks one for P > 1).
        log: prints one line (rank 0's lines only in multi-rank runs).
        model: the user's model instead of ``config.model``'s.
        optimizer: the user's optimizer over the model's parameters.
        device: the training device when the caller resolved it
            (:func:`distmb.engine.device.training_device`); default: resolved here.

    Raises:
        InputError: flags that do not fit together or this machine, an unusable model or
            optimizer.
    """
    comm = comm if comm is not None else SingleProcess()
    prepare_outputs(config, comm.rank)
    configure_process(config, comm.rank, log)
    if device is None:
        device = training_device(config, comm.local_rank())
    else:
        check_device(config, device)
    kernels = configure_kernels(config, device)
    precision = MixedPrecision(config.precision, kernels, device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    built = build_model_and_optimizer(local, config, comm.size, device, model, optimizer)
    # --comm torch: gradient buckets all-reduced during the backward pass (hooks).
    comm.prepare_gradients(built.model, int(config.grad_bucket_mb * 2**20))
    adjacency = open_adjacency(local, config)
    # --normalize-features standard: two all-reduces (column sums, squared deviations)
    # on every rank, here, in this order.
    normalization = fit_normalization(
        config.normalize_features, local.features, local.train_idx, comm
    )
    device_path = uses_device_path(config, device)
    # The GPU path stores the table (--feature-dtype) in the host rows the GPU reads, and
    # the host's readers read those: no second copy.
    feature_sources = open_features(
        local, config, adjacency, normalization, convert=not device_path
    )
    stages = None
    if device_path:
        stages = open_device_stages(
            local, config, device, adjacency, normalization, feature_sources.cache
        )
        feature_sources = reading_host_rows(feature_sources, stages, local.n_solid)
    # The sampler of training and evaluation: the device path's (blocks on the device), or
    # the C++ one (each validates the CSR once: only the one in use is built).
    sampler = (
        stages.sampler
        if stages is not None
        else NeighborSampler(
            local.indptr, adjacency, local.n_solid, local.n_local, config.fanout, config.seed
        )
    )
    halo = halo if halo is not None else HaloScheme()
    halo.setup(built.model.layer_dims())
    loader = BatchLoader(
        halo.batch_sampler(sampler),
        halo.feature_source(stages.features if stages is not None else feature_sources.train),
        local.labels,
        prefetch=config.prefetch,
        superbatch=config.superbatch,
        threads=config.loader_threads or config.threads,
        reuse_buffers=True,  # the loop holds one batch at a time
        device=device,
        # A first layer that reads the feature table through row ids needs only its
        # destinations' rows gathered (--no-gather-in-place: all of block 0's rows).
        in_place=config.gather_in_place
        and not halo.reads_input_rows
        and isinstance(built.model, BlockModel)
        and built.model.reads_input_in_place,
    )
    if stages is not None and config.match_reorder:
        loader.reorder = match_reorder(loader, stages.device_cache)
    notes = [feature_sources.note + describe_adjacency(adjacency, config)]
    if stages is not None:
        notes.append(f"{stages.note}; layers: {kernels_note(config.kernels, kernels)}")
    if precision.note is not None:
        notes.append(precision.note)
    return RunParts(
        comm=comm,
        device=device,
        kernels=kernels,
        precision=precision,
        model=built.model,
        optimizer=built.optimizer,
        model_spec=built.spec,
        adjacency=adjacency,
        normalization=normalization,
        feature_sources=feature_sources,
        device_stages=stages,
        sampler=sampler,
        halo=halo,
        loader=loader,
        eval_table=part_layer_table(comm, local, feature_sources.train),
        # --collective-timeout: a rank that stops mid-run aborts the job instead of hanging.
        watchdog=collective_watchdog(comm, config),
        counters=epoch_counters(config, feature_sources, adjacency, stages),
        notes=notes,
    )


def kernels_note(given: str, kernels: str) -> str:
    """The run header's words on the layers' implementation ``kernels``, which ``--kernels
    given`` selected: ``triton kernels (--kernels auto)``."""
    return f"{kernels} kernels" + (f" (--kernels {given})" if given != kernels else "")
