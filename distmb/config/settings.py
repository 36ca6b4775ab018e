"""Typed, frozen views of a :class:`~distmb.config.train.TrainConfig`, one per concern.

A part of a run that needs a few options takes the view of its concern instead of the whole
configuration: ``config.model_settings`` (:class:`ModelSettings`), ``config.optimizer_settings``
(:class:`OptimizerSettings`), ``config.pipeline`` (:class:`PipelineSettings`),
``config.device_settings`` (:class:`DeviceSettings`), ``config.comm_settings``
(:class:`CommSettings`) and ``config.hec`` (:class:`~distmb.halo.hec.scheme.HecSettings`, defined
by the package that consumes it). Each view is built when read: a snapshot of the configuration's
flat fields, whose names its own fields share (the flag of a field ``batch_size`` is
``--batch-size``, :func:`distmb.config.train.flag_of`). A view's property takes the concern's name,
with ``_settings`` where a field already has it (``config.device`` is ``--device``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

__all__ = [
    "CommSettings",
    "DeviceSettings",
    "ModelSettings",
    "OptimizerSettings",
    "PipelineSettings",
    "view_of",
]

_View = TypeVar("_View")


def view_of(settings: type[_View], config: Any) -> _View:
    """The view ``settings`` (a dataclass) of ``config``: each of its fields takes the value of
    ``config``'s attribute of the same name."""
    values = {f.name: getattr(config, f.name) for f in fields(settings)}
    return settings(**values)


@dataclass(frozen=True)
class ModelSettings:
    """The model's architecture (``config.model_settings``).

    Args:
        model: ``sage``, ``gat``, ``gcn``, ``gin``, or a user's ``package.module:Class``.
        layers: GNN layers.
        hidden: hidden width (per head for GAT).
        heads: attention heads (GAT).
        aggr: GraphSAGE's aggregator (``mean``, ``sum`` or ``gcn``).
        gin_eps: GIN's eps: ``(1 + eps)`` weighs a vertex's own row.
        gin_train_eps: GIN's eps is learned (per layer).
        dropout: probability of dropping a hidden unit, in ``[0, 1)``.
    """

    model: str
    layers: int
    hidden: int
    heads: int
    aggr: str
    gin_eps: float
    gin_train_eps: bool
    dropout: float


@dataclass(frozen=True)
class OptimizerSettings:
    """Adam and its learning-rate schedule (``config.optimizer_settings``).

    Args:
        lr: the learning rate (the model's default when ``--lr`` is not given).
        weight_decay: Adam's weight decay.
        lr_schedule: ``none``, ``cosine`` or ``step``, stepped once per epoch.
        lr_step_size: ``step``: epochs between two decays.
        lr_gamma: ``step``: factor applied to the learning rate at each decay, in ``(0, 1]``.
        lr_min: ``cosine``: the learning rate reached at the last epoch.
        epochs: training epochs (``cosine``'s period).
    """

    lr: float
    weight_decay: float
    lr_schedule: str
    lr_step_size: int
    lr_gamma: float
    lr_min: float
    epochs: int


@dataclass(frozen=True)
class PipelineSettings:
    """The mini-batch pipeline: sampling, prefetching and where rows are read from
    (``config.pipeline``).

    Args:
        batch_size: seed vertices per mini-batch.
        fanout: neighbours sampled per layer, input layer first (``-1``: all).
        prefetch: mini-batches prepared ahead by a background thread (0: synchronous).
        gather_in_place: every input row of block 0 is gathered into a batch buffer
            (``False``: a fused GraphSAGE first layer on one rank reads them in place).
        sampler: ``auto``, ``cpp`` or ``device``.
        loader_threads: OpenMP threads of the prefetch thread (``None``: ``--threads``).
        features: ``memory``, ``mmap`` or ``ooc`` (``None``: by the partition's layout).
        feature_cache_mb: MiB of feature rows cached with ``features="ooc"``.
        cache_policy: that cache's policy (``belady``, ``presc``, ``degree``, ``lru``, ``none``).
        superbatch: mini-batches sampled ahead as one superbatch.
        presample_epochs: epochs pre-sampled to rank the ``presc`` caches' rows.
        graph_layout: in-neighbour lists memory-mapped (``mmap``) or read out of core (``ooc``).
        neighbor_cache_mb: MiB of in-neighbour lists cached with ``graph_layout="ooc"``.
        neighbor_cache_order: which lists that cache holds (``degree`` or ``ratio``).
        feature_dtype: the dtype a rank stores its feature table in (``float32``, ``float16``
            or ``bfloat16``; the CPU path's table, the GPU path's host rows and device cache).
    """

    batch_size: int
    fanout: tuple[int, ...]
    prefetch: int
    gather_in_place: bool
    sampler: str
    loader_threads: int | None
    features: str | None
    feature_cache_mb: float
    cache_policy: str
    superbatch: int
    presample_epochs: int
    graph_layout: str
    neighbor_cache_mb: float
    neighbor_cache_order: str
    feature_dtype: str


@dataclass(frozen=True)
class DeviceSettings:
    """Where and how the model computes, and the GPU path's options (``config.device_settings``).

    ``device`` is the flag's text; :func:`distmb.engine.device.resolve_device` resolves it.

    Args:
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
        kernels: the layers' implementation (``auto``, resolved on the training device, or
            ``fused``, ``torch`` or ``triton``).
        precision: the forward's precision (``fp32``, ``bf16`` or ``fp16``).
        graph_placement: the GPU sampler's CSR in GPU memory (``device``) or pinned host
            memory (``host``).
        device_cache_mb: MiB of feature rows cached in GPU memory.
        device_cache_policy: rows that cache holds (``presc``, ``degree`` or ``none``).
        match_reorder: FastGL's Match-Reorder of the batches within each superbatch.
    """

    device: str
    kernels: str
    precision: str
    graph_placement: str
    device_cache_mb: float
    device_cache_policy: str
    match_reorder: bool


@dataclass(frozen=True)
class CommSettings:
    """The collectives of a multi-rank run (``config.comm_settings``).

    Args:
        comm: the collectives' library (``auto``, ``mpi`` or ``torch``).
        grad_bucket_mb: MiB of gradients per bucket of the overlapped all-reduce (0: one
            all-reduce after the backward pass).
        collective_timeout: seconds a rank may wait in one collective before the job is
            aborted (0: no watchdog).
    """

    comm: str
    grad_bucket_mb: float
    collective_timeout: float
