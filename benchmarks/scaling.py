"""Scaling model of multi-rank training: measured at P = 1, 2, 4, 8 here, fitted, and
projected to ogbn-products and ogbn-papers100M at 16, 32 and 64 ranks (docs/scaling.md).

1. **Core rates** (one thread, CPU time): the fused UPDATE kernel's FLOP rate at every
   layer width of the two models, the fused aggregation's bandwidth, a streaming copy's
   bandwidth, and the serial per-iteration overhead (a model too small to compute).
2. **Runs**: for each graph shape (products: average degree 50, 100 features, 47 classes;
   papers: degree 29, 128 features, 172 classes), a synthetic graph is generated and
   partitioned (METIS, halo features replicated) into 1, 2, 4 and 8 parts, and GraphSAGE with
   the paper's defaults (3 layers, hidden 256, fan-out 5,10,15, batch 1000 per rank, HEC
   cs 1M / nc 2000 / ls 2 / d 1) trains on each: P = 1 as one process, P > 1 under
   ``mpiexec -n P``, every rank ``--threads 1``. This machine has 2 cores, so P = 4 and 8
   are oversubscribed: wall times are not per-socket figures. Per-rank compute is the
   training thread's CPU time (``per_rank_time.compute_cpu``: forward, backward and
   optimizer CPU seconds without those inside the pushes' MPI calls), mini-batch creation
   the loader thread's (``sample_cpu + gather_cpu``); one thread per rank makes these the
   whole cost, whoever else held the core.
3. **Block sizes vs graph size** (sampling only): per-seed block sizes at P = 1 on larger
   graphs of each shape, to carry the measured work to the real graphs' sizes.
4. **Model and fits** (:mod:`distmb.engine.perfmodel`): per-iteration compute from counted FLOPs and
   bytes at the core rates, with the passes over the input-gradient buffers calibrated on
   P = 1, checked against every rank of P = 2, 4, 8; the block sizes' layer ratios, hit
   rates, halo fraction, cut and imbalances as trends in ``log2 P`` of P = 2, 4, 8, checked
   by fitting P = 2, 4 and predicting P = 8; pushes at the per-peer cap ``nc (P - 1)``.
5. **Projection** of epoch time for the real graphs at P = 2 ... 64 on stated sockets and
   networks, with the bound of batches that keep their one-rank size.

Writes ``results/scaling.json`` and ``results/scaling.png``.

    python benchmarks/scaling.py              # 20-30 min on a shared 2-core machine
    python benchmarks/scaling.py --reanalyse  # fits, projection, figure, tables of the JSON
    python benchmarks/scaling.py --quick --out /tmp/q.json   # 20k vertices, P = 1, 2, 2 epochs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from record import command_line

from distmb import _C
from distmb.cli.report import save_figure, write_json
from distmb.config.train import TrainConfig
from distmb.core.plotting import panels, set_scale
from distmb.core.units import FLOAT32_BYTES, row_message_bytes
from distmb.data.datasets.synthetic import SyntheticConfig, generate
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.perfmodel import (
    ComputeModel,
    CoreRates,
    GraphSpec,
    IterationWork,
    LayerShape,
    Network,
    Socket,
    Trend,
    calibrate,
    chain_blocks,
    fit_trend,
    iterations_per_epoch,
    project_epoch,
    relative_error,
    sage_iteration_work,
)
from distmb.nn.kernels import cpu_aggregate as fused_aggregate
from distmb.nn.kernels import cpu_update as fused_update
from distmb.partition import partition_graph
from distmb.pipeline.sample import Block
from distmb.pipeline.sample.host import NeighborSampler

RESULTS = Path(__file__).resolve().parents[1] / "results"
PYTHON = sys.executable
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")

#: The paper's GraphSAGE settings (Table 2) and HEC parameters (section 4.4).
FANOUT = (5, 10, 15)
HIDDEN = 256
BATCH = 1000
HEC = {"cs": 1_000_000, "nc": 2000, "ls": 2, "d": 1}
#: Ranks measured here, and projected.
MEASURED_RANKS = (1, 2, 4, 8)
PROJECTED_RANKS = (2, 4, 8, 16, 32, 64)
#: Epochs per run; the statistics are the mean of the epochs after the first (whose caches
#: start empty and whose first iterations warm up the allocator).
EPOCHS = 3
#: Per-process address-space cap of the runs (a runaway fails instead of the OOM killer).
PROCESS_MEMORY_CAP = 6 << 30
#: METIS memory budget (GiB), fixed so that the partitions do not depend on this machine.
METIS_BUDGET_GIB = 5.0

#: Graph shapes. ``train_fraction`` is raised from the real 8 % (products) and 1.1 %
#: (papers) to 10 % for both, so that every rank of P = 8 still runs 5 iterations of 1000
#: seeds (docs/scaling.md, "Inputs").
SHAPES: dict[str, dict[str, Any]] = {
    "products": {
        "synthetic": SyntheticConfig(
            nodes=400_000, avg_degree=50, feat_dim=100, classes=47,
            train_fraction=0.1, val_fraction=0.01, test_fraction=0.01,
        ),
        "real": GraphSpec("ogbn-products", 2_449_029, 123_718_280, 196_615, (100, 256, 256, 47)),
        "size_sweep": (1_000_000, 2_000_000),
    },
    "papers": {
        "synthetic": SyntheticConfig(
            nodes=400_000, avg_degree=29, feat_dim=128, classes=172,
            train_fraction=0.1, val_fraction=0.01, test_fraction=0.01,
        ),
        "real": GraphSpec(
            "ogbn-papers100M", 111_059_956, 3_231_371_744, 1_207_179, (128, 256, 256, 172)
        ),
        "size_sweep": (1_000_000, 2_000_000),
    },
}  # fmt: skip
QUICK_NODES, QUICK_SWEEP = 20_000, (40_000,)
QUICK_RANKS = (1, 2)

#: Sockets and networks of the projection. The paper's distributed runs: Xeon Platinum
#: 8360Y (36 cores, 2.4 GHz base, 8 channels DDR4-3200 = 204.8 GB/s peak), two sockets per
#: node, one rank per socket, Mellanox HDR (200 Gb/s). The brief's alternative: a 56-core
#: Xeon (Sapphire Rapids 8480+, 2.0 GHz base, 8 channels DDR5-4800 = 307.2 GB/s peak) on
#: 100 Gb/s InfiniBand. Assumptions (docs/scaling.md): STREAM-like bandwidth 80 % of peak;
#: a core runs at the measured core's rate times the ratio of base clocks (all AVX-512; the
#: measured core reports 2.3 GHz); 2 us per MPI message. Parallel efficiency (the socket's
#: rate over cores x one core's): 0.3, what distmb's iteration reached on the 16-core Xeon
#: host of results/prefetch-h100node-t16-l16.json (0.128 s per iteration at 16 threads for
#: work that costs ~0.6 s on one core here); 0.7 as an optimistic bound.
STREAM_OF_PEAK = 0.8
MEASURED_EFFICIENCY = 0.3
OPTIMISTIC_EFFICIENCY = 0.7
MEASURED_CLOCK_GHZ = 2.3
MPI_ALPHA_S = 2.0e-6
PAPER_SOCKET = ("Xeon 8360Y, 36 cores, 2.4 GHz", 36, STREAM_OF_PEAK * 204.8e9, 2.4)
SPR_SOCKET = ("Xeon 8480+, 56 cores, 2.0 GHz", 56, STREAM_OF_PEAK * 307.2e9, 2.0)
HDR = Network("HDR InfiniBand 200 Gb/s, 2 ranks per node", MPI_ALPHA_S, 200e9 / 8, 2)
EDR = Network("InfiniBand 100 Gb/s, 2 ranks per node", MPI_ALPHA_S, 100e9 / 8, 2)


def _socket(spec: tuple[str, int, float, float], efficiency: float) -> Socket:
    name, cores, stream, ghz = spec
    return Socket(name, cores, efficiency, stream, ghz / MEASURED_CLOCK_GHZ)


SOCKETS = {
    "8360Y (36c, eff 0.3) + HDR 200 Gb/s": (_socket(PAPER_SOCKET, MEASURED_EFFICIENCY), HDR),
    "8360Y (36c, eff 0.7) + HDR 200 Gb/s": (_socket(PAPER_SOCKET, OPTIMISTIC_EFFICIENCY), HDR),
    "8480+ (56c, eff 0.3) + IB 100 Gb/s": (_socket(SPR_SOCKET, MEASURED_EFFICIENCY), EDR),
}
#: The paper's figures compared against (section 4.4).
PAPER = {
    "papers100M_epoch_s_64": 2.0,
    "papers100M_speedup_4_to_64": 10.0,
    "products_speedup_2_to_16": 7.5,
    "hit_rate_64": [0.71, 0.47, 0.37],
}

#: Core-rate measurement sizes (rows, widths, fan-out, sources) and repetitions.
CAL_ROWS, CAL_WIDTH, CAL_FANOUT, CAL_SOURCES, CAL_REPS = 20_000, 256, 10, 150_000, 5
CAL_COPY_BYTES = 256 << 20
#: Batches sampled per graph in the block-size sweep.
SWEEP_BATCHES = 12


# -- machine -----------------------------------------------------------------------------------
def machine_facts() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = ""
    try:
        flags = next(
            line
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        )
    except (OSError, StopIteration):
        pass
    return {
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "avx512": "avx512f" in flags,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", ""),
        "load_average_1min_at_start": round(os.getloadavg()[0], 2),
    }


def _median_seconds(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return statistics.median(times)


#: Layer widths whose UPDATE rate is measured: ``(c, k, input layer)``. ``k >= c`` layers
#: apply two products to the destinations (the input layer computes no input gradient);
#: ``k < c`` layers (the output layers) one product to all sources and one to the
#: destinations, each timed as a one-product update.
GEMM_SHAPES = ((100, 256, True), (128, 256, True), (256, 256, False), (256, 47, False),
               (256, 172, False))  # fmt: skip


def _gemm_rate(rows: int, c: int, k: int, first: bool, gen: torch.Generator) -> float:
    """FLOP/s of the fused UPDATE of a ``c -> k`` layer, forward and backward, one thread."""
    terms = 1 if k < c else 2
    xs = [torch.randn(rows, c, generator=gen).requires_grad_(not first) for _ in range(terms)]
    ws = [(torch.randn(k, c, generator=gen) * c**-0.5).requires_grad_(True) for _ in range(terms)]
    bias = torch.zeros(k, requires_grad=True)
    grad = torch.randn(rows, k, generator=gen)

    def update() -> None:
        y = fused_update.sage_update(list(zip(xs, ws, strict=True)), bias, p=0.5)
        y.backward(grad)

    seconds = _median_seconds(update, CAL_REPS)
    passes = 2 if first else 3  # forward, weight gradient (and input gradient)
    return passes * terms * 2 * rows * c * k / seconds


#: The model too small to compute anything that measures the serial per-iteration overhead:
#: (nodes, degree, features/hidden width, fan-out, batch, epochs).
TINY = (5000, 4, 4, 2, 16, 3)


def serial_overhead() -> float:
    """Training-thread CPU seconds per iteration of a 3-layer GraphSAGE of width 4 on 16-seed
    batches (fan-out 2): Python, the framework, loss and optimizer, with next to no compute
    (median over epochs after the first)."""
    nodes, degree, width, fanout, batch, epochs = TINY
    graph = generate(
        SyntheticConfig(
            nodes=nodes, avg_degree=degree, feat_dim=width, classes=width,
            train_fraction=0.5, val_fraction=0.01, test_fraction=0.01,
        )
    )  # fmt: skip
    config = TrainConfig(
        epochs=epochs, eval_every=10 * epochs, progress=False, threads=1, prefetch=0,
        hidden=width, fanout=(fanout,) * len(FANOUT), batch_size=batch,
    )  # fmt: skip
    history = Trainer(LocalGraph.from_graph(graph), config, log=lambda _: None).fit()
    return statistics.median(
        r["per_rank_time"][0]["compute_cpu"] / r["per_rank"][0]["iterations"] for r in history[1:]
    )


def core_rates(quick: bool) -> dict[str, Any]:
    """One-thread FLOP rates of the fused UPDATE at the models' layer widths (fwd + bwd),
    bandwidth of the fused mean aggregation (fwd + bwd, by the model's byte count) and of a
    streaming copy. CPU seconds of this thread (medians), so other jobs on the machine do
    not inflate them."""
    torch.set_num_threads(1)
    _C.set_num_threads(1)
    rows = CAL_ROWS // (10 if quick else 1)
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {"threads": 1, "rows": rows, "gemm": []}
    for c, k, first in GEMM_SHAPES:
        rate = _gemm_rate(rows, c, k, first, gen)
        out["gemm"].append({"c": c, "k": k, "input_layer": first, "flop_rate": rate})
    out["flop_rate"] = next(
        g["flop_rate"] for g in out["gemm"] if (g["c"], g["k"]) == (CAL_WIDTH, CAL_WIDTH)
    )
    # AGG: mean over a sampled-like block (fan-out CAL_FANOUT, power-law-free sources).
    sources = CAL_SOURCES // (10 if quick else 1)
    rng = np.random.default_rng(0)
    indptr = torch.arange(0, (rows + 1) * CAL_FANOUT, CAL_FANOUT, dtype=torch.int64)
    indices = torch.from_numpy(rng.integers(0, sources, rows * CAL_FANOUT))
    block = Block(rows, sources, 0, indptr, indices, torch.arange(sources))
    x = torch.randn(sources, CAL_WIDTH, generator=gen).requires_grad_(True)
    gout = torch.randn(rows, CAL_WIDTH, generator=gen)

    def agg() -> None:
        fresh = Block(block.n_dst, block.n_src, 0, block.indptr, block.indices, block.src_ids)
        fused_aggregate.aggregate(fresh, x, "mean").backward(gout)

    s = _median_seconds(agg, CAL_REPS)
    work = sage_iteration_work(
        [CAL_WIDTH, CAL_WIDTH, CAL_WIDTH], [0, rows], [0, sources], [0, rows * CAL_FANOUT]
    )  # layer 1 of a 2-layer model: aggregation forward and backward, no projection
    out["agg_s"] = s
    out["agg_bandwidth"] = work.agg_bytes / s
    out["serial_overhead_s"] = serial_overhead()
    # Streaming copy (read + write bytes).
    n = (CAL_COPY_BYTES // (8 if quick else 1)) // FLOAT32_BYTES
    src, dst = np.ones(n, np.float32), np.zeros(n, np.float32)
    s = _median_seconds(lambda: _C.stream_copy(src, dst), CAL_REPS)
    out["copy_bandwidth"] = 2 * n * FLOAT32_BYTES / s
    print(
        "core: UPDATE "
        + ", ".join(f"{g['c']}->{g['k']} {g['flop_rate'] / 1e9:.0f}" for g in out["gemm"])
        + f" GFLOP/s, AGG {out['agg_bandwidth'] / 1e9:.2f}"
        f" GB/s, copy {out['copy_bandwidth'] / 1e9:.2f} GB/s, serial overhead "
        f"{1e3 * out['serial_overhead_s']:.2f} ms per iteration (1 thread)",
        flush=True,
    )
    return out


# -- runs --------------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "OMP_WAIT_POLICY": "passive",
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }


def _run(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` under the memory cap, its output into ``log``; wall seconds."""
    capped = ["prlimit", f"--as={PROCESS_MEMORY_CAP}", *cmd] if shutil.which("prlimit") else cmd
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(capped, stdout=f, stderr=subprocess.STDOUT, env=_env(), check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{log.read_text()[-3000:]}"
        )
    return time.perf_counter() - t0


def train_args(part_dir: Path, results: Path, epochs: int) -> list[str]:
    return [
        "-m", "distmb.train", "--part-dir", str(part_dir), "--threads", "1",
        "--fanout", ",".join(map(str, FANOUT)), "--hidden", str(HIDDEN),
        "--batch-size", str(BATCH), "--epochs", str(epochs), "--eval-every", str(epochs),
        "--hec-size", str(HEC["cs"]), "--hec-nc", str(HEC["nc"]),
        "--hec-lifespan", str(HEC["ls"]), "--hec-delay", str(HEC["d"]),
        "--no-progress", "--results", str(results),
    ]  # fmt: skip


def measure_shape(
    name: str, cfg: SyntheticConfig, ranks: tuple[int, ...], epochs: int, workdir: Path
) -> dict[str, Any]:
    """Generate, partition and train on ``cfg`` for every rank count; the records."""
    t0 = time.perf_counter()
    graph = generate(cfg)
    out: dict[str, Any] = {
        "synthetic": cfg.to_spec(),
        "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges,
        "num_train": int(graph.train_idx.size),
        "generate_s": round(time.perf_counter() - t0, 1),
        "runs": {},
    }
    print(f"{name}: {graph.summary()}", flush=True)
    for p in ranks:
        part_dir = workdir / f"{name}-p{p}"
        t0 = time.perf_counter()
        partition_graph(
            graph,
            p,
            part_dir,
            seed=0,
            replicate_halo_features=p > 1,
            memory_budget_gib=METIS_BUDGET_GIB,
            overwrite=True,
        )
        part_s = time.perf_counter() - t0
        meta = json.loads((part_dir / "partition.json").read_text())
        results = workdir / f"{name}-p{p}.jsonl"
        results.unlink(missing_ok=True)
        cmd = [PYTHON, *train_args(part_dir, results, epochs)]
        if p > 1:
            cmd = [MPIEXEC, "-n", str(p), *cmd]
        wall = _run(cmd, workdir / f"{name}-p{p}.log")
        records = [json.loads(line) for line in results.read_text().splitlines()]
        out["runs"][str(p)] = {
            "ranks": p,
            "partition_s": round(part_s, 1),
            "run_wall_s": round(wall, 1),
            "edge_cut": meta["edge_cut"],
            "records": records,
        }
        last = records[-1]
        print(
            f"  P={p}: partition {part_s:.0f}s, run {wall:.0f}s, cut {meta['edge_cut']}, "
            f"epoch {last['epoch_time']:.1f}s wall, hit {last['hec_hit_rate']}",
            flush=True,
        )
        shutil.rmtree(part_dir)
    del graph
    return out


def block_sizes_vs_graph_size(cfg: SyntheticConfig, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """Per-seed block sizes at P = 1 (sampling only, ``SWEEP_BATCHES`` batches of ``BATCH``
    training seeds) on graphs of ``cfg``'s shape with ``sizes`` vertices."""
    rows = []
    for nodes in sizes:
        t0 = time.perf_counter()
        graph = generate(SyntheticConfig(**{**_fields(cfg), "nodes": nodes}))
        sampler = NeighborSampler(
            graph.indptr, graph.indices, graph.num_nodes, graph.num_nodes, FANOUT, 0
        )
        rng = np.random.default_rng(0)
        totals = {k: np.zeros(len(FANOUT)) for k in ("dst", "src", "edges")}
        for i in range(SWEEP_BATCHES):
            seeds = np.sort(rng.choice(graph.train_idx, BATCH, replace=False))
            for layer, block in enumerate(sampler.sample(seeds, 0, i)):
                totals["dst"][layer] += block.n_dst
                totals["src"][layer] += block.n_src
                totals["edges"][layer] += block.num_edges
        seeds_total = SWEEP_BATCHES * BATCH
        row = {"nodes": nodes, **{k: (v / seeds_total).tolist() for k, v in totals.items()}}
        row["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"  sweep {nodes} vertices: src/seed {row['src']}", flush=True)
        rows.append(row)
        del graph, sampler
    return rows


def _fields(cfg: SyntheticConfig) -> dict[str, Any]:
    return {k: getattr(cfg, k) for k in cfg.option_names()}


# -- analysis ----------------------------------------------------------------------------------
def _epochs_after_first(records: list[dict]) -> list[dict]:
    return records[1:] or records


def rank_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Per rank, per-iteration means over the epochs after the first: work counts, CPU
    seconds, traffic; plus the part's sizes."""
    recs = _epochs_after_first(run["records"])
    out = []
    for r in range(run["ranks"]):
        counts = [rec["per_rank"][r] for rec in recs]
        times = [rec["per_rank_time"][r] for rec in recs]
        iters = sum(c["iterations"] for c in counts)

        def per_iter(key: str, counts=counts, iters=iters) -> list[float]:
            return (np.sum([c[key] for c in counts], axis=0) / iters).tolist()

        row = {
            "rank": r,
            "n_solid": counts[0]["n_solid"],
            "n_halo": counts[0]["n_halo"],
            "n_edges": counts[0]["n_edges"],
            "n_train": counts[0]["n_train"],
            "iterations_per_epoch": counts[0]["iterations"],
            "seeds": sum(c["block_dst"][-1] for c in counts) / iters,
            **{
                k: per_iter(k)
                for k in (
                    "block_dst",
                    "block_src",
                    "block_halo",
                    "block_edges_sampled",
                    "block_edges",
                    "hec_lookups",
                    "hec_hits",
                    "rows_pushed",
                    "bytes_pushed",
                    "rows_received",
                    "bytes_received",
                )
            },
            "allreduce_payload_bytes": sum(c["allreduce_payload_bytes"] for c in counts) / iters,
            "compute_cpu_s": sum(t["compute_cpu"] for t in times) / iters,
            "sample_cpu_s": sum(t["sample_cpu"] for t in times) / iters,
            "gather_cpu_s": sum(t["gather_cpu"] for t in times) / iters,
            "comm_mpi_cpu_s": sum(t["comm_mpi_cpu"] for t in times) / iters,
            "ared_cpu_s": sum(t["ared_cpu"] for t in times) / iters,
            "wall_iteration_s": sum(t["epoch_time"] for t in times) / iters,
        }
        out.append(row)
    return out


def iteration_work(row: dict[str, Any], dims: tuple[int, ...]) -> IterationWork:
    hec_rows = [
        lk + pu + rc
        for lk, pu, rc in zip(
            row["hec_lookups"], row["rows_pushed"], row["rows_received"], strict=True
        )
    ]
    return sage_iteration_work(
        dims, row["block_dst"], row["block_src"], row["block_edges"], hec_rows, row["block_halo"]
    )


def gather_bytes(row: dict[str, Any], feat_dim: int) -> float:
    """Feature bytes block 0 gathers per iteration (every source: halo rows replicated)."""
    return row["block_src"][0] * feat_dim * FLOAT32_BYTES


def layer_shapes(per_seed: dict[str, list[float]]) -> list[dict[str, float]]:
    """The :class:`LayerShape` ratios of measured per-seed block sizes."""
    out = []
    for layer in range(len(per_seed["dst"])):
        dst, src = per_seed["dst"][layer], per_seed["src"][layer]
        sampled = per_seed["edges_sampled"][layer]
        out.append(
            {
                "edges_per_dst": sampled / dst,
                "unique": src / (dst + sampled),
                "halo_fraction": per_seed["halo"][layer] / src,
                "edge_keep": per_seed["edges"][layer] / sampled if sampled else 1.0,
            }
        )
    return out


def analyse_shape(
    shape: dict[str, Any], meas: dict[str, Any], rates: CoreRates, overhead_s: float
) -> dict[str, Any]:
    """Compute-model check, trends, hold-out check, for one graph shape."""
    syn: SyntheticConfig = shape["synthetic"]
    dims = (syn.feat_dim, HIDDEN, HIDDEN, syn.classes)
    per_p = {int(p): rank_rows(run) for p, run in meas["runs"].items()}
    ranks = sorted(per_p)
    multi = [p for p in ranks if p > 1]
    one = per_p[1][0]
    # Compute model: overhead calibrated on P = 1. MBC: the sampler's cost per sampled edge
    # calibrated on P = 1; the gather's bandwidth on P = 1 and, for the path that also
    # gathers replicated halo rows, on the smallest P > 1.
    model = calibrate(rates, iteration_work(one, dims), one["compute_cpu_s"], overhead_s)
    sample_edge_s = one["sample_cpu_s"] / sum(one["block_edges_sampled"])
    gather_bw = {1: gather_bytes(one, syn.feat_dim) / one["gather_cpu_s"]}
    if multi:
        first = per_p[multi[0]]
        gather_bw["halo"] = sum(gather_bytes(r, syn.feat_dim) for r in first) / sum(
            r["gather_cpu_s"] for r in first
        )
    checks = []
    for p in ranks:
        for row in per_p[p]:
            pred = model.seconds(iteration_work(row, dims))
            sample_pred = sum(row["block_edges_sampled"]) * sample_edge_s
            gather_pred = gather_bytes(row, syn.feat_dim) / gather_bw[1 if p == 1 else "halo"]
            checks.append(
                {
                    "ranks": p,
                    "rank": row["rank"],
                    "compute_cpu_s": row["compute_cpu_s"],
                    "compute_pred_s": pred,
                    "compute_error": relative_error(pred, row["compute_cpu_s"]),
                    "sample_error": relative_error(sample_pred, row["sample_cpu_s"]),
                    "gather_error": relative_error(gather_pred, row["gather_cpu_s"]),
                    "mbc_error": relative_error(
                        sample_pred + gather_pred, row["sample_cpu_s"] + row["gather_cpu_s"]
                    ),
                }
            )
    summary = {p: summarise(per_p[p], p, meas) for p in ranks}
    trends = fit_trends(summary, ranks)
    holdout = holdout_check(summary, ranks, model, dims) if 8 in ranks else None
    calibration_ranks = {"compute": 1, "sample": 1, "gather": [1, multi[0]] if multi else [1]}
    return {
        "dims": dims,
        "params": sage_params(dims),
        "overhead_s": model.overhead_s,
        "grad_passes": model.grad_passes,
        "p1_split_s": {
            "gemm": rates.gemm_seconds(iteration_work(one, dims)),
            "agg_hec": iteration_work(one, dims).memory_bytes / rates.agg_bandwidth,
            "grad_input": model.grad_passes
            * iteration_work(one, dims).grad_input_bytes
            / rates.agg_bandwidth,
            "overhead": model.overhead_s,
            "measured": one["compute_cpu_s"],
        },
        "sample_edge_s": sample_edge_s,
        "gather_bandwidth": gather_bw.get("halo", gather_bw[1]),
        "gather_bandwidth_p1": gather_bw[1],
        "calibrated_on": calibration_ranks,
        "per_rank": {str(p): per_p[p] for p in ranks},
        "checks": checks,
        "check_summary": _check_summary(checks, calibration_ranks),
        "summary": {str(p): s for p, s in summary.items()},
        "trends": {
            k: [t and t.as_dict() for t in v] if isinstance(v, list) else v.as_dict()
            for k, v in trends.items()
        },
        "holdout": holdout,
    }


def summarise(rows: list[dict[str, Any]], p: int, meas: dict[str, Any]) -> dict[str, Any]:
    """Means over the ranks of P-rank run (imbalance: max / mean of compute)."""

    def mean(key: str) -> float:
        return float(np.mean([r[key] for r in rows]))

    def layer_mean(key: str) -> np.ndarray:
        return np.mean([r[key] for r in rows], axis=0)

    seeds = mean("seeds")
    lookups, hits = layer_mean("hec_lookups"), layer_mean("hec_hits")
    per_seed = {
        k: (layer_mean(f"block_{k}") / seeds).tolist()
        for k in ("dst", "src", "halo", "edges_sampled", "edges")
    }
    push_iters = [max(r["iterations_per_epoch"] - HEC["d"], 1) for r in rows]
    pushed = [
        np.asarray(r["rows_pushed"]) * r["iterations_per_epoch"] / k
        for r, k in zip(rows, push_iters, strict=True)
    ]  # rows per iteration that pushes (none start in the last d of an epoch)
    cap = HEC["nc"] * (p - 1)
    return {
        "halo_fraction": mean("n_halo") / mean("n_solid"),
        "cut_fraction": meas["runs"][str(p)]["edge_cut"] / meas["num_edges"],
        "hit_rate": [float(h / lk) if lk else None for h, lk in zip(hits, lookups, strict=True)],
        "per_seed": per_seed,
        "layers": layer_shapes(per_seed),
        "push_bytes_per_iteration": layer_mean("bytes_pushed").tolist(),
        "push_rows_per_pushing_iteration": np.mean(pushed, axis=0).tolist(),
        "push_cap_rows": cap,
        "push_cap_bound": [
            bool(np.allclose([x[layer] for x in pushed], cap)) if cap else None
            for layer in range(len(FANOUT))
        ],
        "received_bytes_per_iteration": layer_mean("bytes_received").tolist(),
        "allreduce_payload_bytes_per_iteration": mean("allreduce_payload_bytes"),
        "compute_cpu_s": mean("compute_cpu_s"),
        "compute_imbalance": max(r["compute_cpu_s"] for r in rows) / mean("compute_cpu_s"),
        "train_imbalance": max(r["n_train"] for r in rows) / mean("n_train"),
        "sample_cpu_s": mean("sample_cpu_s"),
        "gather_cpu_s": mean("gather_cpu_s"),
        "mbc_cpu_s": mean("sample_cpu_s") + mean("gather_cpu_s"),
        "comm_mpi_cpu_s": mean("comm_mpi_cpu_s"),
        "wall_iteration_s": mean("wall_iteration_s"),
        "iterations_per_epoch": rows[0]["iterations_per_epoch"],
    }


def sage_params(dims: tuple[int, ...]) -> int:
    """GraphSAGE parameters: two weights and a bias per layer."""
    return sum(2 * c * k + k for c, k in zip(dims[:-1], dims[1:], strict=True))


def _check_summary(checks: list[dict], calibrated_on: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"calibrated_on": calibrated_on}
    for p in sorted({c["ranks"] for c in checks}):
        mine = [c for c in checks if c["ranks"] == p]
        row = {}
        for key in ("compute", "sample", "gather", "mbc"):
            errs = [c[f"{key}_error"] for c in mine]
            row[f"{key}_error_median"] = statistics.median(errs)
            row[f"{key}_error_max_abs"] = max(abs(e) for e in errs)
        out[str(p)] = row
    return out


#: Layer-shape ratios fitted in log2 P (each a fraction in [0, 1]); ``edges_per_dst`` is
#: taken as the mean over the runs (it is the fan-out, capped by degrees, for any P).
SHAPE_TRENDS = ("unique", "halo_fraction", "edge_keep")


def fit_trends(summary: dict[int, dict], ranks: list[int]) -> dict[str, Any]:
    """Trends of the runs with P >= 2 (P = 1 has no halo; it calibrates): the layer shapes'
    ratios and hit rates linear in log2 P in [0, 1], the halo fraction per part a power
    law, imbalances linear (>= 1)."""
    multi = [p for p in ranks if p > 1]
    layers = len(FANOUT)

    def per_layer(get, ps=multi, low=0.0, high=1.0):
        out = []
        for layer in range(layers):
            pts = [(p, get(summary[p], layer)) for p in ps]
            pts = [(p, v) for p, v in pts if v is not None]
            out.append(fit_trend(*zip(*pts, strict=True), low, high) if pts else None)
        return out

    trends: dict[str, Any] = {
        f"layer_{key}": per_layer(lambda s, layer, key=key: s["layers"][layer][key])
        for key in SHAPE_TRENDS
    }
    trends["layer_edges_per_dst"] = per_layer(
        lambda s, layer: s["layers"][layer]["edges_per_dst"], ranks, None, None
    )
    trends["layer_edges_per_dst"] = [
        Trend(float(np.mean([v for _, v in t.points])), 0.0, points=t.points)
        for t in trends["layer_edges_per_dst"]
    ]
    trends["hit_rate"] = per_layer(lambda s, layer: s["hit_rate"][layer])
    trends["halo_fraction"] = fit_trend(
        multi, [summary[p]["halo_fraction"] for p in multi], low=0, form="power"
    )
    trends["cut_fraction"] = fit_trend(multi, [summary[p]["cut_fraction"] for p in multi], 0, 1)
    trends["compute_imbalance"] = fit_trend(
        ranks, [summary[p]["compute_imbalance"] for p in ranks], low=1
    )
    trends["train_imbalance"] = fit_trend(
        ranks, [summary[p]["train_imbalance"] for p in ranks], low=1
    )
    return trends


def shapes_at(
    trends: dict[str, Any], p: float, unique_scale: list[float] | None = None
) -> list[LayerShape]:
    """The layer shapes at ``p`` ranks from the trends (``unique`` times the graph-size
    correction ``unique_scale``, capped at 1, when given)."""
    out = []
    for layer in range(len(FANOUT)):
        unique = trends["layer_unique"][layer](p)
        if unique_scale is not None:
            unique = min(1.0, unique * unique_scale[layer])
        out.append(
            LayerShape(
                edges_per_dst=trends["layer_edges_per_dst"][layer](p),
                unique=unique,
                halo_fraction=trends["layer_halo_fraction"][layer](p) if p > 1 else 0.0,
                edge_keep=trends["layer_edge_keep"][layer](p) if p > 1 else 1.0,
            )
        )
    return out


def chain_work(
    blocks: dict[str, list[float]],
    dims: tuple[int, ...],
    p: float,
    trends: dict[str, Any],
    push_rows: float,
) -> IterationWork:
    """The work of the blocks (:func:`chain_blocks`), with the cache traffic: lookups of
    the halo leaves and ``push_rows`` rows pushed (and as many received) at every layer
    with a cache."""
    hec = [0.0] * len(FANOUT)
    if p > 1:
        for layer in range(len(FANOUT)):
            if trends["hit_rate"][layer] is not None:  # a layer with a cache
                hec[layer] = blocks["halo"][layer] + 2 * push_rows
    return sage_iteration_work(
        dims, blocks["dst"], blocks["src"], blocks["edges"], hec, blocks["halo"]
    )


def push_rows_at(p: float) -> float:
    """Rows a rank pushes per layer and iteration: the per-peer cap ``nc`` to each of the
    ``P - 1`` peers (the cap binds in every measured run, ``push_cap_bound``)."""
    return HEC["nc"] * (p - 1)


def holdout_check(summary, ranks, model, dims) -> dict[str, Any]:
    """Fit the trends on P = 2, 4 and predict P = 8: each layer ratio, the block sizes
    through :func:`chain_blocks`, and the mean rank's compute per iteration."""
    fit_on = [p for p in ranks if p <= 4]
    trends = fit_trends(summary, fit_on)
    s8 = summary[8]
    out: dict[str, Any] = {"fitted_on": [p for p in fit_on if p > 1], "predicted": 8}
    q: dict[str, Any] = {}
    q["halo_fraction"] = _pair(trends["halo_fraction"](8), s8["halo_fraction"])
    q["cut_fraction"] = _pair(trends["cut_fraction"](8), s8["cut_fraction"])
    for layer in range(len(FANOUT)):
        t = trends["hit_rate"][layer]
        if t is not None and s8["hit_rate"][layer] is not None:
            q[f"hit_rate_l{layer}"] = _pair(t(8), s8["hit_rate"][layer])
    blocks = chain_blocks(shapes_at(trends, 8), BATCH)
    for kind in ("dst", "src", "edges"):
        for layer in range(len(FANOUT)):
            q[f"{kind}_per_seed_l{layer}"] = _pair(
                blocks[kind][layer] / BATCH, s8["per_seed"][kind][layer]
            )
    work = chain_work(blocks, dims, 8, trends, push_rows_at(8))
    q["compute_cpu_s"] = _pair(model.seconds(work), s8["compute_cpu_s"])
    out["quantities"] = q
    return out


def _pair(predicted: float, measured: float) -> dict[str, float]:
    return {
        "predicted": predicted,
        "measured": measured,
        "error": relative_error(predicted, measured) if measured else None,
    }


def size_scale(sweep: list[dict[str, Any]], real_nodes: int) -> dict[str, Any]:
    """How much less often sampled edges repeat a source on the real graph than on the
    measured one, at P = 1: each layer's ``unique`` ratio (sources per destination + edge)
    over the sweep's graph sizes, fitted linear in ``log2 N`` (in [0, 1]) and read at
    ``real_nodes``; the scale is that over the measured graph's (the sweep's first row)."""
    ns = [row["nodes"] for row in sweep]
    out: dict[str, Any] = {"unique": [], "fits": [], "scale": []}
    for layer in range(len(FANOUT)):
        ratios = [
            layer_shapes({**row, "halo": [0.0] * len(FANOUT), "edges_sampled": row["edges"]})[
                layer
            ]["unique"]
            for row in sweep
        ]
        trend = fit_trend(ns, ratios, 0, 1)
        out["unique"].append(ratios)
        out["fits"].append({**trend.as_dict(), "at_real": trend(real_nodes)})
        out["scale"].append(trend(real_nodes) / ratios[0])
    return out


def project(
    shape: dict[str, Any], analysis: dict[str, Any], rates: CoreRates, sweep: list[dict[str, Any]]
) -> dict[str, Any]:
    """Epoch time of the real graph at PROJECTED_RANKS on every socket of SOCKETS."""
    real: GraphSpec = shape["real"]
    trends = {
        k: [t and Trend.from_dict(t) for t in v] if isinstance(v, list) else Trend.from_dict(v)
        for k, v in analysis["trends"].items()
    }
    scale = size_scale(sweep, real.num_nodes)["scale"] if sweep else None
    model = ComputeModel(rates, analysis["overhead_s"], analysis["grad_passes"])
    out = {}
    for label, (socket, net) in SOCKETS.items():
        rows = []
        for p in PROJECTED_RANKS:
            blocks = chain_blocks(shapes_at(trends, p, scale), BATCH)
            work = chain_work(blocks, real.dims, p, trends, push_rows_at(p))
            mbc_cpu = (
                sum(blocks["edges_sampled"]) * analysis["sample_edge_s"]
                + blocks["src"][0] * real.dims[0] * FLOAT32_BYTES / analysis["gather_bandwidth"]
            )
            push = [
                push_rows_at(p) * row_message_bytes(real.dims[layer])
                if trends["hit_rate"][layer] is not None
                else 0.0
                for layer in range(len(FANOUT))
            ]
            common = {
                "ranks": p,
                "iterations": iterations_per_epoch(
                    real.num_train, p, BATCH, trends["train_imbalance"](p)
                ),
                "compute": model,
                "socket": socket,
                "net": net,
                "mbc_cpu_s": mbc_cpu,
                "allreduce_payload_bytes": FLOAT32_BYTES * sage_params(real.dims),
                "push_bytes_per_layer": push,
                "imbalance": trends["compute_imbalance"](p),
            }
            proj = project_epoch(work=work, **common)
            # Bound: every rank's batch as large as on one rank (no halo leaves truncating
            # the sampled tree), i.e. a partition that cuts next to nothing.
            full = chain_blocks(shapes_at(trends, 1, scale), BATCH)
            untruncated = project_epoch(
                work=chain_work(full, real.dims, p, trends, push_rows_at(p)), **common
            )
            row = proj.as_dict()
            row["epoch_s_untruncated"] = untruncated.epoch_s
            row["compute_s_untruncated"] = untruncated.compute_s
            row["hit_rate"] = [t(p) if t else None for t in trends["hit_rate"]]
            row["halo_fraction"] = trends["halo_fraction"](p)
            row["per_seed"] = {k: [v / BATCH for v in vals] for k, vals in blocks.items()}
            row["gemm_flops"] = work.gemm_flops
            row["memory_bytes"] = model.memory_bytes(work)
            row["push_bytes"] = push
            rows.append(row)
        out[label] = {"socket": vars(socket), "network": vars(net), "rows": rows}
    return out


# -- plot --------------------------------------------------------------------------------------
def plot(result: dict[str, Any], path: Path) -> None:
    shapes = [s for s in result["shapes"] if "analysis" in result["shapes"][s]]
    fig, axes = panels(6, panel_size=(4.8, 3.8))
    ax_halo, ax_hit, ax_push, ax_check, ax_work, ax_proj = axes
    markers = {"products": "o", "papers": "s"}
    grid = np.array([1, 2, 4, 8, 16, 32, 64], dtype=float)
    for name in shapes:
        an = result["shapes"][name]["analysis"]
        summ = {int(p): s for p, s in an["summary"].items()}
        multi = [p for p in sorted(summ) if p > 1]
        m = markers.get(name, "o")
        t = an["trends"]["halo_fraction"]
        ax_halo.plot(multi, [summ[p]["halo_fraction"] for p in multi], m, label=f"{name}")
        xs = grid[grid >= 2]
        fit = np.minimum(Trend.from_dict(t)(xs), xs - 1)  # a part's halo <= (P - 1) x solid
        ax_halo.plot(xs, fit, "--", color=ax_halo.lines[-1].get_color(), label=f"{name} fit")
        for layer, tl in enumerate(an["trends"]["hit_rate"]):
            if tl is None:
                continue
            ys = [100 * summ[p]["hit_rate"][layer] for p in multi]
            (line,) = ax_hit.plot(multi, ys, m, label=f"{name} L{layer}")
            fit = Trend.from_dict(tl)(xs) * 100
            ax_hit.plot(xs, fit, "--", color=line.get_color())
        push = [sum(summ[p]["push_bytes_per_iteration"]) / 2**20 for p in multi]
        ax_push.plot(multi, push, m + "-", label=f"{name} pushed")
        recv = [sum(summ[p]["received_bytes_per_iteration"]) / 2**20 for p in multi]
        ax_push.plot(
            multi, recv, m + ":", color=ax_push.lines[-1].get_color(), label=f"{name} received"
        )
        checks = an["checks"]
        (line,) = ax_check.plot(
            [c["ranks"] for c in checks],
            [c["compute_cpu_s"] for c in checks],
            m,
            label=f"{name} measured",
        )
        ax_check.plot(
            [c["ranks"] for c in checks],
            [c["compute_pred_s"] for c in checks],
            "x",
            color=line.get_color(),
            label=f"{name} model",
        )
        ranks = sorted(summ)
        for layer in range(len(FANOUT)):
            ax_work.plot(
                ranks,
                [summ[p]["per_seed"]["edges"][layer] for p in ranks],
                m + "-",
                label=f"{name} L{layer}",
            )
    for ax in (ax_halo, ax_hit, ax_push, ax_check, ax_work):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks P")
        ax.grid(alpha=0.3)
    ax_halo.plot(grid[grid >= 2], grid[grid >= 2] - 1, "k:", label="bound P - 1")
    ax_halo.set_ylabel("halo / solid vertices per part")
    ax_halo.set_title("halo fraction (synthetic shapes)")
    ax_halo.legend(fontsize=7)
    for layer, rate in enumerate(PAPER["hit_rate_64"]):
        ax_hit.plot(
            [64], [100 * rate], "k*", label="paper, P=64 (L0/L1/L2)" if layer == 0 else None
        )
    ax_hit.set_ylabel("HEC hit rate (%)")
    ax_hit.set_title("hit rate per layer, fits dashed")
    ax_hit.legend(fontsize=6)
    ax_push.set_ylabel("MiB per rank per iteration")
    ax_push.set_title("HEC push traffic")
    ax_push.legend(fontsize=7)
    ax_check.set_ylabel("CPU s per iteration (one core)")
    ax_check.set_title("per-rank compute: measured vs model")
    ax_check.legend(fontsize=7)
    ax_work.set_ylabel("aggregated edges per seed")
    ax_work.set_title("per-seed work (P=1 calibrates)")
    set_scale(ax_work, [v for ln in ax_work.lines for v in ln.get_ydata()])
    ax_work.legend(fontsize=6, ncol=2)
    main = next(iter(SOCKETS))
    for name in shapes:
        pr = (result["shapes"][name].get("projection") or {}).get(main)
        if pr is None:
            continue
        rows, real = pr["rows"], result["shapes"][name]["real"]
        ranks = [r["ranks"] for r in rows]
        (line,) = ax_proj.plot(ranks, [r["epoch_s"] for r in rows], "o-", ms=3, label=real)
        ax_proj.plot(ranks, [r["epoch_s_untruncated"] for r in rows], "--",
                     color=line.get_color(), label=f"{real}, untruncated batches")  # fmt: skip
    if any(result["shapes"][n].get("projection") for n in shapes):
        ax_proj.plot(
            [64], [PAPER["papers100M_epoch_s_64"]], "k*", ms=10, label="paper: papers100M, 64 ranks"
        )
    ax_proj.set_xscale("log", base=2)
    set_scale(ax_proj, [v for ln in ax_proj.lines for v in ln.get_ydata()])
    ax_proj.set_xlabel("ranks (sockets)")
    ax_proj.set_ylabel("projected seconds per epoch")
    ax_proj.set_title(f"projection: {main}", fontsize=9)
    ax_proj.grid(alpha=0.3)
    ax_proj.legend(fontsize=6)
    save_figure(fig, path, dpi=100)


# -- tables ---------------------------------------------------------------------------------------
def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def markdown(result: dict[str, Any]) -> str:
    """The tables of docs/scaling.md, from a result."""
    lines = []
    for name, entry in result["shapes"].items():
        an = entry.get("analysis")
        if an is None:
            continue
        meas = entry["measured"]
        lines += [
            f"### {name}-shaped: {meas['num_nodes']:,} vertices, {meas['num_edges']:,} in-edges,"
            f" {meas['num_train']:,} training vertices",
            "",
            _row(["P", "cut", "halo/solid", "edges/seed L0/L1/L2", "hit L1/L2",
                  "push MiB/it (rank)", "recv MiB/it", "ARed KiB/it", "compute CPU s/it",
                  "MBC CPU s/it", "imbalance", "wall s/it"]),
            _row(["---"] * 12),
        ]  # fmt: skip
        for p, s in an["summary"].items():
            lines.append(
                _row(
                    [
                        p,
                        _pct(s["cut_fraction"]),
                        f"{s['halo_fraction']:.2f}",
                        "/".join(f"{v:.1f}" for v in s["per_seed"]["edges"]),
                        "/".join(_pct(h) for h in s["hit_rate"][1:]),
                        f"{sum(s['push_bytes_per_iteration']) / 2**20:.2f}",
                        f"{sum(s['received_bytes_per_iteration']) / 2**20:.2f}",
                        f"{s['allreduce_payload_bytes_per_iteration'] / 2**10:.0f}",
                        f"{s['compute_cpu_s']:.3f}",
                        f"{s['mbc_cpu_s']:.3f}",
                        f"{s['compute_imbalance']:.3f}",
                        f"{s['wall_iteration_s']:.2f}",
                    ]
                )
            )
        lines += [
            "",
            _row(["P", "unique L0/L1/L2", "halo leaves L0/L1/L2", "edges kept L1/L2",
                  "push rows/layer/it (cap bound)"]),
            _row(["---"] * 5),
        ]  # fmt: skip
        for p, s in an["summary"].items():
            ls = s["layers"]
            lines.append(
                _row(
                    [
                        p,
                        "/".join(f"{x['unique']:.2f}" for x in ls),
                        "/".join(f"{x['halo_fraction']:.2f}" for x in ls),
                        "/".join(f"{x['edge_keep']:.2f}" for x in ls[1:]),
                        f"{s['push_rows_per_pushing_iteration'][-1]:.0f} "
                        f"({s['push_cap_bound'][-1]})",
                    ]
                )
            )
        lines += [
            "",
            _row(["P", "compute median (max abs)", "sample median (max abs)",
                  "gather median (max abs)"]),
            _row(["---"] * 4),
        ]  # fmt: skip
        for p, c in an["check_summary"].items():
            if p == "calibrated_on":
                continue
            lines.append(
                _row(
                    [p]
                    + [
                        f"{_pct(c[f'{k}_error_median'])} ({_pct(c[f'{k}_error_max_abs'])})"
                        for k in ("compute", "sample", "gather")
                    ]
                )
            )
        if an["holdout"]:
            lines += [
                "",
                _row(["hold-out (fit P<=4, predict 8)", "predicted", "measured", "error"]),
                _row(["---"] * 4),
            ]
            for q, v in an["holdout"]["quantities"].items():
                lines.append(
                    _row([q, f"{v['predicted']:.4g}", f"{v['measured']:.4g}", _pct(v["error"])])
                )
        lines.append("")
        for label, pr in entry["projection"].items():
            lines += [
                f"#### {entry['real']} on {label}",
                "",
                _row(["P", "iterations", "compute s/it", "MBC s/it", "ARed ms/it",
                      "push ms/it (exposed)", "hit L1/L2", "epoch s",
                      "epoch s, untruncated"]),
                _row(["---"] * 9),
            ]  # fmt: skip
            for r in pr["rows"]:
                lines.append(
                    _row(
                        [
                            r["ranks"],
                            r["iterations"],
                            f"{r['compute_s']:.4f}",
                            f"{r['mbc_s']:.4f}",
                            f"{1e3 * r['allreduce_s']:.2f}",
                            f"{1e3 * r['push_s']:.2f} ({1e3 * r['push_exposed_s']:.2f})",
                            "/".join(_pct(h) for h in r["hit_rate"][1:]),
                            f"{r['epoch_s']:.2f}",
                            f"{r['epoch_s_untruncated']:.2f}",
                        ]
                    )
                )
            lines.append("")
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------------
def shape_of(name: str, quick: bool) -> dict[str, Any]:
    """``SHAPES[name]``, with a tiny graph in quick mode."""
    shape = dict(SHAPES[name])
    if quick:
        shape["synthetic"] = SyntheticConfig(
            **{**_fields(shape["synthetic"]), "nodes": QUICK_NODES, "train_fraction": 0.3}
        )
        shape["size_sweep"] = QUICK_SWEEP
    return shape


def core_rates_of(cal: dict[str, Any]) -> CoreRates:
    """The :class:`CoreRates` of a ``core`` entry (runs before per-width rates: one rate)."""
    gemm = tuple((g["c"], g["k"], g["flop_rate"]) for g in cal.get("gemm", []))
    return CoreRates(cal["flop_rate"], cal["agg_bandwidth"], cal["copy_bandwidth"], 0.0, gemm)


def analyse(result: dict[str, Any], name: str, shape: dict[str, Any]) -> None:
    """Model, fits, checks and projection of shape ``name`` from its measurements in
    ``result`` (filled in place)."""
    cal = result["core"]
    entry = result["shapes"][name]
    sweep = entry["size_sweep"]
    rates = core_rates_of(cal)
    analysis = analyse_shape(shape, entry["measured"], rates, cal["serial_overhead_s"])
    entry["size_scale"] = size_scale(sweep, shape["real"].num_nodes) if sweep else None
    entry["analysis"] = analysis
    entry["projection"] = project(shape, analysis, rates, sweep)
    summary = {"shape": name, "checks": analysis["check_summary"], "holdout": analysis["holdout"]}
    print(json.dumps(summary, default=float), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny graphs, P = 1, 2, 2 epochs")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--no-sweep", action="store_true", help="skip the block-size sweep")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--workdir", type=Path, default=None, help="keep partitions and logs here")
    p.add_argument(
        "--recalibrate",
        action="store_true",
        help="with --reanalyse: measure the core rates again (the runs are kept)",
    )
    p.add_argument(
        "--reanalyse",
        action="store_true",
        help="measure nothing: redo the analysis, projection and figure of --out's runs",
    )
    args = p.parse_args()
    out = args.out or RESULTS / ("scaling-quick.json" if args.quick else "scaling.json")
    if args.reanalyse:
        result = json.loads(out.read_text())
        if args.recalibrate:
            result["core"] = core_rates(result["quick"])
            result["core"]["measured_separately"] = True
        for name in result["shapes"]:
            analyse(result, name, shape_of(name, result["quick"]))
        write_json(out, result)
        plot(result, out.with_suffix(".png"))
        print(markdown(result))
        print(f"re-analysed {out}, wrote {out.with_suffix('.png')}")
        return
    ranks = QUICK_RANKS if args.quick else MEASURED_RANKS
    epochs = 2 if args.quick else EPOCHS
    start = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "scaling",
        "command": command_line(),
        "quick": args.quick,
        "machine": machine_facts(),
        "settings": {
            "fanout": FANOUT,
            "hidden": HIDDEN,
            "batch_per_rank": BATCH,
            "hec": HEC,
            "epochs": epochs,
            "threads_per_rank": 1,
            "ranks": ranks,
        },
        "paper": PAPER,
        "sockets": {k: {"socket": vars(s), "network": vars(n)} for k, (s, n) in SOCKETS.items()},
        "shapes": {},
    }
    cal = core_rates(args.quick)
    result["core"] = cal
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="distmb-scaling-"))
    workdir.mkdir(parents=True, exist_ok=True)
    for name in args.shapes:
        shape = shape_of(name, args.quick)
        meas = measure_shape(name, shape["synthetic"], ranks, epochs, workdir)
        sweep = []
        if not args.no_sweep:
            sweep = block_sizes_vs_graph_size(
                shape["synthetic"], (shape["synthetic"].nodes, *shape["size_sweep"])
            )
        result["shapes"][name] = {
            "real": shape["real"].name,
            "real_graph": vars(shape["real"]),
            "measured": meas,
            "size_sweep": sweep,
        }
        write_json(out, result)  # the measurements survive a failure of the analysis
        analyse(result, name, shape)
        write_json(out, result)
    result["total_s"] = round(time.perf_counter() - start, 1)
    result["machine"]["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
    write_json(out, result)
    plot(result, out.with_suffix(".png"))
    print(markdown(result))
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"wrote {out} and {out.with_suffix('.png')} in {result['total_s']:.0f}s")


if __name__ == "__main__":
    main()
