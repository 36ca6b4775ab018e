"""The options of ``python -m distmb.train``, each declared exactly once, in groups.

Each group is a keyword-only dataclass of :func:`~distmb.config.options.option` fields (name,
type, default, flag, help, constraints, resume markers) decorated with
:func:`~distmb.config.options.option_group`, whose title is the group's in ``--help`` and
``docs/flags.md``. The parser's own group (``options``) holds the first four groups, in this
order. :class:`~distmb.config.train.TrainConfig` inherits every group: one flat dataclass, the
fields in the order of ``--help``.
"""

from __future__ import annotations

from distmb.comm.watchdog import DEFAULT_COLLECTIVE_TIMEOUT_S, TORCHRUN_TIMEOUT_S
from distmb.config.constants import (
    COMM_BACKENDS,
    DEFAULT_DEVICE_CACHE_MB,
    DEFAULT_FANOUT,
    DEFAULT_FEATURE_CACHE_MB,
    DEFAULT_GRAD_BUCKET_MB,
    DEFAULT_HEC_DELAY,
    DEFAULT_HEC_LIFESPAN,
    DEFAULT_HEC_NC,
    DEFAULT_HEC_SIZE,
    DEFAULT_LR,
    DEFAULT_NEIGHBOR_CACHE_MB,
    DEFAULT_PARTITION_CACHE,
    DEFAULT_SUPERBATCH,
    FEATURE_SOURCES,
    GRAPH_LAYOUTS,
    GRAPH_PLACEMENTS,
    GROUP_CUDA,
    GROUP_DATA_LOADING,
    GROUP_FEATURES,
    GROUP_HEC,
    GROUP_SELECTION,
    LR_SCHEDULES,
    MAX_SEED,
    NEIGHBOR_CACHE_ORDERS,
    PRECISIONS,
    SAMPLERS,
)
from distmb.config.options import option, option_group
from distmb.core.machine import MAX_THREADS
from distmb.core.malloc import DEFAULT_MALLOC_POLICY, MALLOC_POLICIES
from distmb.core.progress import DEFAULT_PROGRESS_EVERY
from distmb.nn.kernels.dispatch import AUTO_KERNELS, KERNEL_CHOICES
from distmb.nn.models import MODELS
from distmb.pipeline import DEFAULT_PREFETCH
from distmb.pipeline.features.cached import CACHE_POLICIES
from distmb.pipeline.features.device import DEVICE_CACHE_POLICIES
from distmb.pipeline.features.normalize import NORMALIZATIONS
from distmb.pipeline.features.storage import STORAGE_DTYPES

__all__ = [
    "DataOptions",
    "FeatureOptions",
    "GpuPathOptions",
    "LoadingOptions",
    "ModelOptions",
    "MultiRankOptions",
    "RunOptions",
    "SelectionOptions",
    "TrainingOptions",
]


def _aggregators() -> tuple[str, ...]:
    from distmb.nn import AGGREGATORS  # looked up only when an --aggr value is checked

    return tuple(AGGREGATORS)


@option_group()
class DataOptions:
    """Where the graph comes from: a dataset, or a partition on disk."""

    dataset: str | None = option(
        None,
        "dataset spec (synthetic[:k=v,...] | cora | planetoid:DIR | npz:FILE | ogb:DIR | "
        "edgelist:DIR); cora is shipped in the package; default: synthetic",
        exclusive="input",
    )
    verify: bool = option(
        True,
        "do not hash the partition's files nor scan their features when opening them (the "
        "ids' ranges are still checked; by default each part's sha256 and value ranges are "
        "checked once per version of its files)",
        flag="--no-verify",
        inverted=True,
    )
    part_dir: str | None = option(None, "partition directory (distmb-partition)", exclusive="input")


@option_group()
class ModelOptions:
    """The model: its architecture and the neighbours each layer samples."""

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


@option_group()
class TrainingOptions:
    """Mini-batches, the optimizer, dropout, epochs and the seed."""

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


@option_group()
class RunOptions:
    """Threads, memory, device, evaluation, checkpoints, records, progress, and the kernels'
    implementation and precision."""

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
        AUTO_KERNELS,
        "UPDATE/AGG implementation: auto (the fastest on the training device: triton on a GPU "
        "where Triton is installed, else fused), fused (C++ kernels on the CPU, float32 "
        "tensors, their matrix products on bfloat16 operands with --precision bf16; PyTorch "
        "ops on a GPU), torch (PyTorch ops) or triton (the Triton CSR aggregation and "
        "GAT attention aggregation on CUDA tensors, PyTorch ops for the rest; needs Triton)",
        choices=KERNEL_CHOICES,
        resume_applied=True,
    )
    precision: str = option(
        "fp32",
        "the model's forward in float32; tf32 (GPU only: float32 tensors, the forward's and "
        "backward's matrix products on TF32 tensor cores, 10-bit mantissa products with "
        "float32 sums); bf16 (autocast; on the CPU the fused kernels' forward and backward "
        "matrix products take bfloat16 operands and sum in float32, on AVX512-BF16 where the "
        "CPU has it); or fp16 (GPU only, autocast with a gradient scaler); loss, gradients, "
        "optimizer and evaluation stay float32",
        choices=PRECISIONS,
        resume_applied=True,
    )


@option_group(GROUP_SELECTION)
class SelectionOptions:
    """Model selection: early stopping, the learning-rate schedule and feature normalisation."""

    early_stop: int = option(
        0,
        "stop after this many evaluations (see --eval-every) without a better validation "
        "accuracy (0 = off); the run reports, and with --checkpoint-dir keeps in best.pt, the "
        "epoch of the best validation accuracy either way",
        min=0,
    )
    lr_schedule: str = option(
        "none",
        "learning-rate schedule, stepped once per epoch: none (constant --lr), cosine (from "
        "--lr down to --lr-min at the last of --epochs; torch's CosineAnnealingLR) or step "
        "(--lr times --lr-gamma every --lr-step-size epochs; torch's StepLR)",
        choices=LR_SCHEDULES,
        resume_must_match=True,
    )
    lr_step_size: int = option(
        10,
        "--lr-schedule step: epochs between two decays",
        min=1,
        resume_must_match=True,
    )
    lr_gamma: float = option(
        0.1,
        "--lr-schedule step: factor applied to the lr at each decay",
        min=0,
        min_open=True,
        max=1,
        resume_must_match=True,
    )
    lr_min: float = option(
        0.0,
        "--lr-schedule cosine: the lr reached at the last epoch",
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
        choices=NORMALIZATIONS,
        resume_must_match=True,
    )


@option_group(GROUP_DATA_LOADING)
class LoadingOptions:
    """How mini-batches are sampled and prepared ahead."""

    prefetch: int = option(
        DEFAULT_PREFETCH,
        "mini-batches sampled and gathered ahead by a background thread while the current "
        "one trains (0 = synchronous)",
        min=0,
    )
    gather_in_place: bool = option(
        True,
        "gather all of block 0's input rows into a batch buffer; by default a fused GraphSAGE "
        "first layer on one rank reads its neighbours' rows from the in-memory feature table "
        "through their ids, and only its destinations' own rows are gathered (same results)",
        flag="--no-gather-in-place",
        inverted=True,
    )
    sampler: str = option(
        "auto",
        "neighbour sampler: cpp (thread-parallel C++), device (the GPU path's PyTorch-ops "
        "sampler with the device feature cache; on the CPU it runs that path on CPU tensors, "
        "for testing) or auto (device with --device cuda, else cpp)",
        choices=SAMPLERS,
    )
    loader_threads: int | None = option(
        None,
        "OpenMP threads of the prefetch thread's sampling kernels (default: --threads); "
        "with prefetching, sampling and training share the cores",
        min=1,
        max=MAX_THREADS,
    )


@option_group(GROUP_FEATURES)
class FeatureOptions:
    """Where feature rows and in-neighbour lists are read from, and their caches."""

    features: str | None = option(
        None,
        "where feature rows are read from: memory (loaded into RAM), mmap (memory-mapped; the "
        "OS page cache), ooc (direct reads behind --feature-cache-mb with --cache-policy; "
        "needs a partition in the ooc layout); default: ooc for an ooc partition, else mmap",
        choices=FEATURE_SOURCES,
    )
    feature_dtype: str = option(
        "float32",
        "dtype a rank stores its feature table in: float16 or bfloat16 halve its memory (the "
        "CPU path's table, then held in RAM with --features memory or mmap; the GPU path's "
        "pinned host rows and device cache) and the bytes a gathered row moves; rows reach "
        "the model as float32, rounded once (after --normalize-features). float16 refuses a "
        "table with values beyond 65504; with --features ooc, bfloat16 only: the out-of-core "
        "cache holds its rows in two bytes (and the GPU path's device cache)",
        choices=tuple(STORAGE_DTYPES),
    )
    feature_cache_mb: float = option(
        DEFAULT_FEATURE_CACHE_MB,
        "MiB of feature rows cached in memory with --features ooc (per rank; clamped to the "
        "table; 0 = no cache, every row from disk)",
        min=0,
    )
    cache_policy: str = option(
        "belady",
        "--features ooc cache: belady (superbatch inspector, farthest next use out), presc "
        "(static, most used in pre-sampling), degree (static, highest in-degree), lru, none",
        choices=CACHE_POLICIES,
    )
    superbatch: int = option(
        DEFAULT_SUPERBATCH,
        "mini-batches sampled ahead as one superbatch, whose feature reads the belady "
        "inspector plans together (memory: their sampled blocks)",
        min=1,
    )
    presample_epochs: int = option(
        1,
        "epochs pre-sampled (own random stream) to pick the presc cache's rows (--cache-policy "
        "and --device-cache-policy)",
        min=1,
    )
    graph_layout: str = option(
        "mmap",
        "where sampling reads in-neighbour lists: mmap (the part's indices.npy memory-mapped) "
        "or ooc (read from indices.npy with O_DIRECT behind --neighbor-cache-mb; a rank then "
        "holds nothing that grows with the edges; needs --part-dir)",
        choices=GRAPH_LAYOUTS,
    )
    neighbor_cache_mb: float = option(
        DEFAULT_NEIGHBOR_CACHE_MB,
        "MiB of in-neighbour lists cached in memory with --graph-layout ooc (static, filled "
        "before training in --neighbor-cache-order)",
        min=0,
    )
    neighbor_cache_order: str = option(
        "degree",
        "which lists the neighbour cache holds: degree (highest in-degree first: the vertices "
        "sampled most often in a symmetric graph) or ratio (out/in-degree, Ginex's order for "
        "directed graphs)",
        choices=NEIGHBOR_CACHE_ORDERS,
    )


@option_group(GROUP_CUDA)
class GpuPathOptions:
    """The GPU path: graph placement, the device feature cache and Match-Reorder."""

    graph_placement: str = option(
        "device",
        "where the GPU sampler reads the graph's CSR: device (copied into GPU memory) or host "
        "(pinned host memory read by the GPU in place, zero-copy: for graphs larger than the "
        "GPU's memory)",
        choices=GRAPH_PLACEMENTS,
    )
    device_cache_mb: float = option(
        DEFAULT_DEVICE_CACHE_MB,
        "MiB of feature rows cached in GPU memory (rows in --feature-dtype; clamped to the "
        "table); the other rows are read by the GPU from pinned host memory (zero-copy)",
        min=0,
    )
    device_cache_policy: str = option(
        "presc",
        "rows the device cache holds: presc (most used in pre-sampling, own random stream), "
        "degree (highest in-degree) or none (every row from host memory)",
        choices=DEVICE_CACHE_POLICIES,
    )
    match_reorder: bool = option(
        False,
        "FastGL's Match-Reorder: reorder the batches within each --superbatch so consecutive "
        "batches share the most input rows, and reuse the previous batch's rows on the GPU "
        "(same batches, another order)",
    )
    cuda_graphs: bool = option(
        False,
        "capture each batch size's training step (forward, loss, backward, Adam) in one CUDA "
        "graph and replay it: one launch instead of the step's kernels; the blocks are padded "
        "to a layout fitted to the batch size's first batch with headroom (a batch beyond it "
        "gets a second fitted layout, then the sampler's bounds). The device sampler's "
        "batches are replayed from CUDA graphs too, one per batch size. One rank, a built-in "
        "model, positive fan-outs, not with --precision fp16. "
        "With --device cpu --sampler device the same padded step runs without a graph (for "
        "testing)",
    )
    compile: bool = option(
        False,
        "torch.compile the training forward (dynamic shapes, one graph without breaks: the "
        "Triton layers as custom operators; evaluation stays eager). --kernels triton (or "
        "auto on a GPU with Triton), a built-in model, one rank; not with --cuda-graphs or "
        "--precision bf16/fp16",
    )


@option_group(GROUP_HEC)
class MultiRankOptions:
    """Several ranks: the halo scheme (historical embedding cache, drop, exact), the partition
    cache and the collectives."""

    hec_size: int = option(
        DEFAULT_HEC_SIZE,
        "cache lines per layer (cs)",
        min=1,
        resume_must_match=True,
    )
    hec_nc: int = option(
        DEFAULT_HEC_NC,
        "rows pushed per peer and layer per iteration at most (nc)",
        min=1,
        resume_applied=True,
    )
    hec_lifespan: int = option(
        DEFAULT_HEC_LIFESPAN,
        "iterations a cached embedding stays usable (ls)",
        min=0,
        resume_must_match=True,
    )
    hec_delay: int = option(
        DEFAULT_HEC_DELAY,
        "iterations between a push and its use (d)",
        min=1,
        resume_applied=True,
    )
    no_hec: bool = option(False, "drop halo leaves instead (communication-free lower bound)")
    exact_remote: bool = option(
        False,
        "DistDGL-like exact baseline instead of the HEC: sample remote neighbours at their "
        "owners and fetch remote features every iteration (no cache, no staleness)",
    )
    partition_cache: str = option(
        DEFAULT_PARTITION_CACHE,
        "where --dataset is partitioned for P ranks (rank 0 writes it)",
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
        choices=COMM_BACKENDS,
    )
    grad_bucket_mb: float = option(
        DEFAULT_GRAD_BUCKET_MB,
        "MiB of gradients per bucket of the all-reduce with --comm torch: each bucket starts "
        "during the backward pass as soon as its gradients are ready (0 = one all-reduce "
        "after the backward pass)",
        min=0,
    )
    collective_timeout: float = option(
        DEFAULT_COLLECTIVE_TIMEOUT_S,
        "seconds a rank may wait in one collective (at least 10x the slowest iteration so "
        "far) before the job is aborted naming the rank that stopped sending heartbeats; a "
        "slow but live rank only gets a warning (0 = no watchdog). MPI launches only: under "
        "torchrun a rank that dies ends the job, and one that stops fails its peers' "
        f"collectives after {TORCHRUN_TIMEOUT_S:.0f} s",
        min=0,
        resume_applied=True,
    )
