"""The constants of ``python -m distmb.train``'s options: defaults, allowed values, bounds and
the titles of ``--help``'s argument groups.

Constants owned by a lower package (a policy list, a timeout, a thread bound) are defined there
and imported where the options are declared (:mod:`distmb.config.train_options`).
"""

from __future__ import annotations

import re

#: The command whose flags :mod:`distmb.config.train` declares.
PROG = "python -m distmb.train"
#: ``--help``'s description of :data:`PROG`.
DESCRIPTION = (
    "Mini-batch GNN training (GraphSAGE / GAT / GCN / GIN, or your own model) with local "
    "thread-parallel sampling and exact layer-wise evaluation."
)

#: Learning rates, one per built-in model (:data:`distmb.nn.models.MODELS`, which owns the
#: names; a test checks that every one has its rate here), when ``--lr`` is not given: the
#: paper's (Table 2, single socket) for SAGE and GAT; GCN and GIN take SAGE's.
DEFAULT_LR: dict[str, float] = {"sage": 0.003, "gat": 0.001, "gcn": 0.003, "gin": 0.003}
#: Learning rate of a user's model (``--model package.module:Class``) without ``--lr``.
DEFAULT_USER_MODEL_LR = 0.003
#: ``--comm``: the collectives' library (torch: RankGroup.use_torch_distributed); ``auto``
#: is torch on a GPU or under torchrun and mpi on the CPU
#: (:func:`distmb.engine.device.resolve_comm`).
COMM_BACKENDS: tuple[str, ...] = ("auto", "mpi", "torch")
#: ``--grad-bucket-mb``: MiB of gradients per bucket of the overlapped all-reduce (``--comm
#: torch``; smaller than DDP's 25 MiB because GNN models are small: a few buckets per model).
DEFAULT_GRAD_BUCKET_MB = 0.25
#: ``--precision``: the model's forward in float32, float32 with TF32 tensor-core matrix
#: products, or under autocast to bfloat16 / float16 (:mod:`distmb.engine.precision`).
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")
#: Neighbours sampled per layer, input layer first (paper's Table 2; three layers).
DEFAULT_FANOUT: tuple[int, ...] = (5, 10, 15)
#: HEC defaults of the paper (docs/design.md): lines per layer (cs), rows pushed per peer and
#: layer per iteration (nc), life-span in iterations (ls), delay of a push in iterations (d).
DEFAULT_HEC_SIZE = 1_000_000
DEFAULT_HEC_NC = 2000
DEFAULT_HEC_LIFESPAN = 2
DEFAULT_HEC_DELAY = 1
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

#: Argument groups (their titles) after the parser's own
#: (:data:`distmb.config.options.GROUP_MAIN`), in the order of ``--help`` and ``docs/flags.md``.
GROUP_SELECTION = "model selection: best epoch, early stopping, lr schedule, feature normalisation"
GROUP_DATA_LOADING = "data loading"
GROUP_FEATURES = "input features: in memory, memory-mapped or out of core"
GROUP_CUDA = (
    "GPU path (--device cuda; or --sampler device on the CPU): graph placement, device feature "
    "cache, Match-Reorder"
)
GROUP_HEC = "multi-rank (mpirun -np P): historical embedding cache"
