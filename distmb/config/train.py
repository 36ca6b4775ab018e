"""The options of ``python -m distmb.train``, each declared exactly once.

Every option is a field of :class:`TrainConfig` declared with :func:`option`: the field gives
its name, type and default; the field's metadata (an :class:`OptionSpec`) gives its flag,
help, group, constraints and markers. Everything else is derived from these declarations:

- :func:`build_parser`: the argparse parser of ``python -m distmb.train``;
- :func:`config_from_args` and :func:`parse_config`: a validated :class:`TrainConfig` from
  the flags (every constraint is checked generically, a few relations between options are
  written out in :meth:`TrainConfig.validate`);
- :data:`RESUME_MUST_MATCH`: the options a checkpoint must share with the run resuming it;
- :func:`flag_table_markdown`: ``docs/flags.md``, written by
  ``python -m distmb.config --markdown > docs/flags.md``.

This module imports neither torch nor the C++ extension; the aggregator names are looked up
in :data:`distmb.nn.AGGREGATORS` only when an ``--aggr`` value is checked.
"""

from __future__ import annotations

import argparse
import numbers
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal

import numpy as np

from distmb.comm.watchdog import DEFAULT_COLLECTIVE_TIMEOUT_S, TORCHRUN_TIMEOUT_S
from distmb.core.errors import InputError
from distmb.core.machine import MAX_THREADS
from distmb.core.malloc import DEFAULT_MALLOC_POLICY, MALLOC_POLICIES
from distmb.core.progress import DEFAULT_PROGRESS_EVERY
from distmb.halo.hec.scheme import HecSettings
from distmb.nn.user import is_model_spec
from distmb.pipeline.features.cached import CACHE_POLICIES
from distmb.pipeline.features.device import DEVICE_CACHE_POLICIES
from distmb.pipeline.features.normalize import NORMALIZATIONS

__all__ = [
    "DEFAULT_COLLECTIVE_TIMEOUT_S",
    "TORCHRUN_TIMEOUT_S",
    "DEFAULT_FANOUT",
    "DEFAULT_HEC_DELAY",
    "DEFAULT_HEC_LIFESPAN",
    "DEFAULT_HEC_NC",
    "DEFAULT_HEC_SIZE",
    "DEFAULT_LR",
    "DEFAULT_PARTITION_CACHE",
    "DEFAULT_PREFETCH",
    "DEFAULT_USER_MODEL_LR",
    "DESCRIPTION",
    "GENERATED_NOTE",
    "CACHE_POLICIES",
    "DEFAULT_DEVICE_CACHE_MB",
    "DEFAULT_FEATURE_CACHE_MB",
    "DEVICE_CACHE_POLICIES",
    "DEFAULT_SUPERBATCH",
    "FEATURE_SOURCES",
    "GRAPH_LAYOUTS",
    "GROUP_CUDA",
    "GROUP_DATA_LOADING",
    "GROUP_FEATURES",
    "GROUP_HEC",
    "GROUP_MAIN",
    "GROUP_SELECTION",
    "LR_SCHEDULES",
    "NORMALIZATIONS",
    "KERNELS",
    "MAX_THREADS",
    "MODELS",
    "OPTIONS",
    "PRECISIONS",
    "PROG",
    "RESUME_APPLIED",
    "RESUME_MUST_MATCH",
    "HaloScheme",
    "HecSettings",
    "Option",
    "OptionSpec",
    "TrainConfig",
    "build_parser",
    "config_from_args",
    "flag_of",
    "flag_table_markdown",
    "is_model_spec",
    "main",
    "option",
    "parse_config",
]

#: The command whose flags this module declares.
PROG = "python -m distmb.train"
#: ``--help``'s description of :data:`PROG`.
DESCRIPTION = (
    "Mini-batch GNN training (GraphSAGE / GAT / GCN / GIN, or your own model) with local "
    "thread-parallel sampling and exact layer-wise evaluation."
)

#: Learning rates, one per model, when ``--lr`` is not given: the paper's (Table 2, single
#: socket) for SAGE and GAT; GCN and GIN take SAGE's.
DEFAULT_LR: dict[str, float] = {"sage": 0.003, "gat": 0.001, "gcn": 0.003, "gin": 0.003}
#: The built-in models of ``--model`` (those with a default learning rate).
MODELS: tuple[str, ...] = tuple(DEFAULT_LR)
#: Learning rate of a user's model (``--model package.module:Class``) without ``--lr``.
DEFAULT_USER_MODEL_LR = 0.003
#: ``--comm``: the collectives' library (torch: RankGroup.use_torch_distributed); ``auto``
#: is torch on a GPU or under torchrun and mpi on the CPU
#: (:func:`distmb.engine.device.resolve_comm`).
COMM_BACKENDS: tuple[str, ...] = ("auto", "mpi", "torch")
#: ``--grad-bucket-mb``: MiB of gradients per bucket of the overlapped all-reduce (``--comm
#: torch``; smaller than DDP's 25 MiB because GNN models are small: a few buckets per model).
DEFAULT_GRAD_BUCKET_MB = 0.25
#: The implementations of ``--kernels``.
KERNELS: tuple[str, ...] = ("fused", "torch", "triton")
#: ``--precision``: the model's forward in float32, or under autocast to bfloat16 / float16
#: (:mod:`distmb.engine.precision`).
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
#: Neighbours sampled per layer, input layer first (paper's Table 2; three layers).
DEFAULT_FANOUT: tuple[int, ...] = (5, 10, 15)
#: HEC defaults of the paper (docs/design.md): lines per layer (cs), rows pushed per peer and
#: layer per iteration (nc), life-span in iterations (ls), delay of a push in iterations (d).
DEFAULT_HEC_SIZE = 1_000_000
DEFAULT_HEC_NC = 2000
DEFAULT_HEC_LIFESPAN = 2
DEFAULT_HEC_DELAY = 1
#: Mini-batches prepared ahead of the one that trains (0: none, synchronous).
DEFAULT_PREFETCH = 2
#: Largest --seed: torch.manual_seed and the samplers take seeds below 2**63.
MAX_SEED = 2**63 - 1
#: Largest --fanout value (the sampler's per-block counts are 32-bit).
MAX_FANOUT = 2**31 - 1
#: Where input feature rows are read from (``--features``): in memory, memory-mapped (the OS
#: page cache, what DGL/PyG users do), or out of core (direct reads behind a cache).
FEATURE_SOURCES: tuple[str, ...] = ("memory", "mmap", "ooc")
#: Default size of the device feature cache, MiB (clamped to the table).
DEFAULT_DEVICE_CACHE_MB = 4096.0
#: ``--sampler``: ``auto`` (``device`` on a GPU, else ``cpp``), the C++ sampler, or the GPU
#: path's PyTorch-ops sampler (:mod:`distmb.pipeline.sample.device`; on the CPU too, for tests).
SAMPLERS: tuple[str, ...] = ("auto", "cpp", "device")
#: ``--graph-placement``: the CSR in GPU memory, or in pinned host memory read zero-copy.
GRAPH_PLACEMENTS: tuple[str, ...] = ("device", "host")
#: ``--device`` values: ``cpu``, ``auto``, ``cuda`` or ``cuda:N``.
DEVICE_PATTERN = re.compile(r"cpu|auto|cuda(:[0-9]+)?")
#: Where the in-neighbour lists (``indices``) are read from (``--graph-layout``).
GRAPH_LAYOUTS: tuple[str, ...] = ("mmap", "ooc")
#: Orders in which the static neighbour cache takes vertices (``--neighbor-cache-order``).
NEIGHBOR_CACHE_ORDERS: tuple[str, ...] = ("degree", "ratio")
#: Learning-rate schedules of ``--lr-schedule``, stepped once per epoch.
LR_SCHEDULES: tuple[str, ...] = ("none", "cosine", "step")
#: Default size of the out-of-core neighbour cache, MiB.
DEFAULT_NEIGHBOR_CACHE_MB = 256.0
#: Default size of the out-of-core feature cache, MiB (clamped to the table).
DEFAULT_FEATURE_CACHE_MB = 1024.0
#: Default mini-batches per superbatch (what the Belady inspector sees ahead).
DEFAULT_SUPERBATCH = 32
#: Where ``--dataset`` is partitioned for a multi-rank run without ``--part-dir``.
DEFAULT_PARTITION_CACHE = ".cache/distmb-parts"

#: Argument groups (their titles), in the order of ``--help`` and ``docs/flags.md``.
#: :data:`GROUP_MAIN` is the title of the parser's own group.
GROUP_MAIN = "options"
GROUP_DATA_LOADING = "data loading"
GROUP_FEATURES = "input features: in memory, memory-mapped or out of core"
GROUP_CUDA = (
    "GPU path (--device cuda; or --sampler device on the CPU): graph placement, device feature "
    "cache, Match-Reorder"
)
GROUP_HEC = "multi-rank (mpirun -np P): historical embedding cache"
GROUP_SELECTION = "model selection: best epoch, early stopping, lr schedule, feature normalisation"



#: How halo (remote) leaves of a multi-rank mini-batch are handled, see
#: :attr:`TrainConfig.halo_scheme`.
HaloScheme = Literal["hec", "drop", "exact"]

#: Key of the :class:`OptionSpec` in a field's metadata.
_SPEC = "distmb.option"


@dataclass(frozen=True)
class OptionSpec:
    """Everything an option declares beyond its name, type and default.

    Args:
        help: ``--help`` text.
        flag: the flag; ``None`` means ``--`` and the field name with dashes.
        group: title of the argument group (:data:`GROUP_MAIN`: the parser's own).
        exclusive: options of one group with the same name here exclude each other.
        choices: the allowed values, checked by argparse (``invalid choice``).
        allowed: returns the allowed values; checked after parsing (an :class:`InputError`),
            so that they can be looked up lazily.
        min: lower bound (``None`` values always pass: they mean "the default").
        min_open: the lower bound itself is excluded (``> min`` instead of ``>= min``).
        max: upper bound.
        max_open: the upper bound itself is excluded.
        inverted: a ``bool`` option whose flag turns it off (``--no-progress``).
        resume_must_match: a checkpoint can only be resumed with the same value (it shapes
            the model, the sampled batches or the cache's contents).
        resume_applied: a checkpoint may be resumed with another value, which is applied
            (over the optimizer state it overrides, for ``--lr`` and ``--weight-decay``) and
            logged. Options that are neither are run-time choices (paths, threads, epochs).
    """

    help: str
    flag: str | None = None
    group: str = GROUP_MAIN
    exclusive: str | None = None
    choices: tuple[str, ...] | None = None
    allowed: Callable[[], Sequence[str]] | None = None
    min: float | None = None
    min_open: bool = False
    max: float | None = None
    max_open: bool = False
    inverted: bool = False
    resume_must_match: bool = False
    resume_applied: bool = False


def option(default: Any, help: str, **spec: Any) -> Any:
    """Declare a :class:`TrainConfig` field as an option.

    Args:
        default: the default, in Python and on the command line.
        help: ``--help`` text.
        **spec: the other fields of :class:`OptionSpec`.

    Returns:
        a :func:`dataclasses.field` carrying the :class:`OptionSpec` in its metadata.
    """
    return field(default=default, metadata={_SPEC: OptionSpec(help=help, **spec)})


def _aggregators() -> tuple[str, ...]:
    from distmb.nn import AGGREGATORS  # imports torch: only when an --aggr value is checked

    return tuple(AGGREGATORS)


@dataclass(kw_only=True)
class TrainConfig:
    """Hyper-parameters and run options: the flags of ``python -m distmb.train``.

    Built in Python, unset fields take the command line's defaults; ``lr=None`` (the
    default) becomes the model's :data:`DEFAULT_LR` at construction. Every construction is
    validated (:meth:`validate`): an invalid value raises an :class:`InputError` naming its
    flag. Fields assigned later are not re-validated (call :meth:`validate`), and ``lr`` is
    not re-resolved when ``model`` changes.
    """

    dataset: str | None = option(
        None,
        "dataset spec (synthetic[:k=v,...] | cora | planetoid:DIR | npz:FILE | ogb:DIR | "
        "edgelist:DIR); cora is shipped in the package; default: synthetic",
        exclusive="input",
    )
    verify: bool = option(
        True,
        "do not check the partition's files when opening them (by default each part's "
        "sha256 and value ranges are checked once per version of its files)",
        flag="--no-verify",
        inverted=True,
    )
    part_dir: str | None = option(None, "partition directory (distmb-partition)", exclusive="input")
    model: str = option(
        "sage",
        f"GNN model: {', '.join(MODELS)}, or your own as package.module:Class (imported, "
        "built with the keyword arguments in_dim, hidden, num_classes, num_layers, dropout "
        "its __init__ accepts; docs/api.md)",
        resume_must_match=True,
    )
    layers: int = option(3, "number of GNN layers", min=1, resume_must_match=True)
    hidden: int = option(256, "hidden width (per head for GAT)", min=1, resume_must_match=True)
    heads: int = option(4, "attention heads (GAT)", min=1, resume_must_match=True)
    fanout: tuple[int, ...] = option(
        DEFAULT_FANOUT,
        "neighbours sampled per layer, input layer first (one per layer; -1 = all)",
        resume_must_match=True,
    )
    gin_eps: float = option(
        0.0, "GIN's eps: (1 + eps) weighs a vertex's own row", resume_must_match=True
    )
    gin_train_eps: bool = option(False, "learn GIN's eps (per layer)", resume_must_match=True)
    aggr: str = option(
        "mean",
        "GraphSAGE aggregator: mean, sum or gcn",
        allowed=_aggregators,
        resume_must_match=True,
    )
    batch_size: int = option(1000, "seed vertices per mini-batch", min=1, resume_must_match=True)
    lr: float | None = option(
        None,
        "Adam learning rate (default: "
        + ", ".join(f"{lr} for {model}" for model, lr in DEFAULT_LR.items())
        + ")",
        min=0,
        min_open=True,
        resume_applied=True,
    )
    weight_decay: float = option(0.0, "Adam weight decay", min=0, resume_applied=True)
    dropout: float = option(
        0.5, "dropout after hidden layers", min=0, max=1, max_open=True, resume_must_match=True
    )
    epochs: int = option(40, "training epochs", min=1)
    seed: int = option(
        0, "seed of model init, shuffling, sampling", min=0, max=MAX_SEED, resume_must_match=True
    )
    threads: int | None = option(
        None, "threads for sampling and PyTorch (default: all cores)", min=1, max=MAX_THREADS
    )
    malloc: str = option(
        DEFAULT_MALLOC_POLICY,
        "C allocator policy: retain (glibc keeps freed memory for the next batch's buffers "
        "instead of unmapping and page-faulting them afresh; resident memory stays near its "
        "peak) or system (the C library's defaults); distmb/core/malloc.py",
        choices=MALLOC_POLICIES,
    )
    device: str = option(
        "cpu",
        "where training runs: cpu; cuda or cuda:N (one rank on one GPU: GPU sampling, a device "
        "feature cache over zero-copy host rows, PyTorch ops; docs/cuda.md); auto (cuda when "
        "torch sees a GPU, else cpu)",
    )
    eval_every: int = option(1, "evaluate every N epochs", min=1)
    eval_batch_size: int = option(4096, "destinations per block in layer-wise evaluation", min=1)
    checkpoint_dir: str | None = option(None, "write a checkpoint here after every epoch (atomic)")
    resume: bool = option(False, "continue from --checkpoint-dir's checkpoint")
    overwrite_checkpoint: bool = option(
        False,
        "start a new run in a --checkpoint-dir that already holds a checkpoint (replaced after "
        "the first epoch); without it or --resume such a run is refused",
    )
    results: str | None = option(
        None,
        "append one JSON object per epoch to this file (plot: python -m distmb.report FILE)",
    )
    progress: bool = option(
        True, "no progress bar or progress lines", flag="--no-progress", inverted=True
    )
    progress_every: float = option(
        DEFAULT_PROGRESS_EVERY,
        "seconds between plain progress lines (epoch, iteration/total, samples/s, ETA; also "
        "evaluation and loading) on rank 0 when stderr is not a terminal (mpirun/srun logs, "
        "redirected output); 0 = none. On a terminal: one updating bar",
        min=0,
    )
    tensorboard: str | None = option(
        None,
        "also log every epoch's scalars (loss, accuracies, times, cache hit rates) as "
        "TensorBoard events in this directory (rank 0; needs pip install tensorboard)",
    )
    kernels: str = option(
        "fused",
        "UPDATE/AGG implementation: fused (C++ kernels on the CPU, float32; PyTorch ops on a "
        "GPU), torch (PyTorch ops) or triton (the Triton CSR aggregation on CUDA tensors, "
        "PyTorch ops for the rest; needs Triton)",
        choices=KERNELS,
        resume_applied=True,
    )
    precision: str = option(
        "fp32",
        "the model's forward in float32, or under autocast: bf16 (GPU; CPU with --kernels "
        "torch) or fp16 (GPU only, with a gradient scaler); loss, gradients, optimizer and "
        "evaluation stay float32",
        choices=PRECISIONS,
        resume_applied=True,
    )
    early_stop: int = option(
        0,
        "stop after this many evaluations (see --eval-every) without a better validation "
        "accuracy (0 = off); the run reports, and with --checkpoint-dir keeps in best.pt, the "
        "epoch of the best validation accuracy either way",
        group=GROUP_SELECTION,
        min=0,
    )
    lr_schedule: str = option(
        "none",
        "learning-rate schedule, stepped once per epoch: none (constant --lr), cosine (from "
        "--lr down to --lr-min at the last of --epochs; torch's CosineAnnealingLR) or step "
        "(--lr times --lr-gamma every --lr-step-size epochs; torch's StepLR)",
        group=GROUP_SELECTION,
        choices=LR_SCHEDULES,
        resume_must_match=True,
    )
    lr_step_size: int = option(
        10,
        "--lr-schedule step: epochs between two decays",
        group=GROUP_SELECTION,
        min=1,
        resume_must_match=True,
    )
    lr_gamma: float = option(
        0.1,
        "--lr-schedule step: factor applied to the lr at each decay",
        group=GROUP_SELECTION,
        min=0,
        min_open=True,
        max=1,
        resume_must_match=True,
    )
    lr_min: float = option(
        0.0,
        "--lr-schedule cosine: the lr reached at the last epoch",
        group=GROUP_SELECTION,
        min=0,
        resume_must_match=True,
    )
    normalize_features: str = option(
        "none",
        "input feature normalisation, applied to every row read (training, evaluation, halo "
        "rows; the partition's files are not changed): row (each row divided by its sum; "
        "rows summing to 0 stay 0; PyG's NormalizeFeatures on bag-of-words rows) or standard "
        "(per column (x - mean) / std, mean and std over the training vertices of all ranks; "
        "columns with std 0 only centred)",
        group=GROUP_SELECTION,
        choices=NORMALIZATIONS,
        resume_must_match=True,
    )
    prefetch: int = option(
        DEFAULT_PREFETCH,
        "mini-batches sampled and gathered ahead by a background thread while the current "
        "one trains (0 = synchronous)",
        group=GROUP_DATA_LOADING,
        min=0,
    )
    gather_in_place: bool = option(
        True,
        "gather all of block 0's input rows into a batch buffer; by default a fused GraphSAGE "
        "first layer on one rank reads its neighbours' rows from the in-memory feature table "
        "through their ids, and only its destinations' own rows are gathered (same results)",
        flag="--no-gather-in-place",
        inverted=True,
        group=GROUP_DATA_LOADING,
    )
    sampler: str = option(
        "auto",
        "neighbour sampler: cpp (thread-parallel C++), device (the GPU path's PyTorch-ops "
        "sampler with the device feature cache; on the CPU it runs that path on CPU tensors, "
        "for testing) or auto (device with --device cuda, else cpp)",
        group=GROUP_DATA_LOADING,
        choices=SAMPLERS,
    )
    loader_threads: int | None = option(
        None,
        "OpenMP threads of the prefetch thread's sampling kernels (default: --threads); "
        "with prefetching, sampling and training share the cores",
        group=GROUP_DATA_LOADING,
        min=1,
        max=MAX_THREADS,
    )
    features: str | None = option(
        None,
        "where feature rows are read from: memory (loaded into RAM), mmap (memory-mapped; the "
        "OS page cache), ooc (direct reads behind --feature-cache-mb with --cache-policy; "
        "needs a partition in the ooc layout); default: ooc for an ooc partition, else mmap",
        group=GROUP_FEATURES,
        choices=FEATURE_SOURCES,
    )
    feature_cache_mb: float = option(
        DEFAULT_FEATURE_CACHE_MB,
        "MiB of feature rows cached in memory with --features ooc (per rank; clamped to the "
        "table; 0 = no cache, every row from disk)",
        group=GROUP_FEATURES,
        min=0,
    )
    cache_policy: str = option(
        "belady",
        "--features ooc cache: belady (superbatch inspector, farthest next use out), presc "
        "(static, most used in pre-sampling), degree (static, highest in-degree), lru, none",
        group=GROUP_FEATURES,
        choices=CACHE_POLICIES,
    )
    superbatch: int = option(
        DEFAULT_SUPERBATCH,
        "mini-batches sampled ahead as one superbatch, whose feature reads the belady "
        "inspector plans together (memory: their sampled blocks)",
        group=GROUP_FEATURES,
        min=1,
    )
    presample_epochs: int = option(
        1,
        "epochs pre-sampled (own random stream) to pick the presc cache's rows (--cache-policy "
        "and --device-cache-policy)",
        group=GROUP_FEATURES,
        min=1,
    )
    graph_layout: str = option(
        "mmap",
        "where sampling reads in-neighbour lists: mmap (the part's indices.npy memory-mapped) "
        "or ooc (read from indices.npy with O_DIRECT behind --neighbor-cache-mb; a rank then "
        "holds nothing that grows with the edges; needs --part-dir)",
        group=GROUP_FEATURES,
        choices=GRAPH_LAYOUTS,
    )
    neighbor_cache_mb: float = option(
        DEFAULT_NEIGHBOR_CACHE_MB,
        "MiB of in-neighbour lists cached in memory with --graph-layout ooc (static, filled "
        "before training in --neighbor-cache-order)",
        group=GROUP_FEATURES,
        min=0,
    )
    neighbor_cache_order: str = option(
        "degree",
        "which lists the neighbour cache holds: degree (highest in-degree first: the vertices "
        "sampled most often in a symmetric graph) or ratio (out/in-degree, Ginex's order for "
        "directed graphs)",
        group=GROUP_FEATURES,
        choices=NEIGHBOR_CACHE_ORDERS,
    )
    graph_placement: str = option(
        "device",
        "where the GPU sampler reads the graph's CSR: device (copied into GPU memory) or host "
        "(pinned host memory read by the GPU in place, zero-copy: for graphs larger than the "
        "GPU's memory)",
        group=GROUP_CUDA,
        choices=GRAPH_PLACEMENTS,
    )
    device_cache_mb: float = option(
        DEFAULT_DEVICE_CACHE_MB,
        "MiB of feature rows cached in GPU memory (rows in the table's dtype; clamped to the "
        "table); the other rows are read by the GPU from pinned host memory (zero-copy)",
        group=GROUP_CUDA,
        min=0,
    )
    device_cache_policy: str = option(
        "presc",
        "rows the device cache holds: presc (most used in pre-sampling, own random stream), "
        "degree (highest in-degree) or none (every row from host memory)",
        group=GROUP_CUDA,
        choices=DEVICE_CACHE_POLICIES,
    )
    match_reorder: bool = option(
        False,
        "FastGL's Match-Reorder: reorder the batches within each --superbatch so consecutive "
        "batches share the most input rows, and reuse the previous batch's rows on the GPU "
        "(same batches, another order)",
        group=GROUP_CUDA,
    )
    hec_size: int = option(
        DEFAULT_HEC_SIZE,
        "cache lines per layer (cs)",
        group=GROUP_HEC,
        min=1,
        resume_must_match=True,
    )
    hec_nc: int = option(
        DEFAULT_HEC_NC,
        "rows pushed per peer and layer per iteration at most (nc)",
        group=GROUP_HEC,
        min=1,
        resume_applied=True,
    )
    hec_lifespan: int = option(
        DEFAULT_HEC_LIFESPAN,
        "iterations a cached embedding stays usable (ls)",
        group=GROUP_HEC,
        min=0,
        resume_must_match=True,
    )
    hec_delay: int = option(
        DEFAULT_HEC_DELAY,
        "iterations between a push and its use (d)",
        group=GROUP_HEC,
        min=1,
        resume_applied=True,
    )
    no_hec: bool = option(
        False, "drop halo leaves instead (communication-free lower bound)", group=GROUP_HEC
    )
    exact_remote: bool = option(
        False,
        "DistDGL-like exact baseline instead of the HEC: sample remote neighbours at their "
        "owners and fetch remote features every iteration (no cache, no staleness)",
        group=GROUP_HEC,
    )
    partition_cache: str = option(
        DEFAULT_PARTITION_CACHE,
        "where --dataset is partitioned for P ranks (rank 0 writes it)",
        group=GROUP_HEC,
    )
    comm: str = option(
        "auto",
        "library of the collectives: mpi (mpi4py), torch (torch.distributed: NCCL for GPU "
        "tensors, gloo on the CPU, its group set up from the MPI launch) or auto (torch with "
        "--device cuda, else mpi); with torch the gradient all-reduce (in buckets during the "
        "backward pass), the HEC's embedding push, --exact-remote's exchanges and exact "
        "evaluation's halo exchange go through torch.distributed, the small collectives "
        "through MPI. Under torchrun (no MPI) everything goes through torch.distributed: auto "
        "means torch and mpi is refused",
        group=GROUP_HEC,
        choices=COMM_BACKENDS,
    )
    grad_bucket_mb: float = option(
        DEFAULT_GRAD_BUCKET_MB,
        "MiB of gradients per bucket of the all-reduce with --comm torch: each bucket starts "
        "during the backward pass as soon as its gradients are ready (0 = one all-reduce "
        "after the backward pass)",
        group=GROUP_HEC,
        min=0,
    )
    collective_timeout: float = option(
        DEFAULT_COLLECTIVE_TIMEOUT_S,
        "seconds a rank may wait in one collective (at least 10x the slowest iteration so "
        "far) before the job is aborted naming the rank that stopped sending heartbeats; a "
        "slow but live rank only gets a warning (0 = no watchdog). MPI launches only: under "
        "torchrun a rank that dies ends the job, and one that stops fails its peers' "
        f"collectives after {TORCHRUN_TIMEOUT_S:.0f} s",
        group=GROUP_HEC,
        min=0,
        resume_applied=True,
    )

    def __post_init__(self) -> None:
        if isinstance(self.fanout, list | tuple):
            self.fanout = tuple(_plain(v) for v in self.fanout)
        for f in fields(self):  # numpy scalars -> Python values (JSON and weights-only loads)
            setattr(self, f.name, _plain(getattr(self, f.name)))
        if self.lr is None and isinstance(self.model, str):
            self.lr = DEFAULT_LR.get(
                self.model, DEFAULT_USER_MODEL_LR if is_model_spec(self.model) else None
            )  # an unknown model is reported by validate()
        self.validate()

    def validate(self) -> None:
        """Check every option's constraints, then the relations between options.

        Raises:
            InputError: naming the flag, the constraint and the value.
        """
        for opt in OPTIONS:
            opt.check(getattr(self, opt.name))
        _check_fanout(self.fanout, self.layers)
        if self.model not in MODELS and not is_model_spec(self.model):
            raise InputError(
                f"--model must be one of {', '.join(MODELS)} or package.module:Class, "
                f"got {self.model!r}"
            )
        for a, b in _exclusive_pairs():
            if getattr(self, a.name) != a.default and getattr(self, b.name) != b.default:
                raise InputError(f"{a.flag} and {b.flag} exclude each other")
        if self.exact_remote and self.no_hec:
            raise InputError(
                "--exact-remote and --no-hec exclude each other (pick one halo scheme)"
            )
        if self.resume and not self.checkpoint_dir:
            raise InputError("--resume needs --checkpoint-dir")
        if self.lr_schedule != "step":
            self._only_with(("lr_step_size", "lr_gamma"), "--lr-schedule step")
        if self.lr_schedule != "cosine":
            self._only_with(("lr_min",), "--lr-schedule cosine")
        elif self.lr is not None and self.lr_min >= self.lr:
            raise InputError(
                f"--lr-min {self.lr_min} must be below --lr {self.lr} (the cosine schedule "
                "decreases the lr from --lr to --lr-min)"
            )
        if self.graph_layout != "ooc":
            self._only_with(("neighbor_cache_mb", "neighbor_cache_order"), "--graph-layout ooc")
        if not DEVICE_PATTERN.fullmatch(self.device):
            raise InputError(
                f"--device must be cpu, cuda, cuda:N (a GPU index) or auto, got {self.device!r}"
            )
        if self.device == "cpu" and self.sampler != "device":
            self._only_with(
                tuple(o.name for o in OPTIONS if o.spec.group == GROUP_CUDA),
                "the GPU path (--device cuda, or --sampler device)",
            )
        if self.device == "cpu":
            problem = precision_problem(self.precision, self.kernels, "cpu")
            if problem:
                raise InputError(problem)
        if self.features in ("memory", "mmap"):
            # --presample-epochs also ranks the device cache's rows (--device-cache-policy).
            device_path = self.device != "cpu" or self.sampler == "device"
            self._only_with(
                ("feature_cache_mb", "cache_policy")
                + (() if device_path else ("presample_epochs",)),
                f"--features ooc, not --features {self.features}",
            )

    def _only_with(self, names: tuple[str, ...], where: str) -> None:
        """Refuse the options ``names`` given (not at their defaults) outside ``where``."""
        given = [o.flag for o in OPTIONS if o.name in names and getattr(self, o.name) != o.default]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise InputError(f"{', '.join(given)} {verb} only to {where}")

    @property
    def hec(self) -> HecSettings:
        """The ``--hec-*`` and ``--no-hec`` flags."""
        return HecSettings(
            enabled=not self.no_hec,
            size=self.hec_size,
            nc=self.hec_nc,
            lifespan=self.hec_lifespan,
            delay=self.hec_delay,
        )

    @property
    def halo_scheme(self) -> HaloScheme:
        """``"exact"`` (``--exact-remote``), ``"drop"`` (``--no-hec``) or ``"hec"``."""
        if self.exact_remote:
            return "exact"
        return "drop" if self.no_hec else "hec"

    def as_dict(self) -> dict[str, Any]:
        """Every option by field name (tuples as lists): the JSON record's and the
        checkpoint's ``"args"``."""
        record = {}
        for f in fields(self):
            value = getattr(self, f.name)
            record[f.name] = list(value) if isinstance(value, tuple) else value
        return record


def precision_problem(precision: str, kernels: str, device_type: str) -> str | None:
    """Why ``--precision`` cannot run with ``--kernels`` on a ``device_type`` device
    (``"cpu"`` or ``"cuda"``), or None when it can."""
    if precision == "fp16" and device_type != "cuda":
        return (
            "--precision fp16 needs a GPU (--device cuda): float16 autocast with a gradient "
            "scaler is a CUDA feature; on the CPU use --precision bf16 --kernels torch"
        )
    if precision == "bf16" and device_type == "cpu" and kernels == "fused":
        return (
            "--precision bf16 with --kernels fused on the CPU: the fused C++ kernels compute "
            "in float32 only (autocast would not reach them); add --kernels torch to train "
            "the PyTorch-ops layers under CPU bfloat16 autocast"
        )
    return None


@dataclass(frozen=True)
class Option:
    """One option: a :class:`TrainConfig` field and its :class:`OptionSpec`.

    Args:
        name: the field's name.
        type: the value's type without ``None``: ``bool``, ``int``, ``float``, ``str`` or
            ``tuple`` (of ``int``, comma-separated on the command line).
        nullable: ``None`` is a value (it means "the default described in the help").
        default: the field's default.
        spec: what the field declares beyond that.
    """

    name: str
    type: type
    nullable: bool
    default: Any
    spec: OptionSpec

    @property
    def flag(self) -> str:
        """The command-line flag, e.g. ``--batch-size``."""
        return self.spec.flag or "--" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        """The flag's attribute in argparse's namespace, e.g. ``no_progress``."""
        return self.flag[2:].replace("-", "_")

    @property
    def cli_default(self) -> Any:
        """The default as the parser holds it (``--fanout``: ``"5,10,15"``)."""
        if self.type is bool:
            return False
        if self.type is tuple:
            return ",".join(map(str, self.default))
        return self.default

    def allowed_values(self) -> Sequence[str] | None:
        """The allowed values (``choices`` or ``allowed``), ``None`` if unrestricted."""
        if self.spec.choices is not None:
            return self.spec.choices
        return self.spec.allowed() if self.spec.allowed is not None else None

    def add_to(self, container: argparse._ActionsContainer) -> None:
        """Add the flag to a parser, argument group or mutually exclusive group."""
        kwargs: dict[str, Any] = {"help": self.spec.help}
        if self.type is bool:
            kwargs["action"] = "store_true"
        else:
            if self.type in (int, float):
                kwargs["type"] = self.type
            kwargs["default"] = self.cli_default
            if self.spec.choices is not None:
                kwargs["choices"] = self.spec.choices
        container.add_argument(self.flag, **kwargs)

    def from_cli(self, value: Any) -> Any:
        """The field's value for the parsed ``value`` of the flag."""
        if self.spec.inverted:
            return not value
        if self.type is tuple and isinstance(value, str):
            try:
                return tuple(int(v) for v in value.split(","))
            except ValueError:
                raise InputError(
                    f"{self.flag} {value!r}: expected comma-separated integers"
                ) from None
        return value

    def check(self, value: Any) -> None:
        """Check ``value`` against the type and the constraints.

        Raises:
            InputError: naming the flag, the constraint and the value.
        """
        if value is None and self.nullable:
            return
        if not _is_a(value, self.type):
            raise InputError(f"{self.flag} must be {_TYPE_NAMES[self.type]}, got {value!r}")
        allowed = self.allowed_values()
        if allowed is not None and value not in allowed:
            raise InputError(f"{self.flag} must be one of {', '.join(allowed)}, got {value!r}")
        bound = self.bound_text()
        if bound and not self._within_bounds(value):
            raise InputError(f"{self.flag} must be {bound}, got {value}")

    def bound_text(self) -> str:
        """``">= 1"``, ``"> 0"``, ``"in [0, 1)"``, or ``""`` without bounds."""
        lo, hi, spec = self.spec.min, self.spec.max, self.spec
        if lo is not None and hi is not None:
            return f"in {'(' if spec.min_open else '['}{lo}, {hi}{')' if spec.max_open else ']'}"
        if lo is not None:
            return f"{'>' if spec.min_open else '>='} {lo}"
        if hi is not None:
            return f"{'<' if spec.max_open else '<='} {hi}"
        return ""

    def _within_bounds(self, value: float) -> bool:
        # Written so that NaN fails every bound.
        spec = self.spec
        if spec.min is not None and not (value > spec.min if spec.min_open else value >= spec.min):
            return False
        return spec.max is None or bool(value < spec.max if spec.max_open else value <= spec.max)


_TYPE_NAMES: dict[type, str] = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    tuple: "a tuple of integers",
}


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value it holds (anything else unchanged)."""
    return value.item() if isinstance(value, np.generic) else value


def _is_a(value: Any, kind: type) -> bool:
    """Whether ``value`` fits an option of type ``kind`` (numpy integers count as ``int``)."""
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind is int:
        return isinstance(value, numbers.Integral)
    if kind is float:
        return isinstance(value, numbers.Real)
    if kind is tuple:
        return isinstance(value, tuple) and all(_is_a(v, int) for v in value)
    return isinstance(value, kind)


def _check_fanout(fanout: tuple[int, ...], layers: int) -> None:
    """One fan-out per layer, each >= 1 or -1 (all neighbours)."""
    text = ",".join(map(str, fanout))
    if len(fanout) != layers:
        raise InputError(
            f"--fanout {text!r} lists {len(fanout)} values but --layers is {layers}; "
            "give one fan-out per layer"
        )
    if any(f == 0 or f < -1 for f in fanout):
        raise InputError(f"--fanout {text!r}: each value must be >= 1 (or -1 for all)")
    if any(f > MAX_FANOUT for f in fanout):
        raise InputError(
            f"--fanout {text!r}: each value must be <= {MAX_FANOUT} (or -1 for all neighbours)"
        )


def _options(cls: type) -> tuple[Option, ...]:
    """The options declared by ``cls``'s fields, in field order."""
    hints = typing.get_type_hints(cls)
    options = []
    for f in fields(cls):
        spec = f.metadata.get(_SPEC)
        if spec is None or f.default is MISSING:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with option()")
        kind, nullable = hints[f.name], False
        if typing.get_origin(kind) in (typing.Union, types.UnionType):
            members = [t for t in typing.get_args(kind) if t is not type(None)]
            kind, nullable = members[0], len(members) < len(typing.get_args(kind))
        kind = typing.get_origin(kind) or kind
        if kind not in _TYPE_NAMES:
            raise TypeError(f"{cls.__name__}.{f.name}: unsupported option type {kind!r}")
        if kind is bool and f.default is not spec.inverted:
            raise TypeError(f"{cls.__name__}.{f.name}: a flag's default must be {spec.inverted}")
        options.append(Option(f.name, kind, nullable, f.default, spec))
    return tuple(options)


#: Every option, in the order of ``--help``.
OPTIONS: tuple[Option, ...] = _options(TrainConfig)
#: Options a checkpoint must share with the run that resumes it (they shape the model or
#: the sampled data).
RESUME_MUST_MATCH: tuple[str, ...] = tuple(o.name for o in OPTIONS if o.spec.resume_must_match)
#: Options a resume may change: the new value is applied and logged.
RESUME_APPLIED: tuple[str, ...] = tuple(o.name for o in OPTIONS if o.spec.resume_applied)

_FLAGS: dict[str, str] = {o.name: o.flag for o in OPTIONS}


def flag_of(name: str) -> str:
    """The command-line flag of the option (field) ``name``, e.g. ``batch_size`` ->
    ``--batch-size``, ``progress`` -> ``--no-progress``.

    Raises:
        KeyError: ``name`` is not an option.
    """
    return _FLAGS[name]


def _groups() -> dict[str, list[Option]]:
    """The options by group title, groups in order of first appearance."""
    groups: dict[str, list[Option]] = {GROUP_MAIN: []}
    for opt in OPTIONS:
        groups.setdefault(opt.spec.group, []).append(opt)
    return groups


def _exclusive_pairs() -> list[tuple[Option, Option]]:
    """Every pair of options that exclude each other."""
    sets: dict[tuple[str, str], list[Option]] = {}
    for opt in OPTIONS:
        if opt.spec.exclusive is not None:
            sets.setdefault((opt.spec.group, opt.spec.exclusive), []).append(opt)
    return [
        (a, b) for members in sets.values() for i, a in enumerate(members) for b in members[i + 1 :]
    ]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m distmb.train``: one flag per option of :data:`OPTIONS`."""
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    for title, options in _groups().items():
        group = parser if title == GROUP_MAIN else parser.add_argument_group(title)
        exclusive: dict[str, argparse._MutuallyExclusiveGroup] = {}
        for opt in options:
            container: argparse._ActionsContainer = group
            if opt.spec.exclusive is not None:
                if opt.spec.exclusive not in exclusive:
                    exclusive[opt.spec.exclusive] = group.add_mutually_exclusive_group()
                container = exclusive[opt.spec.exclusive]
            opt.add_to(container)
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Validate the parsed flags and turn them into a :class:`TrainConfig`.

    Args:
        args: the namespace of :func:`build_parser`.

    Raises:
        InputError: naming the flag and what was expected.
    """
    return TrainConfig(**{opt.name: opt.from_cli(getattr(args, opt.dest)) for opt in OPTIONS})


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Parse and validate the flags of ``python -m distmb.train``.

    Args:
        argv: the arguments after the program name; ``None``: ``sys.argv[1:]``.

    Raises:
        SystemExit: argparse's errors (unknown flag, bad type or choice) and ``--help``.
        InputError: a value outside its constraints, or options that do not fit together.
    """
    return config_from_args(build_parser().parse_args(argv))


#: The line of ``docs/flags.md`` that names its generator.
GENERATED_NOTE = (
    "Generated by `python -m distmb.config --markdown > docs/flags.md` from the option "
    "declarations in `distmb/config/train.py`; do not edit by hand."
)


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _type_text(opt: Option) -> str:
    if opt.type is bool:
        return "flag"
    allowed = opt.allowed_values()
    if allowed is not None:
        return " \\| ".join(f"`{v}`" for v in allowed)
    text = "comma-separated ints" if opt.type is tuple else opt.type.__name__
    bound = opt.bound_text()
    return f"{text}, {bound}" if bound else text


def _default_text(opt: Option) -> str:
    if opt.type is bool:
        return "off"
    return "–" if opt.cli_default is None else f"`{opt.cli_default}`"


def flag_table_markdown() -> str:
    """``docs/flags.md``: one markdown table (flag, type or choices, default, help) per
    argument group, in the order of ``--help``."""
    lines = [f"# Flags of `{PROG}`", "", GENERATED_NOTE]
    for title, options in _groups().items():
        lines += [
            "",
            f"## {title}",
            "",
            "| flag | type | default | help |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| `{o.flag}` | {_type_text(o)} | {_default_text(o)} | {_md(o.spec.help)} |"
            for o in options
        ]
        pairs = [(a, b) for a, b in _exclusive_pairs() if a.spec.group == title]
        if pairs:
            lines.append("")
            lines += [f"`{a.flag}` and `{b.flag}` exclude each other." for a, b in pairs]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m distmb.config --markdown``: print :func:`flag_table_markdown`."""
    parser = argparse.ArgumentParser(
        prog="python -m distmb.config", description=f"The flags of {PROG}."
    )
    parser.add_argument(
        "--markdown", action="store_true", help="print the flag tables of docs/flags.md"
    )
    if not parser.parse_args(argv).markdown:
        parser.error("nothing to do; give --markdown")
    sys.stdout.write(flag_table_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
