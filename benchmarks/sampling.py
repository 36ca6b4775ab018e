"""Neighbour-sampling time per mini-batch on a synthetic power-law graph.

Samples ``--batches`` mini-batches of ``--batch-size`` random training seeds with fan-outs
``--fanouts`` (input -> output layer) after ``--warmup`` unmeasured ones, each batch once per
thread count in ``--threads`` (interleaved, so that other processes on a shared machine
disturb every thread count alike), and reports the median, p10 and p90 milliseconds per
batch and the mean per-layer block sizes. The warm-up batches are checked without a
reference sampler: destinations of block ``l-1`` = solid sources of block ``l``, rows at
most their fan-out, the same blocks for every thread count.

Every OpenMP wait policy in ``--wait-policies`` runs in its own child process (libgomp reads
``OMP_WAIT_POLICY`` once, at load): ``default`` leaves it unset (threads spin for a while
before sleeping), ``passive`` makes idle threads sleep at once. On a machine whose cores are
shared with other processes, spinning threads steal the time slices their own team needs and
multi-thread timings degrade badly; ``passive`` avoids that. Writes
``results/sampling.json`` and ``results/sampling.png``.

    python benchmarks/sampling.py                       # 200k vertices, degree 30, 5,10,15
    python benchmarks/sampling.py --nodes 50000 --threads 1 --wait-policies default
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from distmb.cli.report import save_figure, write_json
from distmb.core.plotting import panels, reference_line, set_scale

if TYPE_CHECKING:  # distmb (and its OpenMP runtime) is imported in the child processes only
    from distmb.pipeline.sample import Block, NeighborSampler

RESULTS = Path(__file__).resolve().parents[1] / "results"

#: Target median per 1000-seed batch on 2 threads (DGL 2.1 takes about 36 ms here).
TARGET_MS = 12.0
#: Percentiles reported besides the median.
LOW_PCT, HIGH_PCT = 10, 90
#: ``--wait-policies`` value that leaves OMP_WAIT_POLICY unset (libgomp's spin-then-sleep).
DEFAULT_POLICY = "default"
WAIT_POLICIES = (DEFAULT_POLICY, "passive", "active")


def check_blocks(blocks: list[Block], seeds: np.ndarray, fanouts: list[int]) -> None:
    """Cheap structural invariants of one mini-batch (no reference sampler needed)."""
    import torch

    from distmb.pipeline.sample import FANOUT_ALL

    assert np.array_equal(blocks[-1].dst_ids.numpy(), seeds), "seeds are not the last dst"
    for layer, (block, fanout) in enumerate(zip(blocks, fanouts, strict=True)):
        rows = np.diff(block.indptr.numpy())
        if fanout != FANOUT_ALL:
            assert rows.max(initial=0) <= fanout, f"layer {layer}: a row exceeds its fan-out"
        assert block.num_edges == int(block.indptr[-1])
        if block.num_edges:
            assert 0 <= int(block.indices.min()) and int(block.indices.max()) < block.n_src
        if layer > 0:
            below = blocks[layer - 1]
            assert below.n_dst == block.n_computed, f"layer {layer}: frontier size mismatch"
            assert torch.equal(below.dst_ids, block.src_ids[: block.n_computed])


def cpu_pressure() -> float | None:
    """Linux PSI: % of the last 10 s in which some runnable task waited for a CPU."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    fields = dict(item.split("=") for item in line.split()[1:])
    return float(fields["avg10"])


def same_blocks(a: list[Block], b: list[Block]) -> bool:
    import torch

    return all(
        x.n_halo == y.n_halo
        and torch.equal(x.indptr, y.indptr)
        and torch.equal(x.indices, y.indices)
        and torch.equal(x.src_ids, y.src_ids)
        for x, y in zip(a, b, strict=True)
    )


def stats(times_ms: list[float]) -> dict:
    t = np.asarray(times_ms)
    return {
        "median_ms": round(float(np.median(t)), 3),
        f"p{LOW_PCT}_ms": round(float(np.percentile(t, LOW_PCT)), 3),
        f"p{HIGH_PCT}_ms": round(float(np.percentile(t, HIGH_PCT)), 3),
        "min_ms": round(float(t.min()), 3),
    }


def run(
    sampler: NeighborSampler,
    train_idx: np.ndarray,
    thread_counts: list[int],
    batch_size: int,
    batches: int,
    warmup: int,
    seed: int,
) -> list[dict]:
    """Time every mini-batch once per thread count, interleaved (each batch's seeds on every
    thread count back to back, the order alternating), so that load from other processes
    hits all thread counts alike. Warm-up batches check the blocks and that every thread
    count gives the same blocks."""
    from distmb import _C

    rng = np.random.default_rng(seed)
    times_ms: dict[int, list[float]] = {t: [] for t in thread_counts}
    sizes = np.zeros((sampler.num_layers, 4))  # n_dst, n_src, n_halo, edges per layer
    for it in range(warmup + batches):
        seeds = np.sort(rng.choice(train_idx, size=batch_size, replace=False))
        order = thread_counts if it % 2 == 0 else thread_counts[::-1]
        outputs = []
        for threads in order:
            _C.set_num_threads(threads)
            t0 = time.perf_counter()
            blocks = sampler.sample(seeds, epoch=0, iteration=it)
            elapsed = (time.perf_counter() - t0) * 1e3
            outputs.append(blocks)
            if it >= warmup:
                times_ms[threads].append(elapsed)
        if it < warmup:
            check_blocks(outputs[0], seeds, sampler.fanouts)
            assert all(same_blocks(outputs[0], o) for o in outputs[1:]), "thread-dependent"
        else:
            sizes += [[b.n_dst, b.n_src, b.n_halo, b.num_edges] for b in outputs[0]]
    sizes /= batches
    block_sizes = [
        {"layer": layer, "n_dst": s[0], "n_src": s[1], "n_halo": s[2], "edges": s[3]}
        for layer, s in enumerate(np.round(sizes, 1).tolist())
    ]
    return [
        {"threads": t, **stats(times_ms[t]), "batches": batches, "mean_block_sizes": block_sizes}
        for t in thread_counts
    ]


def plot(result: dict, path: Path) -> None:
    recs = result["records"]
    fig, (ax_t, ax_s) = panels(2, panel_size=(5.5, 4.5))
    x = np.arange(len(recs))
    med = [r["median_ms"] for r in recs]
    err = [
        [r["median_ms"] - r[f"p{LOW_PCT}_ms"] for r in recs],
        [r[f"p{HIGH_PCT}_ms"] - r["median_ms"] for r in recs],
    ]
    colors = {p: f"C{i}" for i, p in enumerate(dict.fromkeys(r["omp_wait_policy"] for r in recs))}
    ax_t.bar(x, med, yerr=err, capsize=4, color=[colors[r["omp_wait_policy"]] for r in recs])
    ax_t.set_xticks(x, [f"{r['omp_wait_policy']}\n{r['threads']} thr." for r in recs])
    reference_line(ax_t, TARGET_MS, f"target {TARGET_MS:g} ms", color="red")
    ax_t.set_ylabel(f"ms per {result['batch_size']}-seed batch (median, p10-p90)")
    ax_t.set_xlabel("OMP_WAIT_POLICY, OpenMP threads")
    # Log only when the bars span >= 10x (spinning on a shared machine can cost that much).
    spread = [r[f"p{HIGH_PCT}_ms"] for r in recs] + [r[f"p{LOW_PCT}_ms"] for r in recs]
    if set_scale(ax_t, spread) == "linear":
        ax_t.set_ylim(0, 1.1 * max(*spread, TARGET_MS))  # the target line inside the axes
    ax_t.legend()
    sizes = recs[0]["mean_block_sizes"]
    layers = [s["layer"] for s in sizes]
    ax_s.plot(layers, [s["n_dst"] for s in sizes], "o-", label="destinations")
    ax_s.plot(layers, [s["n_src"] for s in sizes], "s-", label="sources")
    ax_s.plot(layers, [s["edges"] for s in sizes], "^-", label="edges")
    set_scale(ax_s, [s[k] for s in sizes for k in ("n_dst", "n_src", "edges")])
    ax_s.set_xticks(layers)
    ax_s.set_xlabel("block (0 = input layer)")
    ax_s.set_ylabel("mean size")
    ax_s.legend()
    for ax in (ax_t, ax_s):
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"NeighborSampler, fan-outs {result['fanouts']}, {result['graph']['nodes']} vertices, "
        f"avg degree {result['graph']['avg_degree']}"
    )
    save_figure(fig, path, dpi=110)


def measure(args: argparse.Namespace) -> dict:
    """Child process: build the graph and the sampler, time the batches; returns the records
    and the graph's description."""
    from distmb import _C
    from distmb.data import load_dataset
    from distmb.pipeline.sample import NeighborSampler

    graph = load_dataset(f"synthetic:nodes={args.nodes},avg_degree={args.avg_degree}")
    n = graph.num_nodes
    sampler = NeighborSampler(graph.indptr, graph.indices, n, n, args.fanouts, args.seed)
    train_idx = np.asarray(graph.train_idx)
    load_before, pressure_before = os.getloadavg()[0], cpu_pressure()
    previous_threads = _C.get_num_threads()
    try:
        records = run(
            sampler, train_idx, args.threads, args.batch_size, args.batches, args.warmup, args.seed
        )
    finally:
        _C.set_num_threads(previous_threads)
    for rec in records:
        rec["omp_wait_policy"] = args.child
        # Other processes on the machine skew the multi-thread timings most.
        rec["loadavg_1min_before_after"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        rec["cpu_pressure_avg10_before_after"] = [pressure_before, cpu_pressure()]
    deg = np.diff(graph.indptr)
    return {
        "graph": {
            "spec": f"synthetic:nodes={args.nodes},avg_degree={args.avg_degree}",
            "nodes": n,
            "avg_degree": args.avg_degree,
            "in_edges": graph.num_edges,
            "max_in_degree": int(deg.max()),
            "indices_dtype": str(graph.indices.dtype),
        },
        "records": records,
    }


def run_child(policy: str, argv: list[str]) -> dict:
    """Run :func:`measure` in a fresh interpreter with ``OMP_WAIT_POLICY`` set for ``policy``."""
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if policy != DEFAULT_POLICY:
        env["OMP_WAIT_POLICY"] = policy
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--child", policy]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=200_000)
    p.add_argument("--avg-degree", type=int, default=30)
    p.add_argument("--fanouts", type=int, nargs="+", default=[5, 10, 15])
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--batches", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--wait-policies", nargs="+", choices=WAIT_POLICIES, default=[DEFAULT_POLICY, "passive"]
    )
    p.add_argument("--out", type=Path, default=RESULTS / "sampling.json")
    p.add_argument("--child", choices=WAIT_POLICIES, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args)))
        return

    argv = list(sys.argv[1:])
    records: list[dict] = []
    graph: dict = {}
    for policy in args.wait_policies:
        child = run_child(policy, argv)
        graph = child["graph"]
        for rec in child["records"]:
            print(json.dumps({k: v for k, v in rec.items() if k != "mean_block_sizes"}))
        records += child["records"]
    for size in records[0]["mean_block_sizes"]:
        print(f"  block {size['layer']}: {size}")
    result = {
        "benchmark": "sampling",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
        },
        "graph": graph,
        "fanouts": args.fanouts,
        "batch_size": args.batch_size,
        "warmup_batches": args.warmup,
        "target_ms_2_threads": TARGET_MS,
        "records": records,
    }
    write_json(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
