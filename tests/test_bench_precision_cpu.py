"""benchmarks/precision_cpu.py: the smoke run (one round of two epochs on a tiny
products-shaped one-part partition, each configuration in its own process) records every model
and configuration; the bf16 runs took the fused kernels' bfloat16 products (the run header says
so, and their losses differ from float32's), the float32 runs did not; the summary's medians
are those of the runs' steady epochs and its ratios their quotients with fused/fp32's."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from distmb.nn.kernels.cpu_update import bf16_native

REPO = Path(__file__).resolve().parents[1]
#: The smoke run's graph (``--quick``) and GAT's width per head there.
NODES, FEAT_DIM, GAT_HIDDEN = 2000, 16, 4
MODELS = ("sage", "gat")
#: --kernels torch takes the same path (a process per configuration): left out for time.
CONFIGS = ("fused/fp32", "fused/bf16")
#: The start of the run header's line on the fused kernels' bfloat16 products.
BF16_NOTE = "--precision bf16: the fused kernels' matrix products on bfloat16 operands"


@pytest.fixture
def precision_cpu(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import precision_cpu

    return precision_cpu


def test_quick_run_records_every_configuration(precision_cpu, tmp_path):
    out = tmp_path / "precision_cpu.json"
    assert precision_cpu.main(["--quick", "--kernels", "fused", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert (
        result["command"]
        == f"python benchmarks/precision_cpu.py --quick --kernels fused --out {out}"
    )
    assert result["machine"]["cpus"] >= 1 and result["machine"]["bf16_native"] == bf16_native()
    assert (result["graph"]["rows"], result["graph"]["feat_dim"]) == (NODES, FEAT_DIM)
    gat, sage = result["recipes"]["gat"], result["recipes"]["sage"]
    assert (gat["model"], gat["hidden"], gat["heads"], sage["model"]) == (
        "gat",
        GAT_HIDDEN,
        4,
        "sage",
    )
    assert result["configurations"] == list(CONFIGS) and result["models"] == list(MODELS)
    runs = result["runs"]
    assert sorted((r["model"], r["config"]) for r in runs) == sorted(
        (model, config) for model in MODELS for config in CONFIGS
    )
    summary = result["summary"]
    assert set(summary) == set(MODELS)
    for model in MODELS:
        assert set(summary[model]) == set(CONFIGS)
        base = summary[model]["fused/fp32"]
        bf16 = summary[model]["fused/bf16"]
        # The precision reached the run: the header says so, and rounding moved the loss.
        assert any(note.startswith(BF16_NOTE) for note in bf16["notes"])
        assert not any(note.startswith("--precision") for note in base["notes"])
        assert bf16["loss_last_epoch"] != base["loss_last_epoch"]
        for config in CONFIGS:
            entry = summary[model][config]
            assert (entry["kernels"], entry["precision"]) == tuple(config.split("/"))
            assert 0.0 <= entry["test_acc"] <= 1.0 and 0.0 <= entry["val_acc"] <= 1.0
            assert entry["loss_same_across_rounds"]  # one round: trivially
            (run,) = [r for r in runs if (r["model"], r["config"]) == (model, config)]
            assert run["evaluation"]["test_acc"] == entry["test_acc"]  # round 0 evaluates
            assert entry["loss_last_epoch"] == run["epochs"][-1]["loss"]
            # The medians are the runs' steady epochs' (the second of each), the ratios their
            # quotients with fused/fp32's.
            assert len(run["epochs"]) == 2 and entry["steady_epochs"] == 1
            for key in ("epoch_time", "mbc", "fwd", "bwd", "opt", "load_wait"):
                assert entry["steady"][key] == statistics.median([run["epochs"][1][key]])
                assert entry["first_epoch"][key] == run["epochs"][0][key]
            for key in ("epoch_time", "fwd", "bwd"):
                ratio = entry["ratio_to_fused_fp32"][key]
                assert ratio == pytest.approx(entry["steady"][key] / base["steady"][key], rel=1e-12)
        assert base["ratio_to_fused_fp32"]["epoch_time"] == 1.0


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--models", "gcn"], "--models"),
        (["--precisions", "fp16"], "--precisions"),
        (["--epochs", "1"], "--epochs"),
    ],  # fmt: skip
)
def test_bad_flags_are_refused_by_name(precision_cpu, capsys, argv, flag):
    with pytest.raises(SystemExit):
        precision_cpu.parse_args(argv)
    assert flag in capsys.readouterr().err
