"""benchmarks/feature_dtype_cpu.py: the smoke run (one round of two epochs on a tiny
products-shaped one-part partition, each configuration in its own process) records every
``--features`` and ``--feature-dtype`` configuration; a two-byte table holds exactly half the
bytes of float32's (rows x features x 2 against x 4, from the graph's shape), in the
process's own memory, and its rows are the float32 rows rounded; the summary's medians are
those of the runs' steady epochs and its ratios their quotients."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The smoke run's graph (``--quick``): one part holds every vertex.
NODES, FEAT_DIM = 2000, 16
DTYPES = ("float32", "bfloat16")  # float16 takes the same path (a process per configuration)
KINDS = ("mmap", "memory")


@pytest.fixture
def feature_dtype_cpu(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import feature_dtype_cpu

    return feature_dtype_cpu


def test_quick_run_records_half_the_table_bytes(feature_dtype_cpu, tmp_path):
    out = tmp_path / "feature_dtype_cpu.json"
    assert feature_dtype_cpu.main(["--quick", "--dtypes", "bfloat16", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert result["command"] == (
        f"python benchmarks/feature_dtype_cpu.py --quick --dtypes bfloat16 --out {out}"
    )
    assert result["machine"]["cpus"] >= 1 and result["graph"]["rows"] == NODES
    runs = result["runs"]
    assert sorted((r["features"], r["dtype"]) for r in runs) == sorted(
        (kind, dtype) for kind in KINDS for dtype in DTYPES
    )
    float32_bytes = NODES * FEAT_DIM * 4
    summary = result["summary"]
    assert set(summary) == set(KINDS)
    for kind in KINDS:
        assert set(summary[kind]) == set(DTYPES)
        base = summary[kind]["float32"]
        for dtype in DTYPES:
            entry = summary[kind][dtype]
            table = entry["table"]
            assert (table["dtype"], table["rows"], table["dim"]) == (dtype, NODES, FEAT_DIM)
            if dtype == "float32":
                assert table["bytes"] == float32_bytes
                if kind == "mmap":  # the page cache holds it, not the process
                    assert (table["in_ram_bytes"], table["page_cache_bytes"]) == (0, float32_bytes)
                else:  # --features memory reads it into the process's memory
                    assert (table["in_ram_bytes"], table["page_cache_bytes"]) == (float32_bytes, 0)
            else:
                assert table["bytes"] == table["in_ram_bytes"] == NODES * FEAT_DIM * 2
                assert 2 * table["in_ram_bytes"] == summary["memory"]["float32"]["table"]["bytes"]
                assert table["page_cache_bytes"] == 0
            assert entry["rows_match_rounded_float32"]
            assert entry["block0_in_place"]  # two-byte tables too
            assert 0.0 <= entry["test_acc"] <= 1.0
            for stage in ("start", "setup", "last_epoch"):
                assert entry["rss"][stage]["RssAnon"] > 0 and entry["rss"][stage]["RssFile"] > 0

            # The medians are the runs' steady epochs' (the second of each), the ratios their
            # quotients with float32's.
            (run,) = [r for r in runs if (r["features"], r["dtype"]) == (kind, dtype)]
            assert len(run["epochs"]) == 2 and entry["steady_epochs"] == 1
            for key in ("epoch_time", "mbc", "gather", "fwd", "bwd"):
                assert entry["steady"][key] == statistics.median([run["epochs"][1][key]])
                assert entry["first_epoch"][key] == run["epochs"][0][key]
            for key in ("epoch_time", "mbc", "gather"):
                ratio = entry["ratio_to_float32"][key]
                assert ratio == pytest.approx(entry["steady"][key] / base["steady"][key], rel=1e-12)
        assert base["ratio_to_float32"]["epoch_time"] == 1.0
