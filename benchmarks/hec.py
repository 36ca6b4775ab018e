"""Historical Embedding Cache operation times at the paper's default size.

Fills a ``--capacity``-line cache of width ``--dim`` (default 1M x 256 float32 = 1 GiB, the
paper's cs), then for every thread count in ``--threads`` times, over ``--reps`` repetitions
after ``--warmup`` unmeasured ones:

- ``search_load``: ``search`` of ``--search`` tags (``--hit-fraction`` of them resident, the
  rest absent) followed by ``load`` of the hits;
- ``lookup``: the same through the fused ``lookup`` call (allocates the result);
- ``lookup_into``: the same gathered into a preallocated buffer (zeros for misses);
- ``store``: ``--store`` rows, half of them overwriting resident tags and half new tags, which
  evict the oldest lines;
- ``store_bookkeeping``: the same stores into a cache of width 1, i.e. the serial slot
  decisions (hash map, write-order list) without the row copies.

Reports medians, p10/p90, minima and the effective bandwidth of the row copies, and writes
``results/hec.json`` (atomically). On a machine shared with other jobs, multi-threaded
medians mostly measure the wait for a descheduled OpenMP thread at each parallel region
(the load average is recorded; ``OMP_WAIT_POLICY=passive`` stops threads from spinning
against each other); the minima are closer to the uncontended cost.

    python benchmarks/hec.py
    python benchmarks/hec.py --capacity 200000 --threads 1 --reps 10
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
from distmb.halo.hec.contract import HEC_MISS
from distmb.halo.hec.host import HistoricalEmbeddingCache

RESULTS = Path(__file__).resolve().parents[1] / "results"
#: Life-span of the benchmarked caches (the paper's default); no advance() happens while
#: timing, so every resident line stays live.
LIFESPAN = 2
#: Rows per store call while filling the cache.
FILL_CHUNK = 100_000
#: Tags from here on are never stored (the misses of the searches).
ABSENT_BASE = 1 << 40
#: Percentiles reported besides the median.
LOW_PCT, HIGH_PCT = 10, 90


def timed(fn: Callable[[int], object], reps: int, warmup: int) -> np.ndarray:
    """Milliseconds of ``fn(rep)`` for rep in [warmup, warmup + reps)."""
    out = []
    for rep in range(warmup + reps):
        t0 = time.perf_counter()
        fn(rep)
        elapsed = (time.perf_counter() - t0) * 1e3
        if rep >= warmup:
            out.append(elapsed)
    return np.asarray(out)


def summary(ms: np.ndarray, bytes_moved: float | None = None) -> dict:
    med = float(np.median(ms))
    rec = {
        "median_ms": round(med, 3),
        f"p{LOW_PCT}_ms": round(float(np.percentile(ms, LOW_PCT)), 3),
        f"p{HIGH_PCT}_ms": round(float(np.percentile(ms, HIGH_PCT)), 3),
        "min_ms": round(float(ms.min()), 3),
    }
    if bytes_moved is not None:
        rec["copy_GBps"] = round(bytes_moved / (med * 1e-3) / 1e9, 2)
    return rec


def filled_cache(capacity: int, dim: int) -> HistoricalEmbeddingCache:
    """A full cache holding tags [0, capacity), stored in chunks (rows: tag + column / 1000)."""
    hec = HistoricalEmbeddingCache(capacity, dim, LIFESPAN)
    cols = np.arange(dim, dtype=np.float32) / 1000
    for lo in range(0, capacity, FILL_CHUNK):
        tags = np.arange(lo, min(capacity, lo + FILL_CHUNK))
        hec.store(tags, tags.astype(np.float32)[:, None] + cols)
    return hec


def store_batches(
    rng: np.random.Generator, resident: np.ndarray, n_store: int, count: int, new_base: int
) -> list[np.ndarray]:
    """Tag sets of ``count`` store calls: half tags resident before the first call (most are
    still resident when their call comes), half never-seen tags."""
    half = n_store // 2
    out = []
    for k in range(count):
        old = rng.choice(resident, half, replace=False)
        new = new_base + k * n_store + np.arange(n_store - half)
        out.append(rng.permutation(np.concatenate([old, new])))
    return out


def run_threads(hec: HistoricalEmbeddingCache, threads: int, args: argparse.Namespace) -> dict:
    _C.set_num_threads(threads)
    rng = np.random.default_rng(args.seed + threads)
    n_hit = int(round(args.search * args.hit_fraction))
    resident, _ = hec.snapshot()  # earlier stores replaced some of the initial tags
    absent = ABSENT_BASE + rng.choice(args.capacity, args.search - n_hit, replace=False)
    queries = rng.permutation(np.concatenate([rng.choice(resident, n_hit, replace=False), absent]))
    slots = hec.search(queries)
    hits = int((slots != HEC_MISS).sum())
    out = torch.empty((hits, args.dim), dtype=torch.float32)
    row_bytes = args.dim * 4

    def search_load(_: int) -> None:
        s = hec.search(queries)
        hec.load(s[s != HEC_MISS], out=out)

    def lookup(_: int) -> None:
        hec.lookup(queries)

    dense = torch.empty((len(queries), args.dim), dtype=torch.float32)

    def lookup_into(_: int) -> None:
        hec.lookup_into(queries, dense)

    rec: dict = {"threads": threads, "search_hits": hits}
    rec["search_load"] = summary(timed(search_load, args.reps, args.warmup), hits * row_bytes)
    rec["lookup"] = summary(timed(lookup, args.reps, args.warmup), hits * row_bytes)
    rec["lookup_into"] = summary(timed(lookup_into, args.reps, args.warmup), hits * row_bytes)

    # Stores change the cache: new tags are unique per thread count and repetition.
    total = args.reps + args.warmup
    new_base = ABSENT_BASE + (1 + threads) * (1 << 32)
    batches = store_batches(rng, resident, args.store, total, new_base)
    rows = rng.standard_normal((args.store, args.dim)).astype(np.float32)
    before = hec.counters()
    rec["store"] = summary(
        timed(lambda k: hec.store(batches[k], rows), args.reps, args.warmup),
        args.store * row_bytes,
    )
    after = hec.counters()
    rec["store_evictions_per_call"] = (after["evictions"] - before["evictions"]) / total

    thin = filled_cache(args.capacity, 1)
    thin_rows = np.zeros((args.store, 1), np.float32)
    rec["store_bookkeeping"] = summary(
        timed(lambda k: thin.store(batches[k], thin_rows), args.reps, args.warmup)
    )
    return rec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--capacity", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--search", type=int, default=50_000)
    p.add_argument("--hit-fraction", type=float, default=0.8)
    p.add_argument("--store", type=int, default=20_000)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "hec.json")
    args = p.parse_args()

    t0 = time.perf_counter()
    hec = filled_cache(args.capacity, args.dim)
    fill_s = time.perf_counter() - t0
    records = []
    for threads in args.threads:
        rec = run_threads(hec, threads, args)
        records.append(rec)
        print(
            f"{threads} thread(s): search+load {rec['search_load']['median_ms']:.2f} ms "
            f"({rec['search_hits']} hits), lookup {rec['lookup']['median_ms']:.2f} ms, "
            f"lookup_into {rec['lookup_into']['median_ms']:.2f} ms, "
            f"store {rec['store']['median_ms']:.2f} ms "
            f"(bookkeeping {rec['store_bookkeeping']['median_ms']:.2f} ms)"
        )
    result = {
        "benchmark": "hec",
        "capacity": args.capacity,
        "dim": args.dim,
        "lifespan": LIFESPAN,
        "search_tags": args.search,
        "hit_fraction": args.hit_fraction,
        "store_rows": args.store,
        "store_mix": "half overwrite resident tags, half new tags (evict the oldest lines)",
        "reps": args.reps,
        "warmup": args.warmup,
        "fill_seconds": round(fill_s, 3),
        "records": records,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            # Other processes compete for the cores when this is high (shared machines).
            "load_average_1min_at_end": round(os.getloadavg()[0], 2),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", ""),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "torch": torch.__version__,
        },
    }
    write_json(args.out, result, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
