"""Run under mpiexec: the same training with the historical caches in the C++ cache and in
the device cache (``DeviceHistoricalCache`` on ``DEVICE``) gives the same per-epoch records
(loss, accuracy, hits and bytes per layer), pushes the same tags, rows and counts (the C++
run chooses them on the host with numpy, the device-cache run with torch ops:
``distmb.halo.hec.push_select``), loads the same halo rows and hit masks at every step, and ends
with the same cache state, with caches small enough to evict and a short life-span.

argv: PART_DIR EPOCHS DEVICE
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from distmb.comm import MpiGroup
from distmb.config.train import TrainConfig
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.build.data import open_part
from distmb.halo import HistoricalEmbeddingScheme

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import TIMING_KEYS  # noqa: E402  (the tests' list of measured record keys)

part_dir, epochs, device = sys.argv[1], int(sys.argv[2]), sys.argv[3]
comm = MpiGroup()
store = open_part(comm, part_dir)
config = TrainConfig(
    layers=2,
    fanout=(4, 4),
    hidden=8,
    batch_size=32,
    epochs=epochs,
    eval_every=10**6,
    progress=False,
    threads=1,
    hec_size=60,
    hec_nc=40,
    hec_lifespan=1,
    hec_delay=1,
)


def run(cache_device: str | None) -> tuple[list[dict], list[tuple], dict, list[dict]]:
    halo = HistoricalEmbeddingScheme(
        comm, store, config.hec, config.seed, cache_device=cache_device
    )
    trainer = Trainer(
        LocalGraph.from_store(store), config, comm=comm, halo=halo, log=lambda _: None
    )
    events: list[tuple] = []
    halo.record = lambda kind, k, layer, tags, rows, extra: events.append(
        (kind, halo.epoch, k, layer, tags, rows, extra)
    )
    records = trainer.fit()
    counters = [c.counters() for c in halo.caches if c is not None]
    return records, events, halo.state(), counters


def stable(record: dict) -> dict:
    """The record without measured times and the run's identity."""
    return {k: v for k, v in record.items() if k not in TIMING_KEYS}


def compare() -> int:
    """Assert this rank's two runs agree; returns the number of halo loads compared."""
    for a, b in zip(cpp_records, dev_records, strict=True):
        diff = {k: (a[k], b.get(k)) for k in stable(a) if a[k] != b.get(k)}
        assert not diff, diff
    assert len(dev_events) == len(cpp_events) > 0
    loads = 0
    for a, b in zip(cpp_events, dev_events, strict=True):
        assert a[:4] == b[:4], (a[:4], b[:4])
        for x, y in zip(a[4:], b[4:], strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        loads += a[0] == "load"
    assert cpp_state.keys() == dev_state.keys()
    for key in cpp_state:
        np.testing.assert_array_equal(dev_state[key], cpp_state[key])
    assert dev_counters == cpp_counters, (dev_counters, cpp_counters)
    return loads


cpp_records, cpp_events, cpp_state, cpp_counters = run(None)
dev_records, dev_events, dev_state, dev_counters = run(device)
try:
    loads, problem = compare(), None
except AssertionError as exc:  # reported by every rank below, so that no rank waits alone
    loads, problem = 0, f"rank {comm.rank}: {exc!r}"[:2000]
problems = [p for p in comm.allgather(problem) if p is not None]
if problems:
    raise SystemExit("device and C++ caches differ: " + "; ".join(problems))
totals = comm.allreduce_sum(
    np.array([sum(c[key] for c in cpp_counters) for key in ("evictions", "hits")], np.int64)
)
evictions, hits = (int(v) for v in totals)
if comm.rank == 0:
    assert evictions > 0 and hits > 0, (evictions, hits)
    print(f"device HEC twin: {loads} loads equal, {hits} hits, {evictions} evictions", flush=True)
