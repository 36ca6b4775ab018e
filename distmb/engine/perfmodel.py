"""The scaling model of docs/scaling.md: what one training iteration costs a rank, from the
work it counted (``per_rank`` records), how the counted quantities grow with the number of
ranks P, an alpha-beta network, and the projection of an epoch to other graphs, rank counts
and sockets.

Pure functions of numbers, no training and no MPI: ``benchmarks/scaling.py`` feeds them
measured runs; ``tests/test_perfmodel.py`` checks them on inputs with known answers.

Units: seconds, bytes, FLOPs (one multiply-add = 2 FLOPs), rates per second. Per-layer
arrays are input layer first (``layer 0`` reads the input features), like the blocks.

The compute model is that of GraphSAGE with the mean aggregator and the fused kernels
(:class:`distmb.nn.sage.SAGEConv`): layer ``l`` maps width ``c = dims[l]`` to
``k = dims[l + 1]`` over a block with ``n_dst`` destinations, ``n_src`` sources and ``E``
edges. When ``k < c`` the layer projects every source first (``2 n_src c k`` FLOPs) and
aggregates ``k``-wide rows; else it aggregates ``c``-wide rows and applies both weights to the
destinations (``4 n_dst c k``). Backward doubles the GEMM FLOPs (input and weight
gradients) except at layer 0, whose input needs no gradient (weight gradient only, and no
aggregation backward).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from distmb.core.units import FLOAT32_BYTES, ID_BYTES, row_message_bytes

#: FLOPs of one multiply-add.
FLOPS_PER_FMA = 2
#: Index bytes per edge the aggregation forward reads (an int64 source position).
AGG_FWD_INDEX_BYTES = ID_BYTES
#: Index and weight bytes per edge of the aggregation backward (transposed CSR: an int64
#: destination and a float32 factor).
AGG_BWD_INDEX_BYTES = ID_BYTES + FLOAT32_BYTES


# -- work of one iteration ---------------------------------------------------------------------
@dataclass(frozen=True)
class IterationWork:
    """What one iteration of one rank computes and moves.

    Attributes:
        gemm_flops: FLOPs of the UPDATE products, forward and backward.
        gemm_by_shape: the same per layer as ``(c, k, flops)`` (input and output width of
            the layer's products), to price each at its own rate.
        grad_input_bytes: bytes of the input-gradient buffers of the layers past the first
            (``n_src * c * 4`` each): autograd zero-fills, accumulates and reads them around
            the kernels (the backward of the destinations' slice ``x_src[:n_dst]`` and of the
            concatenation with the halo rows); priced at a calibrated number of passes.
        agg_bytes: bytes the aggregation kernels read and write, forward and backward.
        hec_bytes: bytes of halo traffic in memory: the cache's rows looked up, pushed
            (gathered into the send buffer) and stored on arrival, and the copy of every
            layer input that has halo rows (``torch.cat`` of the computed and halo rows:
            ``n_src * c * 4`` read and written).
    """

    gemm_flops: float
    agg_bytes: float
    hec_bytes: float = 0.0
    gemm_by_shape: tuple[tuple[int, int, float], ...] = ()
    grad_input_bytes: float = 0.0

    @property
    def memory_bytes(self) -> float:
        """Bytes priced at the memory bandwidth: aggregation and cache traffic."""
        return self.agg_bytes + self.hec_bytes


def sage_iteration_work(
    dims: Sequence[int],
    block_dst: Sequence[float],
    block_src: Sequence[float],
    block_edges: Sequence[float],
    hec_rows: Sequence[float] | None = None,
    block_halo: Sequence[float] | None = None,
) -> IterationWork:
    """The work of one GraphSAGE iteration (module docstring) from its block sizes.

    Args:
        dims: widths ``[d_0, ..., d_L]``: input features, hidden layers, classes (``L + 1``
            values for ``L`` layers).
        block_dst, block_src, block_edges: per layer (``L`` values), destinations, sources
            and aggregated edges of the iteration's blocks (averages are fine).
        hec_rows: per layer, rows the historical cache moved in memory (lookups + pushed +
            received), each a (``VID_o``, ``d_l``-wide row) message; None: no cache.
        block_halo: per layer, halo leaves of the blocks; a layer with some has its input
            concatenated from the computed and the halo rows. None: no halo.

    Raises:
        ValueError: the arrays do not have one value per layer.
    """
    layers = len(dims) - 1
    for name, values in (("block_dst", block_dst), ("block_src", block_src)):
        if len(values) != layers:
            raise ValueError(f"{name} has {len(values)} values, expected {layers} (one per layer)")
    for values in (block_edges, hec_rows, block_halo):
        if values is not None and len(values) != layers:
            raise ValueError(
                f"block_edges, hec_rows, block_halo need {layers} values (one per layer)"
            )
    flops = agg = hec = grad_input = 0.0
    by_shape = []
    for layer in range(layers):
        c, k = dims[layer], dims[layer + 1]
        n_dst, n_src, edges = (
            float(block_dst[layer]),
            float(block_src[layer]),
            float(block_edges[layer]),
        )
        first = layer == 0
        if k < c:  # project the sources, aggregate k-wide rows
            forward = FLOPS_PER_FMA * (n_src + n_dst) * c * k
            width = k
        else:  # aggregate c-wide rows, then both weights on the destinations
            forward = 2 * FLOPS_PER_FMA * n_dst * c * k
            width = c
        flops += forward * (2 if first else 3)
        by_shape.append((c, k, forward * (2 if first else 3)))
        row = width * FLOAT32_BYTES
        agg += edges * (row + AGG_FWD_INDEX_BYTES) + n_dst * row
        if not first:
            agg += edges * (row + AGG_BWD_INDEX_BYTES) + n_src * row
            grad_input += n_src * c * FLOAT32_BYTES
        if hec_rows is not None:
            hec += float(hec_rows[layer]) * row_message_bytes(dims[layer])
        if block_halo is not None and block_halo[layer] > 0:
            hec += 2 * n_src * c * FLOAT32_BYTES  # the concatenated layer input
    return IterationWork(flops, agg, hec, tuple(by_shape), grad_input)


@dataclass(frozen=True)
class LayerShape:
    """How one layer's block grows from its destinations (per-seed ratios, measured).

    Attributes:
        edges_per_dst: sampled edges per destination (the fan-out, less where the degree is
            smaller).
        unique: sources per (destinations + sampled edges): below 1 where several edges
            reach the same vertex.
        halo_fraction: halo leaves per source (the sources owned by another rank; they are
            leaves, not expanded by the layer below).
        edge_keep: aggregated edges per sampled edge (the halo scheme drops the edges of
            missed halo leaves; 1 without misses).
    """

    edges_per_dst: float
    unique: float
    halo_fraction: float = 0.0
    edge_keep: float = 1.0


def chain_blocks(layers: Sequence[LayerShape], seeds: float) -> dict[str, list[float]]:
    """Block sizes of a batch of ``seeds`` seeds, from the seeds' layer down: the last
    layer has ``seeds`` destinations; layer ``l`` samples ``edges_per_dst`` edges per
    destination, has ``unique * (dst + edges)`` sources of which ``halo_fraction`` are halo
    leaves, and the others are the destinations of layer ``l - 1``.

    Returns:
        ``dst``, ``src``, ``halo``, ``edges_sampled``, ``edges`` (aggregated), each a list
        with one value per layer, input layer first.
    """
    count = len(layers)
    out: dict[str, list[float]] = {
        k: [0.0] * count for k in ("dst", "src", "halo", "edges_sampled", "edges")
    }
    dst = float(seeds)
    for layer in reversed(range(count)):
        shape = layers[layer]
        sampled = shape.edges_per_dst * dst
        src = shape.unique * (dst + sampled)
        halo = shape.halo_fraction * src
        out["dst"][layer], out["src"][layer], out["halo"][layer] = dst, src, halo
        out["edges_sampled"][layer] = sampled
        out["edges"][layer] = shape.edge_keep * sampled
        dst = src - halo
    return out


# -- rates -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CoreRates:
    """Throughputs of one core, measured (``benchmarks/scaling.py``, one thread).

    Attributes:
        flop_rate: FLOP/s of the fused UPDATE kernel, forward + backward (shapes without a
            rate of their own).
        agg_bandwidth: bytes/s of the fused aggregation kernels by :func:`sage_iteration_work`'s
            byte count (rows gathered by index: below the copy bandwidth).
        copy_bandwidth: bytes/s of a streaming copy (read + write), the yardstick the socket's
            bandwidth is scaled by.
        sample_edge_s: CPU seconds of the sampler per sampled edge.
        gemm_rates: ``(c, k, FLOP/s)`` of the fused UPDATE at a layer's widths (a
            ``c -> k`` layer with ``c = 100`` runs at another rate than ``256 -> 256``).
    """

    flop_rate: float
    agg_bandwidth: float
    copy_bandwidth: float
    sample_edge_s: float = 0.0
    gemm_rates: tuple[tuple[int, int, float], ...] = ()

    def gemm_rate(self, c: int, k: int) -> float:
        """FLOP/s of a ``c -> k`` layer's products (:attr:`flop_rate` when not measured)."""
        for rc, rk, rate in self.gemm_rates:
            if (rc, rk) == (c, k):
                return rate
        return self.flop_rate

    def gemm_seconds(self, work: IterationWork) -> float:
        """One core's seconds of ``work``'s products, each layer at its widths' rate."""
        if not work.gemm_by_shape:
            return work.gemm_flops / self.flop_rate
        return sum(flops / self.gemm_rate(c, k) for c, k, flops in work.gemm_by_shape)


@dataclass(frozen=True)
class Socket:
    """A CPU socket running one rank (the paper's layout).

    Attributes:
        name: what it is, for the record.
        cores: cores the rank's threads use.
        parallel_efficiency: fraction of ``cores`` times the one-core FLOP rate that the
            kernels reach (an assumption, stated where used).
        stream_bandwidth: bytes/s of the socket's memory (STREAM-like copy).
        core_speed: speed of one of its cores relative to the measured core (the clock
            ratio for cores of the same vector width), applied to the FLOP rate and to the
            per-iteration serial overhead (Python, framework); 1.0 = the same.
    """

    name: str
    cores: int
    parallel_efficiency: float
    stream_bandwidth: float
    core_speed: float = 1.0

    @property
    def flop_scale(self) -> float:
        """The socket's FLOP rate over one measured core's: ``cores * efficiency *
        core_speed``."""
        return self.core_speed * self.cores * self.parallel_efficiency

    def bandwidth_scale(self, core: CoreRates) -> float:
        """How many measured cores' worth of memory bandwidth the socket has: the
        cores' own (``cores * efficiency``) until the socket's stream bandwidth caps it."""
        return min(
            self.cores * self.parallel_efficiency, self.stream_bandwidth / core.copy_bandwidth
        )


@dataclass(frozen=True)
class Network:
    """Alpha-beta network of the ranks.

    Attributes:
        name: what it is.
        alpha_s: seconds per message (latency, software included).
        link_bandwidth: bytes/s of one node's link.
        ranks_per_node: ranks sharing that link (sockets per node).
    """

    name: str
    alpha_s: float
    link_bandwidth: float
    ranks_per_node: int = 1

    @property
    def rank_bandwidth(self) -> float:
        """bytes/s one rank gets when every rank of a node sends at once."""
        return self.link_bandwidth / self.ranks_per_node


def ring_allreduce_seconds(payload_bytes: float, ranks: int, net: Network) -> float:
    """Ring all-reduce of ``payload_bytes`` per rank: ``2 (P - 1)`` steps, each a message
    of ``payload / P`` bytes (reduce-scatter then all-gather). 0 for one rank."""
    if ranks <= 1:
        return 0.0
    steps = 2 * (ranks - 1)
    return steps * net.alpha_s + steps / ranks * payload_bytes / net.rank_bandwidth


def alltoall_seconds(bytes_per_rank: float, ranks: int, net: Network) -> float:
    """Pairwise all-to-all(v) of ``bytes_per_rank`` sent by every rank (spread over its
    ``P - 1`` peers): ``P - 1`` messages and the bytes at the rank's bandwidth."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) * net.alpha_s + bytes_per_rank / net.rank_bandwidth


def small_alltoall_seconds(ranks: int, net: Network) -> float:
    """All-to-all of a few bytes per peer (the push counts): ``ceil(log2 P)`` latencies
    (Bruck's algorithm)."""
    return math.ceil(math.log2(ranks)) * net.alpha_s if ranks > 1 else 0.0


# -- trends in P -------------------------------------------------------------------------------
#: Forms of :class:`Trend`: a line in ``log2 P``, or a power law (a line in ``log2 y``).
TREND_FORMS = ("linear", "power")


@dataclass(frozen=True)
class Trend:
    """How a quantity grows with the rank count P.

    ``form="linear"``: ``y = intercept + slope * log2(P)`` (fractions and ratios, which a
    line in ``log2 P`` keeps bounded over a few doublings); ``form="power"``:
    ``log2(y) = intercept + slope * log2(P)``, i.e. ``y = 2**intercept * P**slope``
    (positive sizes that shrink or grow without crossing zero). Either is clipped to
    ``[low, high]`` when given.

    Attributes:
        intercept, slope: the least-squares line (in ``log2 y`` for ``power``).
        form: one of :data:`TREND_FORMS`.
        low, high: bounds of the quantity, or None.
        points: the ``(P, y)`` it was fitted to.
    """

    intercept: float
    slope: float
    form: str = "linear"
    low: float | None = None
    high: float | None = None
    points: tuple[tuple[float, float], ...] = ()

    def __call__(self, ranks: float | np.ndarray) -> float | np.ndarray:
        y = self.intercept + self.slope * np.log2(ranks)
        if self.form == "power":
            y = np.exp2(y)
        if self.low is not None or self.high is not None:
            y = np.clip(y, self.low, self.high)
        return float(y) if np.ndim(y) == 0 else y

    def as_dict(self) -> dict:
        return {
            "form": self.form,
            "intercept": self.intercept,
            "slope": self.slope,
            "low": self.low,
            "high": self.high,
            "points": [list(p) for p in self.points],
        }

    @classmethod
    def from_dict(cls, d: dict) -> Trend:
        """Inverse of :meth:`as_dict`."""
        return cls(
            d["intercept"],
            d["slope"],
            d["form"],
            d["low"],
            d["high"],
            tuple(tuple(p) for p in d.get("points", ())),
        )


def fit_trend(
    ranks: Sequence[float],
    values: Sequence[float],
    low: float | None = None,
    high: float | None = None,
    form: str = "linear",
) -> Trend:
    """Least-squares :class:`Trend` of ``form`` through ``(ranks[i], values[i])``; one
    distinct rank count gives a flat line through the mean.

    Raises:
        ValueError: no points, lengths differ, a rank count below 1, an unknown form, or a
            value <= 0 for the power form.
    """
    if form not in TREND_FORMS:
        raise ValueError(f"fit_trend: form must be one of {TREND_FORMS}, got {form!r}")
    p = np.asarray(ranks, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    if p.size == 0 or p.shape != y.shape:
        raise ValueError(f"fit_trend: {p.size} rank counts and {y.size} values")
    if (p < 1).any():
        raise ValueError(f"fit_trend: rank counts must be >= 1, got {p.tolist()}")
    if form == "power":
        if (y <= 0).any():
            raise ValueError(f"fit_trend: a power law needs values > 0, got {y.tolist()}")
        target = np.log2(y)
    else:
        target = y
    x = np.log2(p)
    if np.ptp(x) == 0:
        a, b = float(target.mean()), 0.0
    else:
        b, a = (float(v) for v in np.polyfit(x, target, 1))
    return Trend(a, b, form, low, high, tuple(zip(p.tolist(), y.tolist(), strict=True)))


def relative_error(predicted: float, measured: float) -> float:
    """``(predicted - measured) / measured``."""
    return (predicted - measured) / measured


# -- the compute of a rank ---------------------------------------------------------------------
@dataclass(frozen=True)
class ComputeModel:
    """CPU seconds of one iteration on one core: the products at their widths' rates, the
    memory traffic (aggregation, cache, and ``grad_passes`` passes over the input-gradient
    buffers) at the aggregation bandwidth, and a serial overhead.

    Attributes:
        rates: the core's measured rates.
        overhead_s: serial seconds per iteration (Python, the framework, loss, optimizer),
            measured on a model too small to compute anything.
        grad_passes: passes over :attr:`IterationWork.grad_input_bytes`, calibrated on one
            run (:func:`calibrate`).
    """

    rates: CoreRates
    overhead_s: float
    grad_passes: float = 0.0

    def memory_bytes(self, work: IterationWork) -> float:
        """The bytes priced at the memory bandwidth."""
        return work.memory_bytes + self.grad_passes * work.grad_input_bytes

    def priced_seconds(self, work: IterationWork) -> float:
        """The FLOP and byte terms (no overhead)."""
        return self.rates.gemm_seconds(work) + self.memory_bytes(work) / self.rates.agg_bandwidth

    def seconds(self, work: IterationWork) -> float:
        return self.priced_seconds(work) + self.overhead_s

    def on_socket(self, work: IterationWork, socket: Socket) -> float:
        """Seconds of the same iteration on ``socket``: FLOPs at the socket's rate, bytes at
        the core's aggregation bandwidth times :meth:`Socket.bandwidth_scale`, the overhead
        serial (divided by ``socket.core_speed`` only)."""
        return (
            self.rates.gemm_seconds(work) / socket.flop_scale
            + self.memory_bytes(work)
            / (self.rates.agg_bandwidth * socket.bandwidth_scale(self.rates))
            + self.overhead_s / socket.core_speed
        )


def calibrate(
    rates: CoreRates, work: IterationWork, measured_s: float, overhead_s: float = 0.0
) -> ComputeModel:
    """The model whose ``grad_passes`` make ``work`` cost ``measured_s`` (CPU seconds per
    iteration of the calibration run), given the serial ``overhead_s``. Without input-
    gradient bytes the remainder goes to the overhead instead. The passes may come out
    negative when the rates over-price the work; they are kept as they are (and reported)."""
    base = ComputeModel(rates, overhead_s)
    rest = measured_s - base.seconds(work)
    if work.grad_input_bytes <= 0:
        return ComputeModel(rates, overhead_s + rest)
    return ComputeModel(rates, overhead_s, rest * rates.agg_bandwidth / work.grad_input_bytes)


# -- an epoch ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class GraphSpec:
    """The graph an epoch is projected for.

    Attributes:
        name: e.g. ``ogbn-papers100M``.
        num_nodes, num_edges: vertices and directed in-edges.
        num_train: training vertices (seeds per epoch).
        dims: model widths ``[features, hidden..., classes]``.
    """

    name: str
    num_nodes: int
    num_edges: int
    num_train: int
    dims: tuple[int, ...]


@dataclass(frozen=True)
class EpochProjection:
    """One projected epoch: per-iteration seconds of each part, and the epoch.

    ``iteration_s = max(compute_s, mbc_s) + allreduce_s + push_counts_s + push_exposed_s``:
    mini-batch creation overlaps the compute (distmb prefetches batches on another thread);
    the gradient all-reduce and the push counts block; the pushes' payload overlaps the
    compute and only its excess is exposed.
    """

    ranks: int
    iterations: int
    compute_s: float
    mbc_s: float
    allreduce_s: float
    push_counts_s: float
    push_s: float
    push_exposed_s: float
    imbalance: float

    @property
    def iteration_s(self) -> float:
        return (
            max(self.compute_s, self.mbc_s)
            + self.allreduce_s
            + self.push_counts_s
            + self.push_exposed_s
        )

    @property
    def epoch_s(self) -> float:
        return self.iterations * self.iteration_s

    def as_dict(self) -> dict:
        return {
            "ranks": self.ranks,
            "iterations": self.iterations,
            "compute_s": self.compute_s,
            "mbc_s": self.mbc_s,
            "allreduce_s": self.allreduce_s,
            "push_counts_s": self.push_counts_s,
            "push_s": self.push_s,
            "push_exposed_s": self.push_exposed_s,
            "imbalance": self.imbalance,
            "iteration_s": self.iteration_s,
            "epoch_s": self.epoch_s,
        }


def iterations_per_epoch(
    num_train: int, ranks: int, batch_size: int, train_imbalance: float
) -> int:
    """Iterations every rank runs: the largest part's ``ceil(n_train / batch)``, the part
    holding ``train_imbalance`` (max/mean) times the mean share."""
    return max(1, math.ceil(num_train * train_imbalance / ranks / batch_size))


def project_epoch(
    *,
    ranks: int,
    iterations: int,
    work: IterationWork,
    compute: ComputeModel,
    socket: Socket,
    net: Network,
    mbc_cpu_s: float,
    allreduce_payload_bytes: float,
    push_bytes_per_layer: Sequence[float],
    imbalance: float = 1.0,
) -> EpochProjection:
    """Project one epoch on ``ranks`` sockets.

    Args:
        iterations: iterations per epoch (:func:`iterations_per_epoch`).
        work: the mean rank's work per iteration.
        compute: the calibrated compute model.
        mbc_cpu_s: one core's CPU seconds of mini-batch creation per iteration (sampling
            and feature gather), spread over the socket's cores like the kernels.
        allreduce_payload_bytes: the gradient buffer (``4 * parameters``).
        push_bytes_per_layer: bytes a rank pushes per iteration at each layer (one
            all-to-all-v per layer that pushes; zeros are skipped).
        imbalance: slowest rank's compute over the mean rank's (multiplies the compute).
    """
    compute_s = compute.on_socket(work, socket) * imbalance
    mbc_s = mbc_cpu_s / (socket.cores * socket.parallel_efficiency)
    pushing = [b for b in push_bytes_per_layer if b > 0]
    push_s = sum(alltoall_seconds(b, ranks, net) for b in pushing)
    return EpochProjection(
        ranks=ranks,
        iterations=iterations,
        compute_s=compute_s,
        mbc_s=mbc_s,
        allreduce_s=ring_allreduce_seconds(allreduce_payload_bytes, ranks, net),
        push_counts_s=len(pushing) * small_alltoall_seconds(ranks, net),
        push_s=push_s,
        push_exposed_s=max(0.0, push_s - compute_s),
        imbalance=imbalance,
    )
