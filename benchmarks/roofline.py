"""Roofline and thread scaling of one single-rank GraphSAGE epoch.

For every thread count of ``--threads`` the script, in one run:

1. measures the machine's ceilings at that thread count, before and after its epochs (each
   ceiling: the median of both sets of ``--peak-reps`` samples, so that a load that comes or
   goes during the epochs weighs on the ceilings as on the epochs): the peak GEMM rate
   (``torch.mm`` of two float32 ``4096 x 4096`` matrices) and the memory bandwidth
   (``distmb._C.stream_copy`` of a 1 GiB array, far beyond the last-level cache, GB/s
   counting bytes read + written). A cache-resident copy is measured too, for context only;
2. trains ``--epochs`` epochs of GraphSAGE with the paper's defaults (3 layers, hidden 256,
   fan-out 5,10,15, batch 1000, fused kernels, ``--prefetch 0`` so that the phases run one
   after the other on this thread) and times every fused kernel per layer by wrapping the
   kernel functions for the run (nothing is added to the library's hot path);
3. counts, from the blocks every batch really sampled, the GEMM FLOPs and the bytes of every
   kernel (:func:`sage_batch_work`), and reports for each phase its achieved GFLOP/s and
   GB/s and its fraction of the roofline ``attainable = min(peak GFLOP/s, AI * bandwidth)``
   with ``AI = FLOPs / bytes`` of the phase.

The first epoch of every thread count is a warm-up; the per-phase seconds are medians over
the other epochs, the rates pool them (total work / total seconds). Writes
``results/roofline.json`` and ``results/roofline.png``. How to read them:
``benchmarks/README.md``.

The default graph is a power-law graph with real hubs (:func:`chung_lu_uncapped_graph`:
200k vertices, average degree 30, Pareto(2.5) expected degrees without a cap, 100 features,
47 classes, a quarter of the vertices training); ``--dataset SPEC`` trains on any dataset
spec instead (e.g. ``synthetic:...``).

    OMP_WAIT_POLICY=passive python benchmarks/roofline.py                    # 1, 2, all cores
    OMP_WAIT_POLICY=passive python benchmarks/roofline.py --threads 1,2,4,8,16
    python benchmarks/roofline.py --quick                # small graph, few reps: a smoke run
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from record import command_line

from distmb import _C
from distmb.cli.report import save_figure, write_json
from distmb.config.train import TrainConfig
from distmb.core.errors import InputError
from distmb.core.plotting import panels, reference_line, rotate_labels, set_scale
from distmb.data import load_dataset
from distmb.data.graph import Graph
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.build.runtime import set_threads
from distmb.nn.kernels import cpu_aggregate as fused_aggregate
from distmb.nn.kernels import cpu_update as fused_update
from distmb.nn.models import GraphSAGE
from distmb.pipeline.sample import Block

RESULTS = Path(__file__).resolve().parents[1] / "results"

#: Bytes of a float32 value; of an int64 index.
F32_BYTES, I64_BYTES = 4, 8
#: FLOPs of one fused multiply-add.
FLOPS_PER_FMA = 2
#: Gate bits per byte (ReLU-active and dropout-kept bits of the fused UPDATE).
BITS_PER_BYTE = 8
_GIGA = 1e9

# --------------------------------------------------------------------------- graph

#: The benchmark graph: ogbn-products' shape scaled to what 2 cores can train.
GRAPH_NODES, GRAPH_AVG_DEGREE, GRAPH_FEAT_DIM, GRAPH_CLASSES = 200_000, 30.0, 100, 47
#: Fraction of the vertices in the training split; in the validation split.
GRAPH_TRAIN_FRACTION, GRAPH_VAL_FRACTION = 0.25, 0.10
#: Exponent gamma of the expected-degree density ``p(w) ~ w^-gamma``.
GRAPH_GAMMA = 2.5
#: Rounds of re-drawing the edges lost to self-loops and repeats before giving up.
_CHUNG_LU_ROUNDS = 64
#: Vertices of the ``--quick`` graph.
QUICK_NODES = 20_000


def chung_lu_uncapped_graph(
    nodes: int = GRAPH_NODES,
    avg_degree: float = GRAPH_AVG_DEGREE,
    feat_dim: int = GRAPH_FEAT_DIM,
    classes: int = GRAPH_CLASSES,
    gamma: float = GRAPH_GAMMA,
    seed: int = 0,
) -> Graph:
    """A Chung-Lu graph over **uncapped** Pareto(``gamma``) expected degrees (real hubs).

    Stand-in until ``distmb.data.datasets.synthetic`` offers uncapped hubs (``hub_cap=0``, branch
    wt-peers; that generator caps the expected degrees at ``sqrt(nodes * avg_degree)``):
    swap this function's caller for ``load_dataset("synthetic:...")`` then.

    Every vertex gets a weight ``w ~ Pareto`` with density ``~ w^-gamma`` scaled to mean
    ``avg_degree``; ``round(nodes * avg_degree / 2)`` distinct undirected edges are drawn with
    both endpoints proportional to the weights (self-loops and repeats re-drawn in rounds;
    hubs whose weight exceeds ``nodes - 1`` saturate). Labels are uniform over ``classes``
    and features ``N(0, I) / sqrt(feat_dim)`` (no signal: the graph is for timing); a
    quarter of the vertices train, a tenth validate, the rest test.

    Returns:
        A validated :class:`Graph` named ``"chung_lu_uncapped"`` (symmetrised: about
        ``nodes * avg_degree`` in-edges); ``notes`` say how many edges were drawn.
    """
    rng = np.random.default_rng(seed)
    weights = rng.pareto(gamma - 1.0, nodes) + 1.0
    weights *= avg_degree / weights.mean()
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    target = round(nodes * avg_degree / 2)
    keys = np.zeros(0, dtype=np.int64)
    keep_rate = 1.0
    for _ in range(_CHUNG_LU_ROUNDS):
        missing = target - keys.size
        if missing <= 0:
            break
        draws = math.ceil(missing / max(keep_rate, 1e-3))
        u = np.minimum(np.searchsorted(cdf, rng.random(draws), side="right"), nodes - 1)
        v = np.minimum(np.searchsorted(cdf, rng.random(draws), side="right"), nodes - 1)
        lo, hi = np.minimum(u, v).astype(np.int64), np.maximum(u, v).astype(np.int64)
        new = lo[lo != hi] * nodes + hi[lo != hi]
        before = keys.size
        keys = np.unique(np.concatenate([keys, new]))
        keep_rate = max((keys.size - before) / draws, 0.0)
    if keys.size > target:
        keys = np.sort(rng.choice(keys, size=target, replace=False))
    src, dst = keys // nodes, keys % nodes
    labels = rng.integers(0, classes, nodes, dtype=np.int64)
    features = rng.standard_normal((nodes, feat_dim), dtype=np.float32)
    features *= np.float32(1.0 / math.sqrt(feat_dim))
    order = rng.permutation(nodes)
    n_train, n_val = round(GRAPH_TRAIN_FRACTION * nodes), round(GRAPH_VAL_FRACTION * nodes)
    train_idx, val_idx, test_idx = (
        np.sort(part) for part in np.split(order, [n_train, n_train + n_val])
    )
    note = (
        f"chung_lu_uncapped: nodes={nodes}, avg_degree={avg_degree:g}, gamma={gamma:g}, "
        f"largest expected degree {weights.max():.0f}, {keys.size} of {target} undirected "
        "edges drawn"
    )
    return Graph.from_edges(
        "chung_lu_uncapped", src, dst, nodes, features, labels, train_idx, val_idx, test_idx,
        classes, symmetrize=True, source="chung_lu_uncapped_graph", notes=[note],
    )  # fmt: skip


def degree_facts(graph: Graph) -> dict[str, float]:
    """Average, median, 99th percentile and largest in-degree of ``graph``."""
    degree = graph.in_degree()
    return {
        "mean": round(float(degree.mean()), 2),
        "median": float(np.median(degree)),
        "p99": float(np.percentile(degree, 99)),
        "max": int(degree.max()),
    }


# --------------------------------------------------------------------------- counting


@dataclass(frozen=True)
class BlockShape:
    """The sizes of a block that the work depends on."""

    n_dst: int
    n_src: int
    num_edges: int

    @classmethod
    def of(cls, block: Block) -> BlockShape:
        return cls(block.n_dst, block.n_src, block.num_edges)


@dataclass
class Work:
    """FLOPs and bytes (memory traffic) of a kernel or phase; adds up."""

    flops: int = 0
    bytes: int = 0

    def __add__(self, other: Work) -> Work:
        return Work(self.flops + other.flops, self.bytes + other.bytes)


def update_forward_work(n: int, k: int, widths: Sequence[int], addend: bool, bits: bool) -> Work:
    """``fused_update.update_forward``: ``out[n, k] = act(sum_s X_s[n, C_s] W_s[k, C_s]^T +
    addend + bias)``. FLOPs: the GEMMs, ``2 n C_s k`` per source. Bytes: every operand read
    once (``X_s``, ``W_s``, bias, the addend), the output written once, plus the gate bits
    (``uint8[n, ceil(k / 8)]``) with an activation."""
    flops = sum(FLOPS_PER_FMA * n * c * k for c in widths)
    read = sum(n * c + k * c for c in widths) + k + (n * k if addend else 0)
    written = n * k
    gate = n * -(-k // BITS_PER_BYTE) if bits else 0
    return Work(flops, F32_BYTES * (read + written) + gate)


def update_backward_work(
    n: int,
    k: int,
    widths: Sequence[int],
    need_x: Sequence[bool],
    need_w: Sequence[bool],
    bias: bool,
    addend: bool,
    bits: bool,
) -> Work:
    """``fused_update.update_backward`` for ``grad_out[n, k]``: per source ``grad_X_s =
    grad_pre W_s`` (when ``need_x``) and ``grad_W_s = grad_pre^T X_s`` (when ``need_w``),
    ``2 n C_s k`` FLOPs each. Bytes: ``grad_out`` (and the gate bits) read, ``X_s`` read for
    ``grad_W_s``, ``W_s`` read for ``grad_X_s``, every requested gradient (and the bias and
    addend gradients) written once."""
    flops = 0
    values = n * k  # grad_out
    for c, nx, nw in zip(widths, need_x, need_w, strict=True):
        flops += FLOPS_PER_FMA * n * c * k * (int(nx) + int(nw))
        values += (k * c + n * c) if nx else 0  # read W_s, write grad_X_s
        values += (n * c + k * c) if nw else 0  # read X_s, write grad_W_s
    values += (k if bias else 0) + (n * k if addend else 0)
    gate = n * -(-k // BITS_PER_BYTE) if bits else 0
    return Work(flops, F32_BYTES * values + gate)


def aggregate_forward_work(shape: BlockShape, width: int) -> Work:
    """Mean ``fused_aggregate.aggregate_forward`` at ``width``: one source row gathered per
    edge and one output row written per destination (index bytes not counted). FLOPs: one
    add per gathered value and the ``1 / deg`` scaling of every output value."""
    e, n_dst = shape.num_edges, shape.n_dst
    return Work(e * width + n_dst * width, F32_BYTES * width * (e + n_dst))


def aggregate_backward_work(shape: BlockShape, width: int, n_addend: int) -> Work:
    """Mean ``fused_aggregate.aggregate_backward`` at ``width`` over the transposed CSR: one
    output-gradient row gathered per edge (a multiply-add by ``1 / deg``), every source's
    gradient row written, and the first ``n_addend`` rows of the addend read and added."""
    e, n_src = shape.num_edges, shape.n_src
    flops = FLOPS_PER_FMA * e * width + n_addend * width
    return Work(flops, F32_BYTES * width * (e + n_src + n_addend))


#: Kernels of a layer, in the order they run within a step.
FWD_KERNELS = ("proj_fwd", "agg_fwd", "update_fwd")
BWD_KERNELS = ("update_bwd", "agg_bwd", "proj_bwd")
KERNELS = FWD_KERNELS + BWD_KERNELS


def projects_first(d_in: int, d_out: int) -> bool:
    """Whether SAGEConv projects before aggregating (``out_dim < in_dim``, see sage.py)."""
    return d_out < d_in


def sage_layer_work(
    shape: BlockShape, d_in: int, d_out: int, *, first: bool, activation: bool
) -> dict[str, Work]:
    """The work of one fused SAGEConv (mean aggregator, self term) on one block, per kernel,
    exactly as ``distmb/nn/sage.py`` runs it:

    - aggregate first (``d_out >= d_in``): ``agg_fwd`` at ``d_in``; ``update_fwd`` over
      ``n_dst`` rows with two sources (aggregate, self rows). Backward: ``update_bwd`` (both
      weight gradients, bias; input gradients unless ``first``) and, unless ``first``,
      ``agg_bwd`` at ``d_in`` with the self gradient as addend.
    - project first (``d_out < d_in``): ``proj_fwd`` (``x W_n^T`` over all ``n_src`` rows),
      ``agg_fwd`` at ``d_out``, ``update_fwd`` over ``n_dst`` rows (self source + the
      aggregate as addend). Backward: ``update_bwd`` (``W_s``, bias, addend gradient; self
      input gradient unless ``first``), ``agg_bwd`` at ``d_out`` without addend, ``proj_bwd``
      (``W_n`` gradient; input gradient unless ``first``).

    ``first``: the layer's input (the features) needs no gradient. ``activation``: ReLU +
    dropout (gate bits written and read). Returns ``{kernel: Work}`` over :data:`KERNELS`
    (kernels a layer does not run are absent).
    """
    need_x = not first
    n_dst, n_src = shape.n_dst, shape.n_src
    work: dict[str, Work] = {}
    if projects_first(d_in, d_out):
        work["proj_fwd"] = update_forward_work(n_src, d_out, [d_in], addend=False, bits=False)
        work["agg_fwd"] = aggregate_forward_work(shape, d_out)
        work["update_fwd"] = update_forward_work(n_dst, d_out, [d_in], True, activation)
        work["update_bwd"] = update_backward_work(
            n_dst, d_out, [d_in], [need_x], [True], bias=True, addend=True, bits=activation
        )
        work["agg_bwd"] = aggregate_backward_work(shape, d_out, n_addend=0)
        work["proj_bwd"] = update_backward_work(
            n_src, d_out, [d_in], [need_x], [True], bias=False, addend=False, bits=False
        )
    else:
        work["agg_fwd"] = aggregate_forward_work(shape, d_in)
        work["update_fwd"] = update_forward_work(n_dst, d_out, [d_in, d_in], False, activation)
        work["update_bwd"] = update_backward_work(
            n_dst, d_out, [d_in, d_in], [need_x] * 2, [True] * 2, True, False, activation
        )
        if need_x:
            work["agg_bwd"] = aggregate_backward_work(shape, d_in, n_addend=n_dst)
    return work


def sage_batch_work(
    shapes: Sequence[BlockShape], widths: Sequence[tuple[int, int]]
) -> dict[tuple[int, str], Work]:
    """``{(layer, kernel): Work}`` of one mini-batch: ``shapes[l]`` is layer ``l``'s block,
    ``widths[l]`` its ``(d_in, d_out)`` (:func:`distmb.nn.models.stack_widths`); ReLU and
    dropout on every layer but the last, as :class:`~distmb.nn.models.GraphSAGE` builds it."""
    if len(shapes) != len(widths):
        raise ValueError(f"{len(shapes)} blocks for {len(widths)} layers")
    out: dict[tuple[int, str], Work] = {}
    last = len(widths) - 1
    for l, (shape, (d_in, d_out)) in enumerate(zip(shapes, widths, strict=True)):
        layer = sage_layer_work(shape, d_in, d_out, first=l == 0, activation=l != last)
        for kernel, work in layer.items():
            out[(l, kernel)] = work
    return out


def feature_gather_bytes(shape: BlockShape, feat_dim: int) -> int:
    """Bytes the feature gather of a batch moves: every input row of the first block
    (``n_src`` rows of ``feat_dim`` float32) read from the feature table and written to the
    batch's buffer."""
    return 2 * shape.n_src * feat_dim * F32_BYTES


def gemm_flops(work: dict[tuple[int, str], Work]) -> int:
    """Total GEMM FLOPs (every kernel but the aggregations) of :func:`sage_batch_work`."""
    return sum(w.flops for (_, kernel), w in work.items() if not kernel.startswith("agg"))


# --------------------------------------------------------------------------- instrumentation


class KernelTimer:
    """Times the fused SAGE kernels per ``(layer, kernel)`` while it is entered, and records
    the block shapes of every batch (benchmark only).

    Entering patches the module attributes ``fused_update.update_forward`` /
    ``update_backward`` and ``fused_aggregate.aggregate_forward`` / ``aggregate_backward`` /
    ``block_transpose`` (``SAGEConv`` calls them through their modules) with timing wrappers
    and registers a forward pre-hook on every layer; leaving restores them. While entered the
    model runs its layers one by one (``fuses_pair`` off: a fused layer pair would hide layer
    1's aggregation backward inside layer 0's UPDATE backward). A kernel's layer
    is found from its weight (``data_ptr`` of the layer's ``W_n`` / ``W_s``) or its block
    (identity, recorded by the hook). The wrappers also tally the GEMM FLOPs of the calls
    from the operands' shapes (:attr:`called_flops`), independently of :func:`sage_batch_work`.
    ``agg_bwd`` excludes the transposed CSR it builds, timed as ``(layer, "transpose")``.

    Args:
        model: a :class:`GraphSAGE` (its layers' parameters stay in place: the optimiser
            updates them in place).
    """

    def __init__(self, model: GraphSAGE) -> None:
        self.model = model
        self.project = [projects_first(c.in_dim, c.out_dim) for c in model.layers]
        self.weight_owner: dict[int, tuple[int, str]] = {}
        for l, conv in enumerate(model.layers):
            self.weight_owner[conv.fc_neigh.weight.data_ptr()] = (l, "neigh")
            if conv.fc_self is not None:
                self.weight_owner[conv.fc_self.weight.data_ptr()] = (l, "self")
        self.block_layer: dict[int, int] = {}
        self.seconds: dict[tuple[int, str], float] = defaultdict(float)
        self.called_flops: dict[tuple[int, str], int] = defaultdict(int)
        #: Block shapes of every batch run while entered, ``shapes[batch][layer]``.
        self.shapes: list[list[BlockShape]] = []
        self._transpose_s = 0.0
        self._saved: list[tuple[Any, str, Any]] = []
        self._hooks: list[Any] = []

    def reset(self) -> None:
        """Forget the times, tallies and shapes (at the start of an epoch)."""
        self.seconds.clear()
        self.called_flops.clear()
        self.shapes.clear()

    def _pre_hook(self, layer: int) -> Callable[[Any, tuple], None]:
        def hook(_module: Any, args: tuple) -> None:
            block = args[0]
            if layer == 0:
                self.shapes.append([])
            self.shapes[-1].append(BlockShape.of(block))
            self.block_layer[id(block)] = layer

        return hook

    def _gemm_kernel(self, ws: Sequence[torch.Tensor], direction: str) -> tuple[int, str]:
        layer, role = self.weight_owner[ws[0].data_ptr()]
        projection = self.project[layer] and role == "neigh"
        return layer, f"{'proj' if projection else 'update'}_{direction}"

    def _timed(self, key: tuple[int, str], fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds[key] += time.perf_counter() - t0

    def __enter__(self) -> KernelTimer:
        upd_fwd, upd_bwd = fused_update.update_forward, fused_update.update_backward
        agg_fwd, agg_bwd = fused_aggregate.aggregate_forward, fused_aggregate.aggregate_backward
        transpose = fused_aggregate.block_transpose

        def update_forward(xs, ws, *rest):  # type: ignore[no-untyped-def]
            key = self._gemm_kernel(ws, "fwd")
            self.called_flops[key] += sum(
                FLOPS_PER_FMA * x.shape[0] * x.shape[1] * w.shape[0]
                for x, w in zip(xs, ws, strict=True)
            )
            return self._timed(key, upd_fwd, xs, ws, *rest)

        def update_backward(grad_out, bits, scale, xs, ws, need_xs, need_ws, *rest):  # type: ignore[no-untyped-def]
            key = self._gemm_kernel(ws, "bwd")
            self.called_flops[key] += sum(
                FLOPS_PER_FMA * x.shape[0] * x.shape[1] * w.shape[0] * (int(nx) + int(nw))
                for x, w, nx, nw in zip(xs, ws, need_xs, need_ws, strict=True)
            )
            return self._timed(key, upd_bwd, grad_out, bits, scale, xs, ws, need_xs, need_ws, *rest)

        def aggregate_forward(block, x, kind):  # type: ignore[no-untyped-def]
            key = (self.block_layer[id(block)], "agg_fwd")
            return self._timed(key, agg_fwd, block, x, kind)

        def aggregate_backward(block, *rest):  # type: ignore[no-untyped-def]
            layer = self.block_layer[id(block)]
            self._transpose_s = 0.0
            t0 = time.perf_counter()
            try:
                return agg_bwd(block, *rest)
            finally:
                spent = time.perf_counter() - t0
                self.seconds[(layer, "agg_bwd")] += spent - self._transpose_s
                self.seconds[(layer, "transpose")] += self._transpose_s

        def block_transpose(block):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return transpose(block)
            finally:
                self._transpose_s += time.perf_counter() - t0

        patches = [
            (fused_update, "update_forward", update_forward),
            (fused_update, "update_backward", update_backward),
            (fused_aggregate, "aggregate_forward", aggregate_forward),
            (fused_aggregate, "aggregate_backward", aggregate_backward),
            (fused_aggregate, "block_transpose", block_transpose),
        ]
        for module, name, wrapper in patches:
            self._saved.append((module, name, getattr(module, name)))
            setattr(module, name, wrapper)
        for l, conv in enumerate(self.model.layers):
            self._hooks.append(conv.register_forward_pre_hook(self._pre_hook(l)))
        self.model.fuses_pair = lambda _l, _x: False  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        for module, name, original in self._saved:
            setattr(module, name, original)
        self._saved.clear()
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self.model.__dict__.pop("fuses_pair", None)  # the class's method again


# --------------------------------------------------------------------------- machine


#: ISA extensions that decide the GEMM and copy kernels' speed (``/proc/cpuinfo`` names).
ISA_FLAGS = (
    "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8",
)  # fmt: skip
#: ``lscpu`` fields recorded.
LSCPU_FIELDS = (
    "Model name", "Socket(s)", "Core(s) per socket", "Thread(s) per core", "CPU(s)",
    "L2 cache", "L3 cache", "NUMA node(s)", "Hypervisor vendor",
)  # fmt: skip


def machine_facts() -> dict[str, Any]:
    """CPU model, topology and caches (``lscpu``), the ISA flags of :data:`ISA_FLAGS`,
    usable cores, memory, torch's version and threads, the load."""
    lscpu: dict[str, str] = {}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in LSCPU_FIELDS:
                lscpu[key.strip()] = value.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "cpu": lscpu.get("Model name", platform.processor() or platform.machine()),
        "lscpu": lscpu,
        "isa": {flag: flag in flags for flag in ISA_FLAGS},
        "cpus": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(memory / 2**30, 1),
        "torch": torch.__version__,
        "torch_mkl": torch.backends.mkl.is_available(),
        "torch_threads_default": torch.get_num_threads(),
        "numpy": np.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }


def load_facts() -> dict[str, Any]:
    """The 1-minute load average and the CPU pressure (``/proc/pressure/cpu`` avg10 of
    "some", percent), to judge how loaded the machine was."""
    facts: dict[str, Any] = {"loadavg_1min": os.getloadavg()[0]}
    try:
        first = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        facts["cpu_pressure_avg10_pct"] = float(first.split("avg10=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        pass
    return facts


# --------------------------------------------------------------------------- peaks


def _sample_seconds(fn: Callable[[], Any], reps: int) -> list[float]:
    """One warm-up call of ``fn``, then the seconds of ``reps`` timed calls."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def gemm_gflops_samples(size: int, reps: int) -> list[float]:
    """GFLOP/s of ``reps`` ``torch.mm`` of two float32 ``size x size`` matrices at torch's
    current thread count (``2 size^3`` FLOPs per product)."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=gen), torch.randn(size, size, generator=gen)
    c = torch.empty(size, size)
    flops = FLOPS_PER_FMA * size**3
    return [flops / t / _GIGA for t in _sample_seconds(lambda: torch.mm(a, b, out=c), reps)]


def copy_gbps_samples(array_bytes: int, reps: int) -> list[float]:
    """GB/s (bytes read + written) of ``reps`` ``distmb._C.stream_copy`` (OpenMP copy at the
    C++ kernels' thread count) of ``array_bytes``."""
    n = array_bytes // F32_BYTES
    src = np.ones(n, np.float32)
    dst = np.zeros(n, np.float32)  # touched: no page faults are timed
    moved = 2 * n * F32_BYTES
    return [moved / t / _GIGA for t in _sample_seconds(lambda: _C.stream_copy(src, dst), reps)]


def measure_peaks(args: argparse.Namespace) -> dict[str, list[float]]:
    """Samples of the three ceilings at the current thread count: ``gemm`` (GFLOP/s),
    ``copy`` and ``copy_cache_resident`` (GB/s)."""
    return {
        "gemm": gemm_gflops_samples(args.gemm_size, args.peak_reps),
        "copy": copy_gbps_samples(args.copy_mib << 20, args.peak_reps),
        "copy_cache_resident": copy_gbps_samples(args.cache_copy_mib << 20, args.peak_reps),
    }


def combine_peaks(
    before: dict[str, list[float]], after: dict[str, list[float]], args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """The ceilings measured before and after a thread count's epochs, as reported: each
    the median of both sets of samples (``gflops`` / ``gbps``), plus the samples."""
    sizes = {
        "gemm": {"size": args.gemm_size},
        "copy": {"array_bytes": args.copy_mib << 20},
        "copy_cache_resident": {"array_bytes": args.cache_copy_mib << 20},
    }
    out = {}
    for name, extra in sizes.items():
        unit = "gflops" if name == "gemm" else "gbps"
        out[name] = {
            **extra,
            unit: round(statistics.median(before[name] + after[name]), 2),
            "samples_before": [round(v, 2) for v in before[name]],
            "samples_after": [round(v, 2) for v in after[name]],
        }
    return out


# --------------------------------------------------------------------------- epochs

#: Phases reported, in epoch order: the Trainer's (``sample`` + ``gather`` = MBC; ``opt``,
#: ``ared``) and the kernels summed over layers; ``fwd_other`` / ``bwd_other`` are FWD / BWD
#: minus their kernels (autograd, loss, allocation, Python).
PHASES = (
    "sample", "gather", "proj_fwd", "agg_fwd", "update_fwd", "fwd_other",
    "update_bwd", "agg_bwd", "transpose", "proj_bwd", "bwd_other", "opt",
)  # fmt: skip
#: Phases with a roofline (a counted amount of work).
ROOFLINE_PHASES = ("gather", "proj_fwd", "agg_fwd", "update_fwd", "update_bwd", "agg_bwd",
                   "proj_bwd", "gemm_fwd", "gemm_bwd")  # fmt: skip
#: Groups of kernels reported together as well.
GEMM_GROUPS = {"gemm_fwd": ("proj_fwd", "update_fwd"), "gemm_bwd": ("update_bwd", "proj_bwd")}


def epoch_work(
    shapes: Sequence[Sequence[BlockShape]], widths: Sequence[tuple[int, int]], feat_dim: int
) -> dict[str, Any]:
    """Work of an epoch's batches: ``{"layers": {(l, kernel): Work}, "phases": {phase:
    Work}}`` with the phases summed over layers (and ``gather``, ``gemm_fwd``,
    ``gemm_bwd``)."""
    layers: dict[tuple[int, str], Work] = defaultdict(Work)
    gather = 0
    for batch in shapes:
        for key, work in sage_batch_work(batch, widths).items():
            layers[key] = layers[key] + work
        gather += feature_gather_bytes(batch[0], feat_dim)
    phases: dict[str, Work] = defaultdict(Work)
    for (_, kernel), work in layers.items():
        phases[kernel] = phases[kernel] + work
    for group, kernels in GEMM_GROUPS.items():
        phases[group] = sum((phases[k] for k in kernels), Work())
    phases["gather"] = Work(0, gather)
    return {"layers": dict(layers), "phases": dict(phases)}


def roofline_point(
    work: Work, seconds: float, peak_gflops: float, bandwidth_gbps: float
) -> dict[str, Any]:
    """Achieved rates of ``work`` done in ``seconds`` against the roofline of the measured
    peaks: ``attainable = min(peak, AI * bandwidth)`` (GFLOP/s), and the fraction of it
    achieved (a phase without FLOPs: the fraction of the bandwidth)."""
    point: dict[str, Any] = {
        "seconds": round(seconds, 4),
        "gflop": round(work.flops / _GIGA, 4),
        "gbytes": round(work.bytes / _GIGA, 4),
    }
    if seconds <= 0:
        return point
    gbps = work.bytes / seconds / _GIGA
    point["achieved_gbps"] = round(gbps, 2)
    if work.flops == 0:
        point["fraction_of_attainable"] = round(gbps / bandwidth_gbps, 3)
        point["bound"] = "memory"
        return point
    ai = work.flops / work.bytes
    attainable = min(peak_gflops, ai * bandwidth_gbps)
    achieved = work.flops / seconds / _GIGA
    point.update(
        ai_flop_per_byte=round(ai, 3),
        achieved_gflops=round(achieved, 2),
        attainable_gflops=round(attainable, 2),
        fraction_of_attainable=round(achieved / attainable, 3),
        fraction_of_peak_gflops=round(achieved / peak_gflops, 3),
        bound="compute" if ai * bandwidth_gbps >= peak_gflops else "memory",
    )
    return point


def run_threads(local: LocalGraph, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    """Peaks, then ``args.epochs`` instrumented epochs at ``threads`` threads."""
    config = TrainConfig(
        model="sage", epochs=args.epochs, eval_every=10**9, progress=False, kernels="fused",
        threads=threads, prefetch=args.prefetch, seed=args.seed,
    )  # fmt: skip
    set_threads(config)
    before = measure_peaks(args)
    print(
        f"threads {threads}: GEMM {statistics.median(before['gemm']):.1f} GFLOP/s, "
        f"copy {statistics.median(before['copy']):.2f} GB/s",
        flush=True,
    )
    trainer = Trainer(local, config, log=lambda _: None)
    model = trainer.model
    if not isinstance(model, GraphSAGE):
        raise InputError("benchmarks/roofline.py counts GraphSAGE only")
    widths = [(c.in_dim, c.out_dim) for c in model.layers]
    epochs = []
    with KernelTimer(model) as timer:
        for epoch in range(args.epochs):
            timer.reset()
            load = load_facts()
            record = trainer.train_epoch(epoch)
            work = epoch_work(timer.shapes, widths, local.feat_dim)
            seconds = _phase_seconds(record, timer.seconds)
            counted = gemm_flops(work["layers"])
            called = sum(timer.called_flops.values())
            epochs.append(
                {
                    "record": record,
                    "load_start": load,
                    "seconds": seconds,
                    "layer_seconds": {f"{l}:{k}": s for (l, k), s in timer.seconds.items()},
                    "work": work,
                    "gemm_flops_counted": counted,
                    "gemm_flops_called": called,
                    "blocks_mean": _mean_shapes(timer.shapes),
                }
            )
            print(
                f"  epoch {epoch}: {record['epoch_time']:.2f} s "
                + " ".join(f"{p} {seconds[p]:.2f}" for p in PHASES),
                flush=True,
            )
            if counted != called:
                raise AssertionError(
                    f"GEMM FLOPs counted from the blocks ({counted}) differ from the kernel "
                    f"calls' ({called}): sage_layer_work no longer matches distmb/nn/sage.py"
                )
    peaks = combine_peaks(before, measure_peaks(args), args)
    print(
        f"threads {threads}: ceilings before + after the epochs: GEMM "
        f"{peaks['gemm']['gflops']} GFLOP/s, copy {peaks['copy']['gbps']} GB/s",
        flush=True,
    )
    return _summarise(threads, peaks, epochs, widths)


def _phase_seconds(record: dict[str, Any], kernels: dict[tuple[int, str], float]) -> dict:
    """Seconds of every phase of :data:`PHASES` (and the groups) in one epoch."""
    by_kernel: dict[str, float] = defaultdict(float)
    for (_, kernel), s in kernels.items():
        by_kernel[kernel] += s
    fwd = sum(by_kernel[k] for k in FWD_KERNELS)
    bwd = sum(by_kernel[k] for k in (*BWD_KERNELS, "transpose"))
    seconds = {
        "sample": record["sample"],
        "gather": record["gather"],
        **{k: by_kernel[k] for k in (*KERNELS, "transpose")},
        "fwd_other": record["fwd"] - fwd,
        "bwd_other": record["bwd"] - bwd,
        "opt": record["opt"] + record["ared"],
    }
    for group, kernels_of in GEMM_GROUPS.items():
        seconds[group] = sum(by_kernel[k] for k in kernels_of)
    return seconds


def _mean_shapes(shapes: list[list[BlockShape]]) -> list[dict[str, float]]:
    """Per layer, the mean block sizes over the epoch's batches."""
    if not shapes:
        return []
    return [
        {f.name: round(statistics.mean(getattr(b[l], f.name) for b in shapes), 1)
         for f in fields(BlockShape)}
        for l in range(len(shapes[0]))
    ]  # fmt: skip


def _summarise(
    threads: int, peaks: dict[str, Any], epochs: list[dict[str, Any]], widths: list
) -> dict[str, Any]:
    """Medians of the timed epochs (all but the first, unless there is only one) and the
    roofline of every phase and layer kernel, its rates pooled over the timed epochs."""
    timed = epochs[1:] if len(epochs) > 1 else epochs
    peak_gflops, bandwidth = peaks["gemm"]["gflops"], peaks["copy"]["gbps"]
    median_s = {
        p: round(statistics.median(e["seconds"][p] for e in timed), 4) for p in timed[0]["seconds"]
    }
    trainer_keys = ("epoch_time", "mbc", "fwd", "bwd", "opt", "samples_per_s", "load_wait")
    median_record = {
        k: round(statistics.median(e["record"][k] for e in timed), 4) for k in trainer_keys
    }
    phases = {}
    for phase in ROOFLINE_PHASES:
        work = sum((e["work"]["phases"].get(phase, Work()) for e in timed), Work())
        secs = sum(e["seconds"][phase] for e in timed)
        if work.bytes:
            phases[phase] = roofline_point(work, secs, peak_gflops, bandwidth)
    layers: dict[str, Any] = {}
    for key in timed[0]["work"]["layers"]:
        l, kernel = key
        work = sum((e["work"]["layers"][key] for e in timed), Work())
        secs = sum(e["layer_seconds"].get(f"{l}:{kernel}", 0.0) for e in timed)
        layers[f"{l}:{kernel}"] = roofline_point(work, secs, peak_gflops, bandwidth)
    for e in epochs:  # JSON-friendly work records
        e["work"] = {
            "phases": {p: vars(w) for p, w in e["work"]["phases"].items()},
            "layers": {f"{l}:{k}": vars(w) for (l, k), w in e["work"]["layers"].items()},
        }
    return {
        "threads": threads,
        "widths": widths,
        "peaks": peaks,
        "timed_epochs": len(timed),
        "median_trainer": median_record,
        "median_seconds": median_s,
        "phases": phases,
        "layers": layers,
        "epochs": epochs,
    }


# --------------------------------------------------------------------------- plot

#: Colours of the phases (stacked bars and roofline points alike).
_PHASE_COLOURS = dict(zip(PHASES, (
    "#8c564b", "#c49c94", "#1f77b4", "#ff7f0e", "#2ca02c", "#c7c7c7",
    "#98df8a", "#ffbb78", "#f7b6d2", "#aec7e8", "#7f7f7f", "#bcbd22",
), strict=True))  # fmt: skip


def plot(result: dict[str, Any], path: Path) -> None:
    """Three panels: the roofline of the largest thread count with its phases and layer
    kernels; the epoch split per thread count; each phase's fraction of its attainable
    rate per thread count."""
    runs = result["runs"]
    fig, (roof, split, frac) = panels(3)
    run = runs[-1]
    peak, bw = run["peaks"]["gemm"]["gflops"], run["peaks"]["copy"]["gbps"]
    points = {k: v for k, v in run["layers"].items() if "achieved_gflops" in v}
    ais = [v["ai_flop_per_byte"] for v in points.values()]
    lo, hi = min([*ais, peak / bw]) / 4, max([*ais, peak / bw]) * 4
    xs = np.geomspace(lo, hi, 200)
    roof.plot(xs, np.minimum(peak, xs * bw), color="black", label=f"roof, {run['threads']} thr.")
    cache_bw = run["peaks"]["copy_cache_resident"]["gbps"]
    roof.plot(xs, np.minimum(peak, xs * cache_bw), color="black", linestyle=":", linewidth=0.8,
              label="roof with the cache-resident copy")  # fmt: skip
    for other in runs[:-1]:
        p, b = other["peaks"]["gemm"]["gflops"], other["peaks"]["copy"]["gbps"]
        roof.plot(xs, np.minimum(p, xs * b), color="grey", linestyle="--", linewidth=0.8,
                  label=f"roof, {other['threads']} thr.")  # fmt: skip
    for name, v in points.items():
        kernel = name.split(":")[1]
        roof.scatter(v["ai_flop_per_byte"], v["achieved_gflops"], color=_PHASE_COLOURS[kernel])
        roof.annotate(f"L{name}", (v["ai_flop_per_byte"], v["achieved_gflops"]), fontsize=6)
    roof.set_xscale("log")
    roof.set_yscale("log")
    roof.set_xlabel("arithmetic intensity (FLOP / byte)")
    roof.set_ylabel("GFLOP/s")
    roof.set_title(f"roofline, {run['threads']} threads (layer:kernel)")
    roof.legend(fontsize=7)

    labels = [str(r["threads"]) for r in runs]
    bottom = np.zeros(len(runs))
    for phase in PHASES:
        values = np.array([max(r["median_seconds"][phase], 0.0) for r in runs])
        split.bar(labels, values, bottom=bottom, label=phase, color=_PHASE_COLOURS[phase])
        bottom += values
    split.set_xlabel("threads")
    split.set_ylabel("median seconds per epoch")
    split.set_title("epoch split")
    split.legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))

    shown = [p for p in ("gather", "agg_fwd", "agg_bwd", "gemm_fwd", "gemm_bwd")
             if all(p in r["phases"] for r in runs)]  # fmt: skip
    width = 0.8 / max(len(runs), 1)
    values = []
    for i, r in enumerate(runs):
        ys = [r["phases"][p]["fraction_of_attainable"] for p in shown]
        values += ys
        xs_bar = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(shown))]
        frac.bar(xs_bar, ys, width, label=f"{r['threads']} threads")
    reference_line(frac, 1.0, "attainable (roofline)", color="black")
    frac.set_xticks(range(len(shown)), shown)
    rotate_labels(frac)
    if set_scale(frac, values) == "linear":  # room above the 1.0 line for the legend
        frac.set_ylim(0.0, max([1.0, *values]) * 1.3)
    frac.set_ylabel("achieved / attainable")
    frac.set_title("fraction of the roofline")
    frac.legend(fontsize=7)
    save_figure(fig, path, dpi=110)


# --------------------------------------------------------------------------- main


def parse_threads(text: str, cores: int) -> list[int]:
    """``"1,2,all"`` -> ``[1, 2, cores]`` (ascending, duplicates dropped).

    Raises:
        InputError: an item that is neither a positive integer nor ``all``.
    """
    counts = set()
    for item in text.split(","):
        item = item.strip().lower()
        if item == "all":
            counts.add(cores)
            continue
        try:
            value = int(item)
        except ValueError:
            value = 0
        if value < 1:
            raise InputError(f"--threads {text!r}: {item!r} is not a positive integer or 'all'")
        counts.add(value)
    return sorted(counts)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--threads",
        default="1,2,all",
        help="comma-separated thread counts; 'all' = the usable cores",
    )
    p.add_argument(
        "--dataset",
        default=None,
        help="a dataset spec instead of the built-in uncapped Chung-Lu graph",
    )
    p.add_argument("--nodes", type=int, default=GRAPH_NODES, help="vertices of the Chung-Lu graph")
    p.add_argument("--epochs", type=int, default=3, help="epochs per thread count (first: warm-up)")
    p.add_argument(
        "--prefetch",
        type=int,
        default=0,
        help="--prefetch of the run (0: phases one after the other, as timed)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gemm-size", type=int, default=4096, help="n of the n^3 peak GEMM")
    p.add_argument("--peak-reps", type=int, default=5)
    p.add_argument("--copy-mib", type=int, default=1024, help="MiB per array of the copy")
    p.add_argument(
        "--cache-copy-mib",
        type=int,
        default=16,
        help="MiB per array of the cache-resident copy (context only)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {QUICK_NODES} vertices, 2 epochs, 3 reps, 256 MiB copy",
    )
    p.add_argument("--out", type=Path, default=RESULTS / "roofline.json")
    args = p.parse_args(argv)  # fmt: skip
    if args.quick:
        args.nodes, args.epochs, args.peak_reps, args.copy_mib = QUICK_NODES, 2, 3, 256
    for flag in ("nodes", "epochs", "gemm_size", "peak_reps", "copy_mib", "cache_copy_mib"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1")
    cores = len(os.sched_getaffinity(0))
    try:
        thread_counts = parse_threads(args.threads, cores)
    except InputError as exc:
        p.error(str(exc))
    start = load_facts()
    t0 = time.perf_counter()
    graph = (
        load_dataset(args.dataset)
        if args.dataset
        else chung_lu_uncapped_graph(nodes=args.nodes, seed=args.seed)
    )
    print(f"{graph.summary()} (built in {time.perf_counter() - t0:.1f} s)", flush=True)
    local = LocalGraph.from_graph(graph)
    runs = [run_threads(local, t, args) for t in thread_counts]
    base = runs[0]["median_trainer"]["epoch_time"]
    for r in runs:
        r["epoch_speedup_vs_first"] = round(base / r["median_trainer"]["epoch_time"], 3)
    result = {
        "benchmark": "roofline",
        "command": command_line(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine_facts(),
        "load_start": start,
        "load_end": load_facts(),
        "dataset": args.dataset or "chung_lu_uncapped",
        "summary": graph.summary(),
        "notes": graph.notes,
        "degrees": degree_facts(graph),
        "quick": args.quick,
        "epochs": args.epochs,
        "prefetch": args.prefetch,
        "runs": runs,
    }
    write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
