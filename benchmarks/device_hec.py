"""Operations per second of the device-resident HEC
(:class:`distmb.halo.hec.device.DeviceHistoricalCache`)
next to the C++ one (:class:`distmb.halo.hec.host.HistoricalEmbeddingCache`), on the same
operations.

Fills a ``--capacity``-line cache of width ``--dim`` in each backend (the C++ cache; the
device cache on the CPU; on ``cuda`` when torch sees a GPU), then times, over ``--reps``
repetitions after ``--warmup`` unmeasured ones (medians, p10/p90):

- ``lookup_into``: ``--search`` tags (``--hit-fraction`` resident) searched and gathered into
  a preallocated buffer (the trainer's hot-path call);
- ``store``: ``--store`` rows, half overwriting resident tags, half new tags that replace the
  oldest lines (the trainer's store of the rows pushed by peers).

Rates are rows per second (``tags / median``). The C++ cache runs ``--threads`` OpenMP
threads, the CPU device cache as many torch intra-op threads; on a GPU, every timed call ends
with ``torch.cuda.synchronize()``. Before timing, one identical store and lookup on every
backend are checked to give identical slots and rows, so the timed work is the same work.
Writes ``results/device_hec.json`` (atomically) when run:

    python benchmarks/device_hec.py
    python benchmarks/device_hec.py --capacity 1000000 --dim 256 --search 50000 --store 20000
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from distmb import _C
from distmb.cli.report import write_json
from distmb.core.machine import cpu_model
from distmb.halo.hec.contract import EmbeddingCache
from distmb.halo.hec.device import DeviceHistoricalCache
from distmb.halo.hec.host import HistoricalEmbeddingCache

RESULTS = Path(__file__).resolve().parents[1] / "results"
#: Life-span of the benchmarked caches (the paper's default); nothing advances while timing.
LIFESPAN = 2
#: Rows per store call while filling.
FILL_CHUNK = 100_000
#: Tags from here on are never stored before the timed calls (the searches' misses and the
#: stores' new tags).
ABSENT_BASE = 1 << 40
#: Percentiles reported besides the median.
LOW_PCT, HIGH_PCT = 10, 90


def timed(fn: Callable[[int], object], reps: int, warmup: int, sync: Callable[[], None]) -> list:
    """Milliseconds of ``fn(rep)`` (then ``sync()``) for rep in [warmup, warmup + reps)."""
    out = []
    for rep in range(warmup + reps):
        sync()
        t0 = time.perf_counter()
        fn(rep)
        sync()
        if rep >= warmup:
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def summary(ms: list, rows: int) -> dict:
    med = float(np.median(ms))
    return {
        "median_ms": round(med, 3),
        f"p{LOW_PCT}_ms": round(float(np.percentile(ms, LOW_PCT)), 3),
        f"p{HIGH_PCT}_ms": round(float(np.percentile(ms, HIGH_PCT)), 3),
        "rows_per_s": round(rows / (med * 1e-3)),
    }


def make(backend: str, capacity: int, dim: int) -> EmbeddingCache:
    if backend == "cpp":
        return HistoricalEmbeddingCache(capacity, dim, LIFESPAN)
    device = "cpu" if backend == "device-cpu" else "cuda"
    # The trainer's setting on a GPU: tags were validated when the partition was loaded.
    return DeviceHistoricalCache(capacity, dim, LIFESPAN, device=device, checked=False)


def fill(cache: EmbeddingCache, capacity: int, dim: int) -> None:
    cols = np.arange(dim, dtype=np.float32) / 1000
    for lo in range(0, capacity, FILL_CHUNK):
        tags = np.arange(lo, min(capacity, lo + FILL_CHUNK))
        cache.store(tags, tags.astype(np.float32)[:, None] + cols)


def host(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--capacity", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--search", type=int, default=20_000)
    p.add_argument("--hit-fraction", type=float, default=0.8)
    p.add_argument("--store", type=int, default=5_000)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "device_hec.json")
    args = p.parse_args()

    _C.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    backends = ["cpp", "device-cpu"] + (["device-cuda"] if torch.cuda.is_available() else [])
    rng = np.random.default_rng(args.seed)
    n_hit = int(round(args.search * args.hit_fraction))
    queries = rng.permutation(
        np.concatenate(
            [
                rng.choice(args.capacity, n_hit, replace=False),
                ABSENT_BASE + rng.choice(args.capacity, args.search - n_hit, replace=False),
            ]
        )
    )
    total = args.reps + args.warmup + 1  # +1: the equality check's store
    half = args.store // 2
    batches = [
        rng.permutation(
            np.concatenate(
                [
                    rng.choice(args.capacity, half, replace=False),
                    ABSENT_BASE + (k + 1) * args.store + np.arange(args.store - half),
                ]
            )
        )
        for k in range(total)
    ]
    rows = rng.standard_normal((args.store, args.dim)).astype(np.float32)

    caches = {b: make(b, args.capacity, args.dim) for b in backends}
    records = []
    check: dict[str, tuple] = {}
    for backend, cache in caches.items():
        t0 = time.perf_counter()
        fill(cache, args.capacity, args.dim)
        cuda = backend == "device-cuda"
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        sync()
        fill_s = time.perf_counter() - t0
        device = "cuda" if cuda else "cpu"
        q = torch.from_numpy(queries).to(device)
        out = torch.empty((args.search, args.dim), device=device)
        dev_rows = torch.from_numpy(rows).to(device)
        dev_batches = [torch.from_numpy(b).to(device) for b in batches]
        # The same first store and lookup on every backend: identical slots and rows.
        cache.store(dev_batches[0] if backend != "cpp" else batches[0], rows)
        hit = cache.lookup_into(q if backend != "cpp" else queries, out)
        check[backend] = (host(cache.search(batches[0][:1000])), host(hit), host(out))

        def lookup_into(_: int, cache=cache, q=q, out=out, backend=backend) -> None:
            cache.lookup_into(q if backend != "cpp" else queries, out)

        def store(k: int, cache=cache, backend=backend, dev_rows=dev_rows, dev_batches=dev_batches):
            if backend == "cpp":
                cache.store(batches[k + 1], rows)
            else:
                cache.store(dev_batches[k + 1], dev_rows)

        rec = {
            "backend": backend,
            "fill_seconds": round(fill_s, 3),
            "lookup_into": summary(timed(lookup_into, args.reps, args.warmup, sync), args.search),
            "store": summary(timed(store, args.reps, args.warmup, sync), args.store),
        }
        records.append(rec)
        print(
            f"{backend:12s} lookup_into {rec['lookup_into']['median_ms']:8.2f} ms "
            f"({rec['lookup_into']['rows_per_s']:>12,} rows/s)  store "
            f"{rec['store']['median_ms']:8.2f} ms ({rec['store']['rows_per_s']:>12,} rows/s)"
        )
    first = check["cpp"]
    for backend, got in check.items():
        for a, b in zip(first, got, strict=True):
            if not np.array_equal(a, b):
                raise SystemExit(f"{backend} differs from the C++ cache on the check call")
    result = {
        "benchmark": "device_hec",
        "capacity": args.capacity,
        "dim": args.dim,
        "lifespan": LIFESPAN,
        "search_tags": args.search,
        "hit_fraction": args.hit_fraction,
        "store_rows": args.store,
        "store_mix": "half overwrite resident tags, half new tags (replace the oldest lines)",
        "threads": args.threads,
        "reps": args.reps,
        "warmup": args.warmup,
        "records": records,
        "command": "python benchmarks/device_hec.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
        "machine": {
            "platform": platform.platform(),
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "load_average_1min_at_end": round(os.getloadavg()[0], 2),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
    }
    write_json(args.out, result, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
