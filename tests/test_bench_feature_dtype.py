"""benchmarks/feature_dtype.py: the smoke run (one seed, one epoch of a tiny products-shaped
graph) records every dtype under both cache sizings, with the host bytes of a brute-force
count of the training gathers' misses; with the cache holding float32's rows, a two-byte
table moves exactly half float32's bytes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from distmb.pipeline.features.device import DeviceFeatures

REPO = Path(__file__).resolve().parents[1]
#: The smoke run's graph (``--quick``) and its device cache.
NODES, FEAT_DIM, CACHE_PERCENT = 2000, 16, 10


@pytest.fixture
def feature_dtype(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import feature_dtype

    return feature_dtype


@pytest.fixture
def distinct_misses(monkeypatch) -> dict[tuple[torch.dtype, int], list[int]]:
    """Per device cache (its stored dtype and rows): the distinct ids of each training
    gather that the cache does not hold, counted in Python sets."""
    seen: dict[tuple[torch.dtype, int], list[int]] = {}
    gather = DeviceFeatures.gather_batch_rows

    def counting(self, ids, take_buffer):
        missed = set(ids.tolist()) - set(self.cached_ids().tolist())
        seen.setdefault((self.host.dtype, self.capacity), []).append(len(missed))
        return gather(self, ids, take_buffer)

    monkeypatch.setattr(DeviceFeatures, "gather_batch_rows", counting)
    return seen


def test_quick_run_records_half_the_bytes_with_the_same_rows(
    feature_dtype, distinct_misses, tmp_path
):
    out = tmp_path / "feature_dtype.json"
    assert feature_dtype.main(["--quick", "--device", "cpu", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert (
        result["command"] == f"python benchmarks/feature_dtype.py --quick --device cpu --out {out}"
    )
    assert result["machine"]["device"] == "cpu" and result["machine"]["cpus"] >= 1
    assert result["dtypes"] == ["float32", "float16", "bfloat16"]
    data = result["datasets"]["products"]
    rows = NODES * CACHE_PERCENT // 100

    # Every run's host bytes: its distinct misses, counted here, times the stored row's bytes.
    assert len(data["runs"]) == 5  # float32 once, each two-byte dtype under both sizings
    brute = {}
    for run in data["runs"]:
        dtype = getattr(torch, run["dtype"])
        two_byte_same_mib = run["sizing"] == "same_mib"
        assert run["cache_rows"] == (rows * 4 // dtype.itemsize if two_byte_same_mib else rows)
        loaded = sum(distinct_misses[(dtype, run["cache_rows"])])
        assert run["rows_loaded_per_epoch"] == [loaded]
        assert run["bytes_h2d_per_epoch"] == [loaded * FEAT_DIM * dtype.itemsize]
        brute[run["dtype"], run["sizing"]] = loaded * FEAT_DIM * dtype.itemsize

    summary = data["summary"]
    assert set(summary) == {"same_rows", "same_mib"}
    for sizing, per_dtype in summary.items():
        assert set(per_dtype) == {"float32", "float16", "bfloat16"}
        for name, entry in per_dtype.items():
            for key in ("test_acc_last_epoch", "test_acc_best_val_epoch", "loss_last_epoch"):
                assert len(entry[key]["per_seed"]) == 1
                assert entry[key]["median"] == entry[key]["per_seed"][0]
            base = brute["float32", "both"]
            mine = brute[name, "both" if name == "float32" else sizing]
            assert entry["bytes_ratio_to_float32"] == [mine / base]
    for name in ("float16", "bfloat16"):
        expected = getattr(torch, name).itemsize / torch.float32.itemsize
        assert summary["same_rows"][name]["bytes_ratio_to_float32"] == [expected]
        assert summary["same_rows"][name]["exact_half"] is True
        # Twice the rows cached: fewer misses than half float32's bytes would need.
        assert summary["same_mib"][name]["bytes_ratio_to_float32"][0] < expected
    assert data["accuracy_same_across_sizings"] is True
    assert data["table_rounding"]["float32"]["changed_fraction"] == 0.0
    assert data["table_rounding"]["float16"]["changed_fraction"] > 0.0


def test_table_rounding_counts_what_numpy_float16_changes(feature_dtype):
    table = np.random.default_rng(0).standard_normal((50, 7)).astype(np.float32) * 1e-3
    table[3, :4] = [0.0, 1e-9, 3e-5, 1 / 3]  # zero, made zero, subnormal, rounded
    got = feature_dtype.table_rounding(torch.from_numpy(table), ["float32", "float16"])
    rounded = table.astype(np.float16).astype(np.float32)
    nonzero = table != 0
    relative = np.abs(rounded - table)[nonzero] / np.abs(table)[nonzero]
    assert got["float32"]["changed_fraction"] == 0.0
    assert got["float16"]["changed_fraction"] == pytest.approx(np.mean(rounded != table))
    assert got["float16"]["changed_fraction_of_nonzero"] == pytest.approx(np.mean(relative != 0))
    assert got["float16"]["zeroed_fraction_of_nonzero"] == pytest.approx(1 / nonzero.sum())
    assert got["float16"]["max_relative_error"] == 1.0
    assert got["float16"]["median_relative_error"] == pytest.approx(np.median(relative))
