"""GPU feature movement: zero-copy gather bandwidth, device-cache hit rates, Match-Reorder.

Two parts, on a products-shaped synthetic graph (default 2.4M vertices, ~62M in-edges, 100
float32 features, 8 % of the vertices training, as ogbn-products; GraphSAGE's sampling,
fan-out 5,10,15 and batch 1000):

1. **Hit rate and host->device bytes per epoch** (any machine: which rows hit and which
   cross PCIe do not depend on the device). For the device cache at 5, 10 and 20 % of the
   feature table and each policy (``presc``: pre-sampling counts on its own stream,
   ``degree``, ``none``; plus ``oracle``: the static set that knows this epoch's counts,
   GNNLab's optimal static cache, for reference), one training epoch's gathers run through
   :class:`distmb.pipeline.features.device.DeviceFeatures` on CPU tensors with a 1-column stand-in
   table (the counters count rows; bytes are rows times ``feat_dim * 4``). Host->device
   bytes are reported three ways: plain (batch order, no reuse), Match (batch order, reuse
   of the previous batch's rows) and Match-Reorder (greedy order within each superbatch of
   ``--superbatch``, reuse).
2. **Zero-copy gather bandwidth** (CUDA only; skipped with a message elsewhere): a batch's
   worth of rows gathered by the GPU from the pinned, registered host table
   (:class:`distmb.pipeline.features.zero_copy.HostRows`, sorted ids, rows padded to 128 bytes and
   packed), against the pinned host->device copy bandwidth of the same machine (the PCIe
   limit) and the CPU gather + copy it replaces. Medians of ``--repeats``, CUDA events.

    python benchmarks/gpu_features.py                          # full size (minutes)
    python benchmarks/gpu_features.py --nodes 300000 --out results/gpu_features_small.json

JSON to ``--out`` (default results/gpu_features.json).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from record import command_line

from distmb import _C
from distmb.cli.report import write_json
from distmb.config.train import DEFAULT_FANOUT, DEFAULT_SUPERBATCH
from distmb.core.machine import cpu_model
from distmb.core.units import FLOAT32_BYTES
from distmb.data.datasets.synthetic import SyntheticConfig, generate
from distmb.pipeline.features.cached import cache_rows
from distmb.pipeline.features.device import DeviceFeatures
from distmb.pipeline.features.presample import hot_rows, static_hot_ids
from distmb.pipeline.features.reorder import match_order
from distmb.pipeline.features.zero_copy import HostRows
from distmb.pipeline.sample.host import NeighborSampler

#: Cache sizes, percent of the feature table's rows.
CACHE_PERCENT = (5, 10, 20)
POLICIES = ("presc", "degree", "none", "oracle")
#: The issue's goal: zero-copy gather at this fraction of the pinned copy bandwidth.
GATHER_GOAL = 0.70


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nodes", type=float, default=2.4e6)
    p.add_argument(
        "--avg-degree", type=float, default=26.0, help="undirected; in-edges ~ nodes x this"
    )
    p.add_argument("--feat-dim", type=int, default=100)
    p.add_argument("--train-fraction", type=float, default=0.08)
    p.add_argument("--fanout", type=str, default=",".join(map(str, DEFAULT_FANOUT)))
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--superbatch", type=int, default=DEFAULT_SUPERBATCH)
    p.add_argument("--presample-epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", type=Path, default=Path("results/gpu_features.json"))
    return p.parse_args(argv)


def epoch_inputs(
    sampler: NeighborSampler, train_idx: np.ndarray, batch: int, seed: int
) -> list[np.ndarray]:
    """Block 0's sources (the gathered rows) of every batch of training epoch 0."""
    order = train_idx[np.random.default_rng([seed, 0]).permutation(train_idx.size)]
    batches = np.array_split(order, -(-order.size // batch))
    return [
        sampler.sample(b, 0, i)[0].src_ids.numpy().astype(np.int64) for i, b in enumerate(batches)
    ]


def reordered(inputs: list[np.ndarray], k: int, num_rows: int, resident: torch.Tensor) -> list[int]:
    """Match-Reorder's epoch order: the greedy order within each superbatch of ``k``."""
    order: list[int] = []
    for start in range(0, len(inputs), k):
        idx = list(range(start, min(start + k, len(inputs))))
        order += [idx[p] for p in match_order([inputs[i] for i in idx], num_rows, resident)]
    return order


def run_epoch(source: DeviceFeatures, inputs: list[np.ndarray], order: list[int]) -> dict[str, int]:
    source.reset_counters()
    source.forget_previous()
    for i in order:
        source.gather_device(inputs[i])
    return source.counters()


def cache_part(args: argparse.Namespace, graph) -> dict:
    n = graph.num_nodes
    indptr, indices = graph.indptr, graph.indices
    fanout = [int(f) for f in args.fanout.split(",")]
    degree = np.diff(indptr)

    def make_sampler(seed: int) -> NeighborSampler:
        return NeighborSampler(indptr, indices, n, n, fanout, seed)

    t0 = time.perf_counter()
    inputs = epoch_inputs(make_sampler(args.seed), graph.train_idx, args.batch_size, args.seed)
    sample_s = time.perf_counter() - t0
    counts = np.bincount(np.concatenate(inputs), minlength=n)
    t0 = time.perf_counter()
    ranking = {
        p: static_hot_ids(
            p,
            degree,
            make_sampler,
            graph.train_idx,
            args.batch_size,
            args.presample_epochs,
            args.seed,
        )
        for p in ("presc", "degree")
    }
    presample_s = time.perf_counter() - t0
    ranking["oracle"] = hot_rows(counts, tie_break=degree)
    ranking["none"] = np.zeros(0, dtype=np.int64)
    stand_in = np.zeros((n, 1), dtype=np.float32)  # rows are counted; bytes scale by feat_dim
    row_bytes = args.feat_dim * FLOAT32_BYTES
    plain_order = list(range(len(inputs)))
    runs = []
    for percent in CACHE_PERCENT:
        cache_mb = n * percent / 100 * row_bytes / 2**20
        capacity = cache_rows(cache_mb, args.feat_dim, n)
        for policy in POLICIES:
            cap = 0 if policy == "none" else capacity
            name = policy if policy != "oracle" else "presc"  # a static ranking like presc
            plain = DeviceFeatures(
                stand_in, "cpu", cap, hot_ids=ranking[policy], policy=name, align_rows=False
            )
            match = DeviceFeatures(
                stand_in,
                "cpu",
                cap,
                hot_ids=ranking[policy],
                policy=name,
                reuse_previous=True,
                align_rows=False,
            )
            t0 = time.perf_counter()
            order = reordered(inputs, args.superbatch, n, match.resident())
            reorder_s = time.perf_counter() - t0
            c_plain = run_epoch(plain, inputs, plain_order)
            c_match = run_epoch(match, inputs, plain_order)
            c_mr = run_epoch(match, inputs, order)
            runs.append(
                {
                    "policy": policy,
                    "cache_percent": percent,
                    "cache_rows": cap,
                    "hit_rate": round(c_plain["hits"] / max(c_plain["lookups"], 1), 4),
                    "lookups": c_plain["lookups"],
                    "h2d_bytes_plain": c_plain["rows_loaded"] * row_bytes,
                    "h2d_bytes_match": c_match["rows_loaded"] * row_bytes,
                    "h2d_bytes_match_reorder": c_mr["rows_loaded"] * row_bytes,
                    "reorder_s_per_epoch_cpu": round(reorder_s, 2),
                }
            )
            r = runs[-1]
            print(
                f"{percent:>3} % {policy:>6}: hit {r['hit_rate']:.3f}  h2d GB/epoch plain "
                f"{r['h2d_bytes_plain'] / 1e9:.2f}, match {r['h2d_bytes_match'] / 1e9:.2f}, "
                f"match-reorder {r['h2d_bytes_match_reorder'] / 1e9:.2f}",
                flush=True,
            )
    for r in runs:
        if r["policy"] == "presc":
            oracle = next(
                o
                for o in runs
                if o["policy"] == "oracle" and o["cache_percent"] == r["cache_percent"]
            )
            r["presc_over_oracle"] = round(r["hit_rate"] / max(oracle["hit_rate"], 1e-9), 4)
    return {
        "batches_per_epoch": len(inputs),
        "mean_inputs_per_batch": round(float(np.mean([x.size for x in inputs])), 1),
        "epoch_sampling_s_cpu": round(sample_s, 2),
        "presample_s_cpu": round(presample_s, 2),
        "runs": runs,
    }


def _cuda_time(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` on the current stream (CUDA events), after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def bandwidth_part(args: argparse.Namespace, graph, inputs_rows: int) -> dict:
    if not torch.cuda.is_available():
        message = f"no CUDA device (torch {torch.__version__}): zero-copy bandwidth skipped"
        print(message)
        return {"skipped": message}
    table = graph.features
    n, dim = table.shape
    rng = np.random.default_rng(args.seed)
    ids = torch.from_numpy(np.sort(rng.choice(n, min(inputs_rows, n), replace=False))).cuda()
    nbytes = ids.numel() * dim * FLOAT32_BYTES
    result: dict = {"rows_per_gather": int(ids.numel()), "bytes_per_gather": nbytes}
    pinned = torch.empty(nbytes // FLOAT32_BYTES, dtype=torch.float32).pin_memory()
    device_buf = torch.empty_like(pinned, device="cuda")
    t = _cuda_time(lambda: device_buf.copy_(pinned, non_blocking=True), args.repeats)
    result["pinned_copy_GBps"] = round(nbytes / t / 1e9, 2)
    for align in (True, False):
        rows = HostRows(table, "cuda", align_rows=align)
        t = _cuda_time(lambda rows=rows: rows.gather(ids), args.repeats)
        result[f"zero_copy_{'aligned' if align else 'packed'}_GBps"] = round(nbytes / t / 1e9, 2)
        rows.close()
    host = torch.from_numpy(np.ascontiguousarray(table))
    ids_cpu = ids.cpu()
    staging = torch.empty((ids.numel(), dim), dtype=torch.float32).pin_memory()

    def cpu_gather_copy() -> None:
        torch.index_select(host, 0, ids_cpu, out=staging)
        staging.to("cuda", non_blocking=True)

    times = []
    for _ in range(args.repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        cpu_gather_copy()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    result["cpu_gather_then_copy_GBps"] = round(nbytes / statistics.median(times) / 1e9, 2)
    best = max(result["zero_copy_aligned_GBps"], result["zero_copy_packed_GBps"])
    result["zero_copy_over_pinned_copy"] = round(best / result["pinned_copy_GBps"], 3)
    result["goal"] = (
        f"zero-copy gather >= {GATHER_GOAL:.0%} of the pinned copy bandwidth: "
        f"{result['zero_copy_over_pinned_copy']:.0%} "
        f"({'met' if result['zero_copy_over_pinned_copy'] >= GATHER_GOAL else 'not met'})"
    )
    print(result)
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = SyntheticConfig.from_spec(
        f"shape=products,nodes={int(args.nodes)},avg_degree={args.avg_degree},"
        f"feat_dim={args.feat_dim},train_fraction={args.train_fraction},test_fraction=0.5,"
        f"seed={args.seed}"
    )
    t0 = time.perf_counter()
    graph = generate(config)
    seconds = time.perf_counter() - t0
    print(f"{graph.num_nodes} vertices, {graph.indices.size} in-edges ({seconds:.0f} s)")
    cache = cache_part(args, graph)
    bandwidth = bandwidth_part(args, graph, int(cache["mean_inputs_per_batch"]))
    machine = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": int(_C.get_num_threads()),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        machine["gpu"] = torch.cuda.get_device_name()
        machine["cuda"] = torch.version.cuda
    result = {
        "title": (
            f"GPU feature movement: {graph.num_nodes} vertices, {graph.indices.size} in-edges, "
            f"{args.feat_dim} float32 features, fan-out {args.fanout}, batch {args.batch_size}, "
            f"superbatch {args.superbatch}"
        ),
        "command": command_line(argv),
        "machine": machine,
        "dataset": f"synthetic:{config.to_spec()}",
        "cache": cache,
        "bandwidth": bandwidth,
    }
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
