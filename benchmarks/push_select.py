"""Time of the HEC push choice (which computed rows go to which peer) per layer and batch.

Partitions ``--graph`` (default ``synthetic:shape=products``) into ``--parts`` parts (once;
``--part-dir`` is reused when it exists), samples ``--batches`` mini-batches of
``--batch-size`` training seeds of rank 0's part with fan-outs ``--fanouts`` (the C++
sampler, ``--threads`` threads), and times for every layer's computed sources, interleaved
and in the same process:

- ``previous``: the choice before the counter-based keys (numpy ``default_rng`` keys,
  ``argpartition`` per peer; copied from ``HistoricalCache._cap_per_peer``, the scheme now
  named ``HistoricalEmbeddingScheme``, as of main 0d08eea);
- ``host``: :func:`distmb.halo.hec.push_select.select_push_host` (the CPU path);
- ``device_on_cpu``: :func:`~distmb.halo.hec.push_select.select_push_device` on CPU tensors
  (the GPU path's torch ops; on the CPU only for comparison).

Every ``nc`` in ``--nc``; reports medians (and p10/p90) in milliseconds per call, candidate
counts, and checks that ``host`` and ``device_on_cpu`` chose the same rows. Writes
``results/push_select.json``.

    python benchmarks/push_select.py
    python benchmarks/push_select.py --nc 2000 100000000 --batches 10
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from distmb import _C
from distmb.cli.report import write_json
from distmb.core.machine import cpu_model
from distmb.data import load_dataset
from distmb.data.graph import csr_row_positions
from distmb.data.store.store import PartitionStore
from distmb.halo.hec.push_select import (
    PushTables,
    push_call_key,
    select_push_device,
    select_push_host,
)
from distmb.halo.hec.scheme import _peers_of_solid
from distmb.partition import partition_graph
from distmb.pipeline.sample import NeighborSampler

RESULTS = Path(__file__).resolve().parents[1] / "results"
#: Percentiles reported besides the median.
LOW_PCT, HIGH_PCT = 10, 90


def previous_choice(
    solid: np.ndarray, tables: PushTables, nc: int, num_peers: int, seeds: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """The choice as it was before the counter-based keys (a copy, for the timing)."""
    peer_ptr, peer_ids, degree = tables.peer_ptr, tables.peer_ids, tables.degree
    counts_per_src = peer_ptr[solid + 1] - peer_ptr[solid]
    pos = np.repeat(np.arange(solid.size), counts_per_src)
    peer = peer_ids[csr_row_positions(peer_ptr[solid], counts_per_src)]
    order = np.argsort(peer, kind="stable")
    pos, peer = pos[order], peer[order]
    counts = np.bincount(peer, minlength=num_peers).astype(np.int64)
    if counts.max(initial=0) <= nc:
        return pos, counts
    rng = np.random.default_rng(seeds)
    keep = []
    bounds = np.concatenate([[0], np.cumsum(counts)])
    for j in range(num_peers):
        group = pos[bounds[j] : bounds[j + 1]]
        if group.size > nc:
            weight = np.maximum(degree[solid[group]], 1.0)
            keys = np.log(rng.random(group.size)) / weight
            group = np.sort(group[np.argpartition(-keys, nc - 1)[:nc]])
            counts[j] = nc
        keep.append(group)
    return np.concatenate(keep), counts


def summary(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {
        "median_ms": round(float(np.median(a)), 4),
        f"p{LOW_PCT}_ms": round(float(np.percentile(a, LOW_PCT)), 4),
        f"p{HIGH_PCT}_ms": round(float(np.percentile(a, HIGH_PCT)), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", default="synthetic:shape=products")
    parser.add_argument("--parts", type=int, default=2)
    parser.add_argument("--part-dir", type=Path, default=Path("/tmp/distmb-push-select-parts"))
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--fanouts", type=int, nargs="+", default=[5, 10, 15])
    parser.add_argument("--nc", type=int, nargs="+", default=[2000, 10**9])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "push_select.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    _C.set_num_threads(args.threads)
    if not args.part_dir.exists():
        partition_graph(load_dataset(args.graph), args.parts, args.part_dir, seed=args.seed)
    store = PartitionStore(args.part_dir, 0)
    ptr, ids = _peers_of_solid(store, args.parts)
    degree = np.asarray(store.in_degree[: store.n_solid], np.float64)
    tables = PushTables.on_host(ptr, ids, np.array(store.orig_ids, np.int64), degree)
    cpu_tables = tables.to(torch.device("cpu"))
    sampler = NeighborSampler(
        np.asarray(store.indptr),
        np.asarray(store.indices),
        store.n_solid,
        store.n_local,
        args.fanouts,
        args.seed,
    )
    train = np.asarray(store.train_idx, np.int64)
    rng = np.random.default_rng(args.seed)
    kinds = ("previous", "host", "device_on_cpu")
    times: dict[tuple[int, int, str], list[float]] = {}
    sizes: dict[int, list[tuple[int, int, int]]] = {}
    for b in range(args.warmup + args.batches):
        seeds = rng.choice(train, size=min(args.batch_size, train.size), replace=False)
        blocks = sampler.sample(np.sort(seeds), 0, b)
        for layer, block in enumerate(blocks):
            solid = block.src_ids[: block.n_computed].numpy()
            solid_t = torch.from_numpy(solid)
            for nc in args.nc:
                call = push_call_key(args.seed, 0, b, layer, 0)
                fns = {
                    "previous": lambda s=solid, n=nc, b=b, l=layer: previous_choice(  # noqa: E731
                        s, tables, n, args.parts, [args.seed, 0, b, l, 0]
                    ),
                    "host": lambda s=solid, n=nc, c=call: select_push_host(
                        s, tables, n, args.parts, c
                    ),
                    "device_on_cpu": lambda s=solid_t, n=nc, c=call: select_push_device(
                        s, cpu_tables, n, args.parts, c
                    ),
                }
                out = {}
                for kind in kinds[b % 3 :] + kinds[: b % 3]:  # rotate the order per batch
                    t0 = time.perf_counter()
                    out[kind] = fns[kind]()
                    elapsed = (time.perf_counter() - t0) * 1e3
                    if b >= args.warmup:
                        times.setdefault((layer, nc, kind), []).append(elapsed)
                np.testing.assert_array_equal(out["host"][0], out["device_on_cpu"][0].numpy())
                np.testing.assert_array_equal(out["host"][1], out["device_on_cpu"][1])
                if b >= args.warmup:
                    n_cand = int((tables.peer_ptr[solid + 1] - tables.peer_ptr[solid]).sum())
                    sizes.setdefault(layer, []).append(
                        (solid.size, n_cand, int(out["host"][1].sum()))
                    )
    records = []
    for (layer, nc, kind), ms in sorted(times.items()):
        s = np.asarray(sizes[layer])
        records.append(
            {
                "layer": layer,
                "nc": nc,
                "kind": kind,
                "computed_sources_mean": round(float(s[:, 0].mean()), 1),
                "candidates_mean": round(float(s[:, 1].mean()), 1),
                **summary(ms),
            }
        )
        print(
            f"layer {layer} nc {nc:>10} {kind:>14}: median {records[-1]['median_ms']:8.3f} ms "
            f"(p10 {records[-1]['p10_ms']:.3f}, p90 {records[-1]['p90_ms']:.3f}); "
            f"{records[-1]['computed_sources_mean']:.0f} sources, "
            f"{records[-1]['candidates_mean']:.0f} candidates"
        )
    result = {
        "graph": args.graph,
        "parts": args.parts,
        "rank": 0,
        "batch_size": args.batch_size,
        "fanouts": args.fanouts,
        "batches": args.batches,
        "warmup": args.warmup,
        "threads": args.threads,
        "records": records,
        "command": "python benchmarks/push_select.py "
        + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
            if k not in ("out", "part_dir")
        ),
        "machine": {
            "platform": platform.platform(),
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "load_average_1min_at_end": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
        },
    }
    write_json(args.out, result, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
