"""Sampling throughput: the device sampler vs the C++ sampler, same graph.

Samples ``--batches`` mini-batches of ``--batch-size`` random seeds with fan-outs
``--fanouts`` (input -> output layer) on a synthetic power-law graph (all vertices solid)
after ``--warmup`` unmeasured ones. Every batch is sampled by every configuration back to
back (interleaved, so that load from other processes hits all alike):

- ``cpp``: the C++ sampler on ``--threads`` OpenMP threads;
- ``device/<dev>/<backend>/<placement>``:
:class:`~distmb.pipeline.sample.device.DeviceNeighborSampler` on
  ``cpu`` and, where torch sees one, ``cuda`` (back end ``torch``: PyTorch-ops layers,
  ``torch.unique`` Fused-Map, one read per layer; or ``triton``: the one-launch layer kernel,
  the Triton Fused-Map and one read per batch; CSR placement ``device`` or, on CUDA,
  ``host`` = zero-copy pinned memory). Triton runs on CUDA only here (its CPU interpreter is
  a test vehicle, not a performance path);
- ``device/cuda/triton-map/device``: the Triton Fused-Map behind the PyTorch-ops layers (one
  read per layer), the configuration before the layer kernel, to measure what it gains.

Reports per configuration the median, p10 and p90 milliseconds per batch and the sampled
edges per second (all layers' edges of a batch / its time; median over batches). On CUDA
each batch is timed to completion (``torch.cuda.synchronize``). A record's ``device`` says
where it ran: a ``cpu`` figure is no statement about GPUs. Writes
``results/gpu_sampling.json`` (only when run).

    python benchmarks/gpu_sampling.py                      # 200k vertices, degree 30
    python benchmarks/gpu_sampling.py --nodes 2400000 --avg-degree 26 --batches 50
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import traceback
from pathlib import Path

import numpy as np
import torch
from record import command_line

from distmb import _C
from distmb.cli.report import write_json
from distmb.core.machine import cpu_model
from distmb.data.datasets.synthetic import SyntheticConfig, generate
from distmb.pipeline.sample import NeighborSampler, idmap_triton
from distmb.pipeline.sample.device import DeviceNeighborSampler

RESULTS = Path(__file__).resolve().parents[1] / "results"
#: Percentiles reported besides the median.
LOW_PCT, HIGH_PCT = 10, 90


def configurations(args: argparse.Namespace, graph) -> dict[str, object]:
    """name -> sampler, for every configuration this machine can run."""
    n = graph.num_nodes
    samplers: dict[str, object] = {
        "cpp": NeighborSampler(graph.indptr, graph.indices, n, n, args.fanouts, args.seed)
    }
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        backends = ["torch"]
        if idmap_triton.usable(torch.device(device))[0] and device == "cuda":
            backends.append("triton")
        placements = ["device", "host"] if device == "cuda" else ["device"]
        for backend in backends:
            for placement in placements:
                samplers[f"device/{device}/{backend}/{placement}"] = DeviceNeighborSampler(
                    graph.indptr, graph.indices, n, n, args.fanouts, args.seed,
                    device=device, placement=placement, backend=backend,  # type: ignore[arg-type]
                )  # fmt: skip
        if "triton" in backends:
            # The Triton Fused-Map behind the torch layer (one read per layer): what the
            # one-launch layer kernel and the one read per batch of "triton" gain over it.
            samplers[f"device/{device}/triton-map/device"] = DeviceNeighborSampler(
                graph.indptr, graph.indices, n, n, args.fanouts, args.seed,
                device=device, placement="device", backend="triton", choose="torch",
            )  # fmt: skip
            # The one-read batches replayed from a CUDA graph (--cuda-graphs' sampler).
            samplers[f"device/{device}/triton-graphs/device"] = DeviceNeighborSampler(
                graph.indptr, graph.indices, n, n, args.fanouts, args.seed,
                device=device, placement="device", backend="triton", graphs=True,
            )  # fmt: skip
    return samplers


def time_batch(sampler, seeds: np.ndarray, it: int) -> tuple[float, int]:
    """(seconds, sampled edges) of one batch, the device work included."""
    cuda = isinstance(sampler, DeviceNeighborSampler) and sampler.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    blocks = sampler.sample(seeds, 0, it)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0, sum(b.num_edges for b in blocks)


def summary(seconds: list[float], edges: list[int]) -> dict:
    t = np.asarray(seconds) * 1e3
    rate = np.asarray(edges) / np.asarray(seconds)
    return {
        "median_ms": round(float(np.median(t)), 3),
        f"p{LOW_PCT}_ms": round(float(np.percentile(t, LOW_PCT)), 3),
        f"p{HIGH_PCT}_ms": round(float(np.percentile(t, HIGH_PCT)), 3),
        "edges_per_batch": round(float(np.mean(edges)), 1),
        "edges_per_s": round(float(np.median(rate)), 1),
    }


def machine() -> dict:
    facts = {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": getattr(idmap_triton.triton, "__version__", None),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            driver=torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None,
        )
    return facts


def interleaved(
    args: argparse.Namespace, graph, samplers: dict, failures: dict[str, str] | None = None
) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """Seconds and sampled edges per measured batch of every sampler: the same seeds for all,
    ``args.warmup`` untimed batches first, the order of the samplers alternating per batch.
    With ``failures``, a sampler whose batch raises is recorded there (name -> the error) and
    left out from then on (not in the results), so that the others are still measured;
    without it the error propagates."""
    rng = np.random.default_rng(args.seed)
    seconds: dict[str, list[float]] = {name: [] for name in samplers}
    edges: dict[str, list[int]] = {name: [] for name in samplers}
    names = list(samplers)
    for it in range(args.warmup + args.batches):
        seeds = rng.choice(graph.num_nodes, size=args.batch_size, replace=False)
        for name in names if it % 2 == 0 else names[::-1]:
            if failures is not None and name in failures:
                continue
            try:
                s, e = time_batch(samplers[name], seeds, it)
            except Exception as exc:
                if failures is None:
                    raise
                traceback.print_exc()
                failures[name] = f"{type(exc).__name__}: {exc}"
                del seconds[name], edges[name]
                continue
            if it >= args.warmup:
                seconds[name].append(s)
                edges[name].append(e)
    return seconds, edges


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=200_000)
    p.add_argument("--avg-degree", type=float, default=30.0)
    p.add_argument("--fanouts", type=lambda s: [int(x) for x in s.split(",")], default=[5, 10, 15])
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="C++ sampler")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "gpu_sampling.json")
    args = p.parse_args()

    _C.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    config = SyntheticConfig(nodes=args.nodes, avg_degree=args.avg_degree, hub_cap=0.0,
                             feat_dim=1, classes=2, seed=args.seed)  # fmt: skip
    graph = generate(config)
    print(f"graph: {graph.num_nodes} vertices, {graph.num_edges} in-edges "
          f"({time.perf_counter() - t0:.1f} s)")  # fmt: skip
    samplers = configurations(args, graph)
    seconds, edges = interleaved(args, graph, samplers)
    names = list(samplers)
    records = []
    base = np.median(np.asarray(edges["cpp"]) / np.asarray(seconds["cpp"]))
    for name in names:
        rec = {"sampler": name, "device": "cpu" if name == "cpp" else name.split("/")[1]}
        rec.update(summary(seconds[name], edges[name]))
        rec["speedup_vs_cpp"] = round(float(rec["edges_per_s"] / base), 3)
        records.append(rec)
        print(rec)
    write_json(
        args.out,
        {
            "benchmark": "gpu_sampling",
            "command": command_line(),
            "machine": machine(),
            "graph": {
                "nodes": graph.num_nodes,
                "in_edges": graph.num_edges,
                "avg_degree": args.avg_degree,
                "generator": "synthetic, hub_cap=0",
            },  # fmt: skip
            "fanouts": args.fanouts,
            "batch_size": args.batch_size,
            "batches": args.batches,
            "warmup_batches": args.warmup,
            "cpp_threads": args.threads,
            "records": records,
        },
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
