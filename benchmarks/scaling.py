"""Scaling model of multi-rank training: measured at P = 1, 2, 4, 8 here, fitted, and
projected to ogbn-products and ogbn-papers100M at 16, 32 and 64 ranks (docs/scaling.md).

1. **Core rates** (one thread): the fused UPDATE kernel's FLOP rate, the fused aggregation's
   bandwidth, a streaming copy's bandwidth.
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
4. **Model and fits** (:mod:`distmb.perfmodel`): per-iteration compute from counted FLOPs and
   bytes at the core rates plus an overhead calibrated on P = 1, checked against every
   rank of P = 2, 4, 8; trends in ``log2 P`` of halo fraction, hit rates, push bytes,
   per-seed work and imbalance, checked by fitting P <= 4 and predicting P = 8.
5. **Projection** of epoch time for the real graphs at P = 2 ... 64 on stated sockets and
   networks.

Writes ``results/scaling.json`` and ``results/scaling.png``.

    python benchmarks/scaling.py            # ~15-20 min on 2 cores
    python benchmarks/scaling.py --quick    # tiny graphs, 1 epoch, P = 1, 2: a smoke run
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

from distmb import _C
from distmb.data.synthetic import SyntheticConfig, generate
from distmb.nn import fused_aggregate, fused_update
from distmb.partition import partition_graph
from distmb.perfmodel import (
    ComputeModel,
    CoreRates,
    GraphSpec,
    IterationWork,
    Network,
    Socket,
    Trend,
    calibrate,
    fit_trend,
    iterations_per_epoch,
    project_epoch,
    relative_error,
    sage_iteration_work,
)
from distmb.plotting import panels, set_scale
from distmb.report import save_figure, write_json
from distmb.sampling import Block
from distmb.sampling.neighbor import NeighborSampler
from distmb.units import FLOAT32_BYTES, row_message_bytes

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
#: 8360Y (36 cores, 2.4 GHz, 8 channels DDR4-3200 = 204.8 GB/s peak), two sockets per node,
#: one rank per socket, Mellanox HDR (200 Gb/s). The brief's alternative: a 56-core Xeon
#: (Sapphire Rapids 8480+, 8 channels DDR5-4800 = 307 GB/s peak) on 100 Gb/s InfiniBand.
#: STREAM-like bandwidth taken as 80 % of peak; parallel efficiency 0.7 of cores x one
#: core (an assumption: the kernels' 1-to-2-thread efficiency here says nothing about 36).
STREAM_OF_PEAK = 0.8
PARALLEL_EFFICIENCY = 0.7
SOCKETS = {
    "paper: 8360Y (36 cores) + HDR 200 Gb/s": (
        Socket("Xeon 8360Y, 36 cores", 36, PARALLEL_EFFICIENCY, STREAM_OF_PEAK * 204.8e9),
        Network("HDR InfiniBand 200 Gb/s, 2 ranks per node", 2.0e-6, 200e9 / 8, 2),
    ),
    "SPR 8480+ (56 cores) + IB 100 Gb/s": (
        Socket("Xeon 8480+, 56 cores", 56, PARALLEL_EFFICIENCY, STREAM_OF_PEAK * 307.2e9),
        Network("InfiniBand 100 Gb/s, 2 ranks per node", 2.0e-6, 100e9 / 8, 2),
    ),
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
            line for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        )  # fmt: skip
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


def core_rates(quick: bool) -> dict[str, Any]:
    """One-thread FLOP rate of the fused UPDATE (``256 -> 256``, two products, fwd + bwd),
    bandwidth of the fused mean aggregation (fwd + bwd, by the model's byte count) and of a
    streaming copy. CPU seconds of this thread (medians), so other jobs on the machine do
    not inflate them."""
    torch.set_num_threads(1)
    _C.set_num_threads(1)
    rows = CAL_ROWS // (10 if quick else 1)
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {"threads": 1, "rows": rows}
    # UPDATE: Dropout(ReLU(h_n W_n^T + h_s W_s^T + b)), forward and backward.
    c = k = CAL_WIDTH
    xs = [torch.randn(rows, c, generator=gen).requires_grad_(True) for _ in range(2)]
    ws = [(torch.randn(k, c, generator=gen) * c**-0.5).requires_grad_(True) for _ in range(2)]
    bias = torch.zeros(k, requires_grad=True)
    grad = torch.randn(rows, k, generator=gen)

    def update() -> None:
        y = fused_update.sage_update(list(zip(xs, ws, strict=True)), bias, p=0.5)
        y.backward(grad)

    s = _median_seconds(update, CAL_REPS)
    flops = 3 * 2 * 2 * rows * c * k  # 2 products; forward, input and weight gradients
    out["update_s"] = s
    out["flop_rate"] = flops / s
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
    # Streaming copy (read + write bytes).
    n = (CAL_COPY_BYTES // (8 if quick else 1)) // FLOAT32_BYTES
    src, dst = np.ones(n, np.float32), np.zeros(n, np.float32)
    s = _median_seconds(lambda: _C.stream_copy(src, dst), CAL_REPS)
    out["copy_bandwidth"] = 2 * n * FLOAT32_BYTES / s
    print(
        f"core: UPDATE {out['flop_rate'] / 1e9:.1f} GFLOP/s, AGG {out['agg_bandwidth'] / 1e9:.2f}"
        f" GB/s, copy {out['copy_bandwidth'] / 1e9:.2f} GB/s (1 thread)",
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
            graph, p, part_dir, seed=0, replicate_halo_features=p > 1,
            memory_budget_gib=METIS_BUDGET_GIB, overwrite=True,
        )  # fmt: skip
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
            },  # fmt: skip
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
        dims, row["block_dst"], row["block_src"], row["block_edges"], hec_rows
    )


def gather_bytes(row: dict[str, Any], feat_dim: int) -> float:
    """Feature bytes block 0 gathers per iteration (every source: halo rows replicated)."""
    return row["block_src"][0] * feat_dim * FLOAT32_BYTES


def analyse_shape(shape: dict[str, Any], meas: dict[str, Any], rates: CoreRates) -> dict[str, Any]:
    """Compute-model check, trends, hold-out check, for one graph shape."""
    syn: SyntheticConfig = shape["synthetic"]
    dims = (syn.feat_dim, HIDDEN, HIDDEN, syn.classes)
    per_p = {int(p): rank_rows(run) for p, run in meas["runs"].items()}
    ranks = sorted(per_p)
    one = per_p[1][0]
    # Compute model: overhead calibrated on P = 1.
    model = calibrate(rates, iteration_work(one, dims), one["compute_cpu_s"])
    sample_edge_s = one["sample_cpu_s"] / sum(one["block_edges_sampled"])
    gather_bw = gather_bytes(one, syn.feat_dim) / one["gather_cpu_s"]
    checks = []
    for p in ranks:
        for row in per_p[p]:
            pred = model.seconds(iteration_work(row, dims))
            mbc_pred = (
                sum(row["block_edges_sampled"]) * sample_edge_s
                + gather_bytes(row, syn.feat_dim) / gather_bw
            )
            mbc = row["sample_cpu_s"] + row["gather_cpu_s"]
            checks.append({
                "ranks": p, "rank": row["rank"],
                "compute_cpu_s": row["compute_cpu_s"], "compute_pred_s": pred,
                "compute_error": relative_error(pred, row["compute_cpu_s"]),
                "mbc_cpu_s": mbc, "mbc_pred_s": mbc_pred,
                "mbc_error": relative_error(mbc_pred, mbc),
            })  # fmt: skip
    # Per-P summaries (means over ranks; imbalance = max / mean of compute).
    summary = {}
    for p in ranks:
        rows = per_p[p]
        mean = lambda key, rows=rows: float(np.mean([r[key] for r in rows]))  # noqa: E731
        layer_mean = lambda key, rows=rows: np.mean([r[key] for r in rows], axis=0)  # noqa: E731
        seeds = mean("seeds")
        lookups, hits = layer_mean("hec_lookups"), layer_mean("hec_hits")
        summary[p] = {
            "halo_fraction": mean("n_halo") / mean("n_solid"),
            "cut_fraction": meas["runs"][str(p)]["edge_cut"] / meas["num_edges"],
            "hit_rate": [
                float(h / lk) if lk else None for h, lk in zip(hits, lookups, strict=True)
            ],
            "halo_leaf_fraction": (layer_mean("block_halo") / layer_mean("block_src")).tolist(),
            "per_seed": {
                k: (layer_mean(f"block_{k}") / seeds).tolist()
                for k in ("dst", "src", "halo", "edges_sampled", "edges")
            },
            "push_bytes_per_iteration": layer_mean("bytes_pushed").tolist(),
            "push_rows_per_seed": (layer_mean("rows_pushed") / seeds).tolist(),
            "received_bytes_per_iteration": layer_mean("bytes_received").tolist(),
            "allreduce_payload_bytes_per_iteration": mean("allreduce_payload_bytes"),
            "compute_cpu_s": mean("compute_cpu_s"),
            "compute_imbalance": max(r["compute_cpu_s"] for r in rows) / mean("compute_cpu_s"),
            "train_imbalance": max(r["n_train"] for r in rows) / mean("n_train"),
            "mbc_cpu_s": mean("sample_cpu_s") + mean("gather_cpu_s"),
            "comm_mpi_cpu_s": mean("comm_mpi_cpu_s"),
            "wall_iteration_s": mean("wall_iteration_s"),
            "iterations_per_epoch": per_p[p][0]["iterations_per_epoch"],
        }  # fmt: skip
    trends = fit_trends(summary, ranks)
    holdout = holdout_check(summary, ranks, model, dims) if max(ranks) >= 8 else None
    return {
        "dims": dims,
        "params": sage_params(dims),
        "overhead_s": model.overhead_s,
        "priced_s_p1": model.priced_seconds(iteration_work(one, dims)),
        "sample_edge_s": sample_edge_s,
        "gather_bandwidth": gather_bw,
        "per_rank": {str(p): per_p[p] for p in ranks},
        "checks": checks,
        "check_summary": _check_summary(checks),
        "summary": {str(p): s for p, s in summary.items()},
        "trends": {
            k: [t and t.as_dict() for t in v] if isinstance(v, list) else v.as_dict()
            for k, v in trends.items()
        },  # fmt: skip
        "holdout": holdout,
    }


def sage_params(dims: tuple[int, ...]) -> int:
    """GraphSAGE parameters: two weights and a bias per layer."""
    return sum(2 * c * k + k for c, k in zip(dims[:-1], dims[1:], strict=True))


def _check_summary(checks: list[dict]) -> dict[str, Any]:
    out = {}
    for p in sorted({c["ranks"] for c in checks}):
        errs = [c["compute_error"] for c in checks if c["ranks"] == p]
        mbc = [c["mbc_error"] for c in checks if c["ranks"] == p]
        out[str(p)] = {
            "compute_error_median": statistics.median(errs),
            "compute_error_max_abs": max(abs(e) for e in errs),
            "mbc_error_median": statistics.median(mbc),
            "mbc_error_max_abs": max(abs(e) for e in mbc),
        }
    return out


def fit_trends(summary: dict[int, dict], ranks: list[int]) -> dict[str, Any]:
    """Trends in log2 P. Quantities that exist at P = 1 (work per seed, compute) are fitted
    through P = 1, those of the halo (fractions, hits, pushes, imbalance) through P >= 2."""
    multi = [p for p in ranks if p > 1]
    layers = len(FANOUT)

    def per_layer(key, sub=None, ps=multi, low=None, high=None, form="linear"):
        out = []
        for layer in range(layers):
            pts = [
                (p, (summary[p][key] if sub is None else summary[p][key][sub])[layer]) for p in ps
            ]
            pts = [(p, v) for p, v in pts if v is not None and (form == "linear" or v > 0)]
            out.append(fit_trend(*zip(*pts, strict=True), low, high, form) if pts else None)
        return out

    def work(kind: str, ps=ranks):
        return per_layer("per_seed", kind, ps, low=0, form="power")

    return {
        "halo_fraction": fit_trend(
            multi, [summary[p]["halo_fraction"] for p in multi], low=0, form="power"
        ),
        "cut_fraction": fit_trend(multi, [summary[p]["cut_fraction"] for p in multi], 0, 1),
        "hit_rate": per_layer("hit_rate", low=0, high=1),
        "edges_per_seed": work("edges"),
        "dst_per_seed": work("dst"),
        "src_per_seed": work("src"),
        "halo_per_seed": work("halo", multi),
        "edges_sampled_per_seed": work("edges_sampled"),
        "push_rows_per_seed": per_layer("push_rows_per_seed", low=0, form="power"),
        "compute_imbalance": fit_trend(
            ranks, [summary[p]["compute_imbalance"] for p in ranks], low=1
        ),
        "train_imbalance": fit_trend(ranks, [summary[p]["train_imbalance"] for p in ranks], low=1),
    }


def work_from_trends(
    trends: dict[str, Any], p: float, dims: tuple[int, ...], seeds: float, scale=None
) -> IterationWork:
    """The mean rank's work per iteration at ``p`` ranks from the per-seed trends (times
    ``scale[kind][layer]``, the graph-size correction, when given)."""
    layers = len(dims) - 1

    def value(kind: str, layer: int) -> float:
        v = trends[f"{kind}_per_seed"][layer](p)
        return v * (scale[kind][layer] if scale and kind in scale else 1.0)

    dst = [value("dst", layer) * seeds for layer in range(layers)]
    src = [value("src", layer) * seeds for layer in range(layers)]
    edges = [value("edges", layer) * seeds for layer in range(layers)]
    hec = [0.0] * layers
    if p > 1:
        for layer in range(layers):
            if trends["hit_rate"][layer] is None:
                continue  # no cache at this layer (replicated halo features)
            lookups = value("halo", layer) * seeds
            push = trends["push_rows_per_seed"][layer]
            pushed = push(p) * seeds if push is not None else 0.0
            hec[layer] = lookups + 2 * pushed  # pushed here, as many received from peers
    return sage_iteration_work(dims, dst, src, edges, hec)


def holdout_check(summary, ranks, model, dims) -> dict[str, Any]:
    """Fit the trends on P <= 4 and predict P = 8: each trend's value, and the mean rank's
    compute per iteration through them."""
    fit_on = [p for p in ranks if p <= 4]
    trends = fit_trends(summary, fit_on)
    s8 = summary[8]
    out: dict[str, Any] = {"fitted_on": fit_on, "predicted": 8, "quantities": {}}
    q = out["quantities"]
    q["halo_fraction"] = _pair(trends["halo_fraction"](8), s8["halo_fraction"])
    for layer, t in enumerate(trends["hit_rate"]):
        if t is not None and s8["hit_rate"][layer] is not None:
            q[f"hit_rate_l{layer}"] = _pair(t(8), s8["hit_rate"][layer])
    for layer, t in enumerate(trends["edges_per_seed"]):
        q[f"edges_per_seed_l{layer}"] = _pair(t(8), s8["per_seed"]["edges"][layer])
    for layer, t in enumerate(trends["push_rows_per_seed"]):
        if t is not None and s8["push_rows_per_seed"][layer] > 0:
            q[f"push_rows_per_seed_l{layer}"] = _pair(t(8), s8["push_rows_per_seed"][layer])
    seeds = BATCH
    pred = model.seconds(work_from_trends(trends, 8, dims, seeds))
    q["compute_cpu_s"] = _pair(pred, s8["compute_cpu_s"])
    return out


def _pair(predicted: float, measured: float) -> dict[str, float]:
    return {
        "predicted": predicted,
        "measured": measured,
        "error": relative_error(predicted, measured) if measured else None,
    }


def size_scale(sweep: list[dict[str, Any]], real_nodes: int) -> dict[str, Any]:
    """Per-seed block sizes at P = 1 for ``real_nodes`` vertices, relative to the measured
    graph (the sweep's first row): each fitted linear in ``log2 N`` through the sweep and
    capped by what sampling allows (layer ``l``'s edges at most ``fanout[l]`` per
    destination, its sources at most its destinations plus its edges, its destinations at
    most the sources of the layer above, which are the layer's computed inputs)."""
    ns = [row["nodes"] for row in sweep]
    layers = len(FANOUT)
    fits: dict[str, list[dict[str, float]]] = {}
    at_real: dict[str, list[float]] = {}
    for kind in ("dst", "src", "edges"):
        for layer in range(layers):
            ys = [row[kind][layer] for row in sweep]
            trend = fit_trend(ns, ys, low=0, form="power")
            fits.setdefault(kind, []).append(
                {"intercept": trend.intercept, "slope": trend.slope, "fitted": trend(real_nodes)}
            )
            at_real.setdefault(kind, []).append(trend(real_nodes))
    for layer in reversed(range(layers)):  # the seeds' layer first
        if layer < layers - 1:
            at_real["dst"][layer] = min(at_real["dst"][layer], at_real["src"][layer + 1])
        at_real["edges"][layer] = min(
            at_real["edges"][layer], FANOUT[layer] * at_real["dst"][layer]
        )
        at_real["src"][layer] = min(
            at_real["src"][layer], at_real["dst"][layer] + at_real["edges"][layer]
        )
    scale = {
        kind: [at_real[kind][layer] / sweep[0][kind][layer] for layer in range(layers)]
        for kind in at_real
    }
    scale["halo"] = scale["src"]  # halo leaves grow like the sources they are part of
    return {"fits": fits, "per_seed_at_real": at_real, "scale": scale}


def project(shape: dict[str, Any], analysis: dict[str, Any], rates: CoreRates,
            sweep: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """Epoch time of the real graph at PROJECTED_RANKS on every socket of SOCKETS."""
    real: GraphSpec = shape["real"]

    def trend(d):
        return None if d is None else Trend.from_dict(d)

    trends = {
        k: [trend(t) for t in v] if isinstance(v, list) else trend(v)
        for k, v in analysis["trends"].items()
    }
    scale = size_scale(sweep, real.num_nodes)["scale"] if sweep else None
    model = ComputeModel(rates, analysis["overhead_s"])
    one = analysis["summary"]["1"]
    out = {}
    for label, (socket, net) in SOCKETS.items():
        rows = []
        for p in PROJECTED_RANKS:
            work = work_from_trends(trends, p, real.dims, BATCH, scale)
            edges_sampled = sum(
                trends["edges_sampled_per_seed"][layer](p) * BATCH
                * (scale["edges"][layer] if scale else 1.0)
                for layer in range(len(FANOUT))
            )  # fmt: skip
            gather = one["per_seed"]["src"][0] * BATCH * (scale["src"][0] if scale else 1.0)
            mbc_cpu = (
                edges_sampled * analysis["sample_edge_s"]
                + gather * real.dims[0] * FLOAT32_BYTES / analysis["gather_bandwidth"]
            )
            push = [
                (t(p) * BATCH * row_message_bytes(real.dims[layer]) if t else 0.0)
                for layer, t in enumerate(trends["push_rows_per_seed"])
            ]
            proj = project_epoch(
                ranks=p,
                iterations=iterations_per_epoch(
                    real.num_train, p, BATCH, trends["train_imbalance"](p)
                ),
                work=work,
                compute=model,
                socket=socket,
                net=net,
                mbc_cpu_s=mbc_cpu,
                allreduce_payload_bytes=FLOAT32_BYTES * sage_params(real.dims),
                push_bytes_per_layer=push,
                imbalance=trends["compute_imbalance"](p),
            )
            row = proj.as_dict()
            row["hit_rate"] = [t(p) if t else None for t in trends["hit_rate"]]
            row["halo_fraction"] = trends["halo_fraction"](p)
            row["gemm_flops"] = work.gemm_flops
            row["memory_bytes"] = work.memory_bytes
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
        ax_halo.plot(xs, Trend.from_dict(t)(xs), "--",
                     color=ax_halo.lines[-1].get_color(), label=f"{name} fit")  # fmt: skip
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
        ax_push.plot(multi, recv, m + ":", color=ax_push.lines[-1].get_color(),
                     label=f"{name} received")  # fmt: skip
        checks = an["checks"]
        (line,) = ax_check.plot(
            [c["ranks"] for c in checks],
            [c["compute_cpu_s"] for c in checks],
            m,
            label=f"{name} measured",
        )
        ax_check.plot([c["ranks"] for c in checks], [c["compute_pred_s"] for c in checks], "x",
                      color=line.get_color(), label=f"{name} model")  # fmt: skip
        ranks = sorted(summ)
        for layer in range(len(FANOUT)):
            ax_work.plot(ranks, [summ[p]["per_seed"]["edges"][layer] for p in ranks], m + "-",
                         label=f"{name} L{layer}")  # fmt: skip
    for ax in (ax_halo, ax_hit, ax_push, ax_check, ax_work):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks P")
        ax.grid(alpha=0.3)
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
    for name in shapes:
        proj = result["shapes"][name].get("projection") or {}
        for label, pr in proj.items():
            rows = pr["rows"]
            real = result["shapes"][name]["real"]
            ax_proj.plot(
                [r["ranks"] for r in rows],
                [r["epoch_s"] for r in rows],
                "o-",
                ms=3,
                label=f"{real} / {label.split(':')[0]}",
            )
    if any(result["shapes"][n].get("projection") for n in shapes):
        ax_proj.plot([64], [PAPER["papers100M_epoch_s_64"]], "k*", ms=10,
                     label="paper: papers100M, 64 ranks")  # fmt: skip
    ax_proj.set_xscale("log", base=2)
    set_scale(ax_proj, [v for ln in ax_proj.lines for v in ln.get_ydata()])
    ax_proj.set_xlabel("ranks (sockets)")
    ax_proj.set_ylabel("projected seconds per epoch")
    ax_proj.set_title("projection (model)")
    ax_proj.grid(alpha=0.3)
    ax_proj.legend(fontsize=6)
    save_figure(fig, path, dpi=100)


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


def analyse(result: dict[str, Any], name: str, shape: dict[str, Any]) -> None:
    """Model, fits, checks and projection of shape ``name`` from its measurements in
    ``result`` (filled in place)."""
    cal = result["core"]
    entry = result["shapes"][name]
    sweep = entry["size_sweep"]
    rates = CoreRates(cal["flop_rate"], cal["agg_bandwidth"], cal["copy_bandwidth"])
    analysis = analyse_shape(shape, entry["measured"], rates)
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
        "--reanalyse",
        action="store_true",
        help="measure nothing: redo the analysis, projection and figure of --out's runs",
    )
    args = p.parse_args()
    out = args.out or RESULTS / ("scaling-quick.json" if args.quick else "scaling.json")
    if args.reanalyse:
        result = json.loads(out.read_text())
        for name in result["shapes"]:
            analyse(result, name, shape_of(name, result["quick"]))
        write_json(out, result)
        plot(result, out.with_suffix(".png"))
        print(f"re-analysed {out}, wrote {out.with_suffix('.png')}")
        return
    ranks = QUICK_RANKS if args.quick else MEASURED_RANKS
    epochs = 2 if args.quick else EPOCHS
    start = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "scaling",
        "command": " ".join([Path(PYTHON).name, *sys.argv]),
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
        },  # fmt: skip
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
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"wrote {out} and {out.with_suffix('.png')} in {result['total_s']:.0f}s")


if __name__ == "__main__":
    main()
