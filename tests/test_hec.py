"""HistoricalEmbeddingCache (the C++ cache, distmb.halo.hec.host): what only it promises.
Its contract, shared with the device cache, is tested in tests/test_hec_contract.py."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from distmb import _C
from distmb.core.errors import InputError
from distmb.engine.checkpoint import load_cache_state, save_cache_state
from distmb.halo.hec.contract import HEC_MISS
from distmb.halo.hec.host import HistoricalEmbeddingCache

#: Tags, rows and searches per operation from which every parallel loop of the kernel uses
#: 2 threads (its grains are 4096 tags and 32768 floats per thread).
PARALLEL_TAGS = 2 * 4096
PARALLEL_DIM = 64


def rows_for(tags: list[int], dim: int) -> np.ndarray:
    """Row i = tags[i] + [0, 0.01, 0.02, ...]: distinct and recognisable."""
    return np.asarray(tags, dtype=np.float32)[:, None] + np.arange(dim, dtype=np.float32) * 0.01


def test_slots_are_numpy_and_rows_cpu_tensors() -> None:
    hec = HistoricalEmbeddingCache(4, 3, 1)
    hec.store([5, 6], rows_for([5, 6], 3))
    slots = hec.search([6, 7])
    assert isinstance(slots, np.ndarray) and slots.dtype == np.int64
    assert slots.tolist() == [1, HEC_MISS]
    assert hec.device == torch.device("cpu") and hec.load(slots[:1]).device.type == "cpu"


def test_raw_binding_refuses_conversions() -> None:
    """The C++ binding itself refuses float64 (a converted copy of an output would be lost)."""
    hec = HistoricalEmbeddingCache(4, 3, 1)
    hec.store([1], rows_for([1], 3))
    with pytest.raises(ValueError):
        hec._core.load(np.array([0]), np.zeros((1, 3), np.float64))
    with pytest.raises(ValueError):
        hec._core.store(np.array([0]), np.zeros((1, 3), np.float64))


# -- threads -------------------------------------------------------------------------------
def run_big_sequence(threads: int) -> list[object]:
    """Stores and searches large enough for every parallel loop to split."""
    old = _C.get_num_threads()
    _C.set_num_threads(threads)
    try:
        rng = np.random.default_rng(5)
        hec = HistoricalEmbeddingCache(3 * PARALLEL_TAGS, PARALLEL_DIM, 2)
        results: list[object] = []
        for _ in range(6):
            tags = rng.integers(0, 8 * PARALLEL_TAGS, 2 * PARALLEL_TAGS)
            hec.store(tags, rng.standard_normal((len(tags), PARALLEL_DIM)).astype(np.float32))
            queries = rng.integers(0, 8 * PARALLEL_TAGS, 2 * PARALLEL_TAGS)
            results.append(hec.search(queries))
            mask, rows = hec.lookup(queries)
            dense = torch.empty(len(queries), PARALLEL_DIM)
            results += [mask.numpy(), rows.numpy(), hec.lookup_into(queries, dense).numpy()]
            results.append(dense.numpy())
            hec.advance()
        tags, ages = hec.snapshot()
        results += [tags, ages, hec.load(np.arange(len(tags))).numpy()]
        results += [hec.counters(), len(hec)]
        return results
    finally:
        _C.set_num_threads(old)


def test_thread_count_independence() -> None:
    one, two = run_big_sequence(1), run_big_sequence(2)
    assert len(one) == len(two)
    for a, b in zip(one, two, strict=True):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)
        else:
            assert a == b


def test_concurrent_python_threads_are_serialised() -> None:
    """A storing thread and a looking-up thread: every hit returns a row stored for its tag."""
    dim, n_tags = 8, 4000
    hec = HistoricalEmbeddingCache(1000, dim, 3)
    table = rows_for(list(range(n_tags)), dim)  # the only row ever stored under each tag
    errors: list[BaseException] = []

    def writer() -> None:
        rng = np.random.default_rng(1)
        for _ in range(200):
            tags = rng.integers(0, n_tags, 500)
            hec.store(tags, table[tags])
            hec.advance()

    def reader() -> None:
        rng = np.random.default_rng(2)
        try:
            for _ in range(200):
                tags = rng.integers(0, n_tags, 500)
                mask, rows = hec.lookup(tags)
                np.testing.assert_array_equal(rows.numpy(), table[tags[mask.numpy()]])
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


# -- memory ----------------------------------------------------------------------------------
def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")
def test_large_cache_is_not_zero_filled() -> None:
    """cs = 1M lines of 256 floats is a 1 GiB buffer: only bookkeeping (~72 MB) is touched
    at creation, and storing rows backs only their pages."""
    before = rss_bytes()
    hec = HistoricalEmbeddingCache(1_000_000, 256, 2)
    created = rss_bytes() - before
    assert created < 200 * 2**20, f"creating the cache touched {created / 2**20:.0f} MiB"
    hec.store(np.arange(1000), np.ones((1000, 256), np.float32))
    assert len(hec) == 1000
    del hec


# -- checkpoint files --------------------------------------------------------------------------
def test_state_survives_checkpoint_files(tmp_path: Path) -> None:
    """state() -> save -> load -> restore(): the same arrays come back, and the restored cache
    holds the same tags with the same ages and rows."""
    rng = np.random.default_rng(5)
    original = HistoricalEmbeddingCache(64, 3, lifespan=2)
    for _ in range(6):  # lines of ages 0..5; only ages <= 2 are valid
        tags = rng.choice(200, size=10, replace=False)
        original.store(tags, rng.standard_normal((10, 3)).astype(np.float32))
        original.advance()
    state = original.state()
    save_cache_state(tmp_path, 7, 1, {f"layer1_{k}": v for k, v in state.items()})
    loaded = load_cache_state(tmp_path, 7, 1)
    assert loaded is not None and loaded.keys() == {f"layer1_{k}" for k in state}
    for key, value in state.items():
        np.testing.assert_array_equal(loaded[f"layer1_{key}"], value)
    restored = HistoricalEmbeddingCache(64, 3, lifespan=2)
    restored.restore({k.removeprefix("layer1_"): v for k, v in loaded.items()})
    mask, rows = restored.lookup(state["tags"])
    assert mask.all()
    np.testing.assert_array_equal(rows.numpy(), state["rows"])
    tags, ages = restored.snapshot()
    assert dict(zip(tags.tolist(), ages.tolist(), strict=True)) == dict(
        zip(state["tags"].tolist(), state["ages"].tolist(), strict=True)
    )
    assert load_cache_state(tmp_path, 6, 1) is None
    (tmp_path / "hec-epoch6-rank1.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="hec-epoch6-rank1.npz"):
        load_cache_state(tmp_path, 6, 1)
