"""benchmarks/gpu.py end to end in its quick CPU mode (a smoke test: no GPU figures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def fake_result(epoch_s: float) -> dict:
    """A hand-built record of one training run whose phases add up to 1.5 s, and a device
    sampler 2.1x as fast as the C++ one (65M against 137M edges/s)."""
    cache = [
        {"policy": policy, "cache_percent": pct, "hit_rate": 0.1 * pct / 5,
         "h2d_bytes_plain": 3e9, "h2d_bytes_match": 2e9, "h2d_bytes_match_reorder": 1e9}
        for policy in ("presc", "degree", "none", "oracle")
        for pct in (5, 10, 20)
    ]  # fmt: skip
    return {
        "figures": "gpu",
        "machine": {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "cpus": 16},
        "training": [
            {
                "name": "cache10/fused",
                "kernels": "fused",
                "sample_s": 0.5,
                "feature_movement_s": 0.25,
                "compute_s": 0.75,
                "epoch_s": epoch_s,
            }
        ],  # fmt: skip
        "sampling": [
            {"sampler": "cpp", "edges_per_s": 6.5e7, "speedup_vs_cpp": 1.0},
            {"sampler": "device/cuda/triton/device", "edges_per_s": 1.37e8, "speedup_vs_cpp": 2.1},
        ],  # fmt: skip
        "cache": {"runs": cache},
    }


@pytest.mark.parametrize("epoch_s", [1.0, 2.0], ids=["overlapped", "serial"])
def test_figure_draws_bars_from_zero_and_names_the_overlap(monkeypatch, tmp_path, epoch_s):
    """Bars on linear axes from zero (a 2.1x gap drawn 2.1x long, not on a cut log axis); the
    epoch panel says that overlapped phases add up to more than the epoch, only when they do."""
    import matplotlib.pyplot as plt

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import gpu

    figures = []
    monkeypatch.setattr(gpu, "save_figure", lambda fig, path: figures.append(fig))
    gpu.plot(fake_result(epoch_s), tmp_path / "gpu.png")
    (fig,) = figures
    try:
        ax_epoch, ax_sample, ax_bytes, _ = fig.axes
        assert ax_sample.get_xscale() == "linear" and ax_sample.get_xlim()[0] == 0
        lengths = sorted(bar.get_width() for bar in ax_sample.patches)
        assert lengths == [6.5e7, 1.37e8]
        assert [t.get_text() for t in ax_sample.texts] == ["1.0x C++", "2.1x C++"]
        assert ax_epoch.get_xscale() == "linear" and ax_epoch.get_xlim()[0] == 0
        assert ax_bytes.get_yscale() == "linear" and ax_bytes.get_ylim()[0] == 0
        assert ("their sum exceeds the epoch" in ax_epoch.get_title()) == (epoch_s < 1.5)
        # The phases stacked left to right (0.5 + 0.25 + 0.75 s), the machine named.
        assert [(b.get_x(), b.get_width()) for b in ax_epoch.patches] == [
            (0.0, 0.5), (0.5, 0.25), (0.75, 0.75)
        ]  # fmt: skip
        assert fig.get_suptitle().startswith("NVIDIA H100 80GB HBM3, driver 580.159.04")
    finally:
        plt.close(fig)


#: The smoke test's graph and batch, smaller than --quick's (10000 vertices, batches of 500):
#: the same two iterations per epoch (8 % training vertices), a fifth of the padded blocks that
#: Triton's interpreter fills on the --cuda-graphs runs (most of the run's time). Given
#: explicitly, they also check that explicit flags win over --quick's.
SMOKE_NODES, SMOKE_BATCH = 2500, 100


def test_quick_cpu_run_writes_a_consistent_record(tmp_path):
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--quick", "--device", "cpu",
         "--threads", "2", "--nodes", str(SMOKE_NODES), "--batch-size", str(SMOKE_BATCH),
         "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert result["figures"].startswith("cpu smoke test")
    assert result["graph"]["classes"] == 47 and result["graph"]["nodes"] == SMOKE_NODES
    assert result["model"]["batch_size"] == SMOKE_BATCH and result["model"]["hidden"] == 32
    cached, half, *table = result["training"]
    assert [r["name"] for r in result["training"]] == [
        "cache10/fused", "cache10/fused/float16", "table/fused/prefetch0",
        "table/fused/prefetch2",
        "table/fused/graphs/prefetch0", "table/fused/graphs/prefetch2",
        "table/fused/graphs/prefetch2/float16",
        "gat/table/fused/prefetch2",
    ]  # fmt: skip
    graphed = [r for r in result["training"] if r["cuda_graphs"]]
    # On the CPU the padded step runs without a graph: no capture, no replay, no failure.
    assert all(r["graph_captures"] == r["graph_replays"] == 0 for r in graphed), graphed
    for train in result["training"]:
        assert train["iterations"] > 0 and train["epoch_s"] > 0
        assert min(train["sample_s"], train["feature_movement_s"], train["compute_s"]) > 0
    assert 0 <= cached["device_cache_hit_rate"] <= 1 and cached["h2d_bytes"] > 0
    # float16 host rows: the same batches, the same cached rows, two bytes a value.
    assert half["feature_dtype"] == "float16" and cached["feature_dtype"] == "float32"
    assert half["device_cache_hit_rate"] == cached["device_cache_hit_rate"]
    assert half["h2d_bytes"] * 2 == cached["h2d_bytes"]
    # The whole table on the device: every lookup hits, nothing crosses from the host.
    assert all(r["device_cache_hit_rate"] == 1.0 and r["h2d_bytes"] == 0 for r in table)
    sweep = {r["precision"]: r for r in result["precision_sweep"]}
    assert set(sweep) == {"fp32", "bf16"} and sweep["fp32"]["loss"] != sweep["bf16"]["loss"]
    assert all(0 <= r["test_acc"] <= 1 and r["kernels"] == "torch" for r in sweep.values())
    # The C++ path on the same CPU: same model and epochs, its test accuracy measured.
    baseline = result["cpp_baseline"]
    assert baseline["name"] == "cpp/cpu" and baseline["kernels"] == "fused"
    assert len(baseline["epoch_times_s"]) == 1 and 0 <= baseline["test_acc"] <= 1
    profile = result["profile"]
    assert profile["iterations"] == cached["iterations"] and profile["wall_s"] > 0
    assert profile["launches"] == profile["kernels"] == 0  # CPU tensors: no device work
    launches = result["launches_per_iteration"]
    # The sampler reads the host once per layer (3); every stage dispatched ops.
    assert launches["iterations"] > 0 and launches["host_reads"] >= 3
    # One device wait per epoch: the phase timers read their CUDA events at its end.
    assert launches["device_waits"] == round(1 / launches["iterations"], 2)
    assert launches["non_view_ops"] < launches["aten_ops"] and launches["kernels"] == "torch"
    # Allocations and views launch nothing: the launch proxy is below the non-view ops.
    assert 0 < launches["launch_ops"] < launches["non_view_ops"]
    # --cuda-graphs (eager on the CPU): the step's ops in its own stage, fewer launches outside.
    graphed = launches["graphs"]
    assert graphed["launches_graphed"] < graphed["launches"]
    assert graphed["syncing_ops"] <= launches["syncing_ops"]  # the torch back ends on the CPU
    total = launches["launch_ops"] + launches["triton_launches"]
    assert launches["launches"] == pytest.approx(total, abs=0.02)  # each rounded to 0.01
    assert all(launches["aten_ops_by_stage"][s] > 0 for s in ("sample", "forward", "backward"))
    by_name = {r["sampler"]: r for r in result["sampling"]}
    assert set(by_name) == {"cpp", "device/cpu/torch/device"}
    assert by_name["cpp"]["speedup_vs_cpp"] == 1.0
    runs = result["cache"]["runs"]
    assert {(r["policy"], r["cache_percent"]) for r in runs} == {
        (p, c) for p in ("presc", "degree", "none", "oracle") for c in (5, 10, 20)
    }
    for r in runs:
        # Reuse never moves more rows; without a cache nothing hits.
        assert r["h2d_bytes_match"] <= r["h2d_bytes_plain"]
        assert (r["hit_rate"] == 0) == (r["policy"] == "none")
    assert "skipped" in result["bandwidth"]
    assert result["goals"] == {"note": "CPU smoke test: no goal applies"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--device", "cuda"],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2 and "--device cuda" in proc.stderr
    assert "sees no GPU" in proc.stderr and "Traceback" not in proc.stderr


def test_goals_read_the_table_and_cache_runs_and_the_profile(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import gpu

    result = fake_result(1.0)
    result["training"].append({"name": "table/fused/prefetch2", "epoch_s": 0.42})
    result["training"].append({"name": "gat/table/triton/prefetch2", "model": "gat",
                               "precision": "fp32", "epoch_s": 0.3})  # no sage goal  # fmt: skip
    # A --cuda-graphs run that failed is recorded and read by no goal.
    result["training"].append({"name": "table/triton/graphs/prefetch2", "model": "sage",
                               "cuda_graphs": True, "failed": "RuntimeError: capture"})  # fmt: skip
    result["profile"] = {"name": "table/triton/prefetch0", "wall_s": 2.0, "gpu_busy": 0.615,
                         "syncs_per_iteration": 3.5, "launches_per_iteration": 212.0}  # fmt: skip
    result["bandwidth"] = {}
    goals = gpu.goals(result)
    assert "epoch_table_any_precision" not in goals  # no precision sweep
    result["precision_sweep"] = [
        {"name": "table/triton/graphs/prefetch2", "precision": "tf32", "epoch_s": 0.38},
        {"name": "gat/table/triton/prefetch2", "model": "gat", "precision": "bf16",
         "epoch_s": 0.2},
        {"name": "table/triton/graphs/prefetch2", "precision": "fp32", "failed": "capture"},
    ]  # fmt: skip
    goals = gpu.goals(result)
    assert "accuracy" not in goals  # no accuracies measured
    result["precision_sweep"][0]["test_acc"] = 0.8125
    result["cpp_baseline"] = {"name": "cpp/cpu", "epoch_s": 14.0, "test_acc": 0.8131}
    assert gpu.goals(result)["accuracy"] == "test accuracy, C++ path 0.8131; GPU path tf32 0.8125"
    assert goals["epoch_table_any_precision"].endswith(
        ": 0.38 s (tf32, table/triton/graphs/prefetch2)"
    )
    assert goals["epoch_table"].endswith(": 0.42 s")  # the table run, not the cache run
    assert goals["epoch_cache"].endswith(": 1.00 s (cache10/fused)")  # names its run
    assert goals["busy"] == "GPU busy >= 80%: 62%"
    assert goals["syncs"].endswith(": 3.5") and goals["launches"].endswith(": 212.0")
    assert goals["sampling"].endswith(": 2.1x")
    # The graphed configuration's profile, when it ran faster, is the one the goals read.
    result["profile_graphs"] = {"name": "table/triton/graphs/prefetch0", "wall_s": 1.0,
                                "gpu_busy": 0.9, "syncs_per_iteration": 1.5,
                                "launches_per_iteration": 45.0}  # fmt: skip
    goals = gpu.goals(result)
    assert goals["profiled"].endswith("table/triton/graphs/prefetch0")
    assert goals["launches"].endswith(": 45.0") and goals["busy"].endswith(": 90%")
    # The configuration users run (graphs, --prefetch 2) when it is the fastest.
    result["profile_prefetch"] = {"name": "table/triton/graphs/prefetch2", "wall_s": 0.8,
                                  "gpu_busy": 0.95, "syncs_per_iteration": 1.5,
                                  "launches_per_iteration": 46.0}  # fmt: skip
    goals = gpu.goals(result)
    assert goals["profiled"].endswith("table/triton/graphs/prefetch2")
    assert goals["busy"].endswith(": 95%")
    result["profile_prefetch"] = {"skipped": "not among --parts"}
    result["profile_graphs"] = {"failed": "RuntimeError: capture"}
    assert gpu.goals(result)["launches"].endswith(": 212.0")
    assert gpu.goals({"figures": "cpu smoke test"}) == {"note": "CPU smoke test: no goal applies"}


def test_a_failing_sampler_is_recorded_and_the_others_are_measured(monkeypatch):
    """A sampler configuration that raises (a graph that cannot be captured) is recorded
    with its error and dropped; the C++ baseline is still measured, the goals and the figure
    read the measured ones, and the run reports it as failed."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import argparse

    import gpu
    import gpu_sampling

    from distmb.data.datasets.synthetic import SyntheticConfig, generate
    from distmb.pipeline.sample import NeighborSampler

    class Broken:
        def sample(self, seeds, epoch, iteration):
            raise RuntimeError("capture failed")

    graph = generate(SyntheticConfig(nodes=200, avg_degree=5, feat_dim=1, classes=2, seed=0))
    n = graph.num_nodes
    samplers = {"cpp": NeighborSampler(graph.indptr, graph.indices, n, n, [2, 2], 0),
                "device/cpu/broken": Broken()}  # fmt: skip
    args = argparse.Namespace(seed=0, warmup=1, batches=3, batch_size=10)
    failures: dict[str, str] = {}
    seconds, edges = gpu_sampling.interleaved(args, graph, samplers, failures)
    assert failures == {"device/cpu/broken": "RuntimeError: capture failed"}
    assert list(seconds) == list(edges) == ["cpp"] and len(seconds["cpp"]) == 3
    with pytest.raises(RuntimeError, match="capture failed"):
        gpu_sampling.interleaved(args, graph, samplers)  # no failures dict: it propagates

    result = fake_result(1.0)
    result["sampling"].append({"sampler": "device/cuda/triton-graphs/device",
                               "failed": "RuntimeError: capture failed"})  # fmt: skip
    assert gpu.goals(result)["sampling"].endswith(": 2.1x")
    assert gpu.failed_parts(result) == ["sampling:device/cuda/triton-graphs/device"]


def test_a_failing_training_run_is_recorded_under_its_name(monkeypatch):
    """guarded_run names a run that raises as training_part would have (the defaults from
    the arguments, the options given over them) and records its error."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import gpu

    def fail(*args, **options):
        raise RuntimeError("capture failed")

    monkeypatch.setattr(gpu, "training_part", fail)
    args = gpu.parse_args(["--device", "cpu", "--prefetch", "3", "--precision", "fp32"])
    record = gpu.guarded_run(args, None, "triton", cuda_graphs=True)
    assert record == {"name": "cache10/triton/graphs", "model": "sage", "cuda_graphs": True,
                      "compile": False, "precision": "fp32",
                      "failed": "RuntimeError: capture failed"}  # fmt: skip
    record = gpu.guarded_run(args, None, "fused", cache_percent=100.0, model="gat",
                             precision="bf16")  # fmt: skip
    assert record["name"] == "gat/table/fused/prefetch3" and record["precision"] == "bf16"
    record = gpu.guarded_run(args, None, "triton", cuda_graphs=True, match_reorder=True)
    assert record["name"] == "cache10/triton/graphs/match"


def test_parts_run_only_those_asked_for(monkeypatch, tmp_path):
    """``--parts``: the others are recorded as skipped, read by no goal and drawn as not
    measured; an unknown part is refused naming the known ones."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import gpu

    with pytest.raises(SystemExit):
        gpu.parse_args(["--device", "cpu", "--parts", "sampling,bogus"])
    called: list[str] = []
    monkeypatch.setattr(gpu, "sampling_part", lambda args, graph: called.append("s") or [])
    monkeypatch.setattr(gpu, "training_runs", lambda args, graph: called.append("t") or [])
    out = tmp_path / "gpu.json"
    code = gpu.main(["--device", "cpu", "--quick", "--nodes", "2000", "--threads", "2",
                     "--parts", "sampling", "--out", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    assert code == 0 and called == ["s"]
    for key in ("training", "precision_sweep", "profile", "launches_per_iteration", "cache"):
        assert result[key] == {"skipped": "not among --parts"}, key
    assert result["sampling"] == [] and gpu.failed_parts(result) == []
    assert gpu.measured(result, "training") is None


def test_the_gpu_only_configurations_run_on_cpu_tensors(monkeypatch):
    """The runs only a GPU makes (the capped gather, the graphed profile at --prefetch) on
    CPU tensors: named as the record says, the cap set on the device cache, the profile's
    configuration the one named."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import gpu

    from distmb.data.datasets.synthetic import SyntheticConfig, generate

    args = gpu.parse_args(["--device", "cpu", "--quick", "--threads", "2", "--epochs", "1"])
    graph = generate(SyntheticConfig(nodes=600, avg_degree=5, feat_dim=8, classes=3, seed=0))
    trainers = []
    make = gpu.make_trainer
    monkeypatch.setattr(
        gpu, "make_trainer", lambda *a, **k: trainers.append(make(*a, **k)) or trainers[-1]
    )
    record = gpu.training_part(args, graph, "torch", cuda_graphs=True, feature_dtype="float16",
                               gather_programs=4)  # fmt: skip
    assert record["name"] == "cache10/torch/graphs/float16/programs4"
    assert record["gather_programs"] == 4 and record["feature_dtype"] == "float16"
    assert trainers[-1].parts.device_stages.device_cache.gather_programs == 4
    assert record["iterations"] > 0 and record["h2d_bytes"] > 0
    profile = gpu.profile_part(args, graph, cuda_graphs=True, prefetch=2)
    assert profile["name"] == "table/fused/graphs/prefetch2" and profile["wall_s"] > 0
    assert trainers[-1].cfg.prefetch == 2 and trainers[-1].cfg.cuda_graphs
    assert trainers[-1].cfg.model == profile["model"] == "sage"
    # GAT's profile: the same epoch of the other model, named with its prefix.
    profile = gpu.profile_part(args, graph, cuda_graphs=True, model="gat")
    assert profile["name"] == "gat/table/fused/graphs/prefetch0" and profile["wall_s"] > 0
    assert trainers[-1].cfg.model == profile["model"] == "gat"
    assert trainers[-1].cfg.prefetch == 0 and trainers[-1].cfg.cuda_graphs


def planned_runs(monkeypatch, device: str) -> tuple[list[dict], list[dict]]:
    """The training part's and the precision sweep's runs as they would be on ``device``
    (``--kernels fused,triton``, every precision), their settings recorded instead of
    trained: on "cuda" the GPU's 132 multiprocessors are faked, no GPU is used."""
    import types

    import gpu

    def settings(args, graph, kernels, accuracy=False, **options):
        return gpu.run_settings(args, kernels, **options)

    monkeypatch.setattr(gpu, "training_part", settings)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda d: types.SimpleNamespace(multi_processor_count=132),
    )
    args = gpu.parse_args(["--device", "cpu", "--kernels", "fused,triton",
                           "--precisions", "fp32,tf32,bf16,fp16"])  # fmt: skip
    args.device = device  # parse_args refuses cuda on a machine without a GPU
    return gpu.training_runs(args, None), gpu.precision_part(args, None)


def test_gat_runs_graphed_on_cuda_in_training_and_the_sweep(monkeypatch):
    """On CUDA GAT also runs in its fastest configuration (--cuda-graphs at --prefetch, the
    Triton kernels), after its eager runs; the sweep's GAT runs are graphed as GraphSAGE's
    (but fp16, whose scaler a graph cannot replay). On the CPU neither."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    training, sweep = planned_runs(monkeypatch, "cuda")
    gat = [(r["name"], r["kernels"], r["cuda_graphs"], r["prefetch"])
           for r in training if r["model"] == "gat"]  # fmt: skip
    assert gat == [
        ("gat/table/fused/prefetch2", "fused", False, 2),
        ("gat/table/triton/prefetch2", "triton", False, 2),
        ("gat/table/triton/graphs/prefetch2", "triton", True, 2),
    ]
    assert training[-1]["name"] == "gat/table/triton/graphs/prefetch2"  # after the eager ones
    graphed = {(r["model"], r["precision"]): r["cuda_graphs"] for r in sweep}
    assert graphed == {
        ("sage", "fp32"): True, ("sage", "tf32"): True, ("sage", "bf16"): True,
        ("sage", "fp16"): False,
        ("gat", "tf32"): True, ("gat", "bf16"): True, ("gat", "fp16"): False,
    }  # fmt: skip
    names = {r["name"] for r in sweep if r["model"] == "gat" and r["cuda_graphs"]}
    assert names == {"gat/table/triton/graphs/prefetch2"}
    training, sweep = planned_runs(monkeypatch, "cpu")
    assert not any(r["cuda_graphs"] for r in training if r["model"] == "gat")
    assert [r["model"] for r in sweep if "skipped" not in r] == ["sage", "sage"]  # fp32, bf16


# Ids without "cuda": conftest skips the tests whose keywords name it where no GPU is seen.
@pytest.mark.parametrize("device", ["cuda", "cpu"], ids=["gpu_faked", "cpu"])
def test_the_gat_profile_runs_graphed_on_cuda_only(monkeypatch, tmp_path, device):
    """``profile_gat``: on CUDA one whole-table GAT epoch profiled with --cuda-graphs at
    --prefetch 0, recorded under its key; on the CPU it is not run (as the other graphed
    profiles). The profiles' settings are recorded instead of profiled: no GPU is used."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import gpu

    calls: list[dict] = []

    def profile(args, graph, cuda_graphs=False, prefetch=0, model="sage"):
        calls.append({"model": model, "cuda_graphs": cuda_graphs, "prefetch": prefetch})
        return {"name": gpu.run_name("triton", 100.0, prefetch, model, graphs=cuda_graphs),
                "wall_s": 1.0, "gpu_busy": 0.5, "syncs_per_iteration": 1.0,
                "launches_per_iteration": 10.0}  # fmt: skip

    monkeypatch.setattr(gpu, "profile_part", profile)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu, "machine", lambda device: {"gpu": "a faked GPU", "cpus": 2})
    out = tmp_path / "gpu.json"
    code = gpu.main(["--device", device, "--quick", "--nodes", "2000", "--threads", "2",
                     "--parts", "profile,profile_gat", "--out", str(out)])  # fmt: skip
    result = json.loads(out.read_text())
    assert code == 0 and result["profile"]["name"] == "table/triton/prefetch0"
    if device == "cpu":
        assert calls == [{"model": "sage", "cuda_graphs": False, "prefetch": 0}]
        assert "profile_gat" not in result
        return
    assert calls == [{"model": "sage", "cuda_graphs": False, "prefetch": 0},
                     {"model": "gat", "cuda_graphs": True, "prefetch": 0}]  # fmt: skip
    assert result["profile_gat"]["name"] == "gat/table/triton/graphs/prefetch0"
    assert result["profile_graphs"] == {"skipped": "not among --parts"}
    assert result["goals"]["profiled"] == "the profile of table/triton/prefetch0"


def test_goals_read_graphsage_profiles_and_record_gats_fastest_epoch(monkeypatch):
    """GAT's profile, however fast, is not the one GraphSAGE's goals read; GAT's fastest
    trained epoch (training or sweep, any precision; failed runs left out) is recorded."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import gpu

    result = fake_result(1.0)
    result["profile"] = {"name": "table/triton/prefetch0", "wall_s": 2.0, "gpu_busy": 0.615,
                         "syncs_per_iteration": 3.5, "launches_per_iteration": 212.0}  # fmt: skip
    result["profile_gat"] = {"name": "gat/table/triton/graphs/prefetch0", "model": "gat",
                             "wall_s": 0.5, "gpu_busy": 0.97, "syncs_per_iteration": 1.0,
                             "launches_per_iteration": 20.0}  # fmt: skip
    assert "gat_epoch" not in gpu.goals(result)  # no GAT run
    graphed = "gat/table/triton/graphs/prefetch2"
    result["training"] += [
        {"name": "gat/table/triton/prefetch2", "model": "gat", "precision": "fp32",
         "epoch_s": 8.4},
        {"name": graphed, "model": "gat", "precision": "fp32", "epoch_s": 4.25},
    ]  # fmt: skip
    result["precision_sweep"] = [
        {"name": "table/triton/graphs/prefetch2", "model": "sage", "precision": "tf32",
         "epoch_s": 0.38},  # GraphSAGE's: faster, not GAT's
        {"name": graphed, "model": "gat", "precision": "tf32", "epoch_s": 3.1},
        {"name": graphed, "model": "gat", "precision": "bf16", "failed": "RuntimeError: x"},
    ]  # fmt: skip
    goals = gpu.goals(result)
    assert goals["profiled"] == "the profile of table/triton/prefetch0"
    assert goals["busy"] == "GPU busy >= 80%: 62%" and goals["launches"].endswith(": 212.0")
    assert goals["gat_epoch"] == (
        "GAT epoch, table on the device, fastest (recorded, no goal): "
        "3.10 s (tf32, gat/table/triton/graphs/prefetch2)"
    )
    result["training"][-1]["epoch_s"] = 2.5  # the training run's, when it is the fastest
    assert gpu.goals(result)["gat_epoch"].endswith(": 2.50 s (fp32, " + graphed + ")")
    assert "epoch_table" not in goals  # GAT's table runs are not GraphSAGE's


def test_the_figure_draws_the_graphed_gat_runs(monkeypatch, tmp_path):
    """The graphed GAT runs, of the training part and the sweep, are rows of the epoch
    panel."""
    import matplotlib.pyplot as plt

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import gpu

    result = fake_result(1.0)
    graphed = "gat/table/triton/graphs/prefetch2"
    phases = {"sample_s": 0.5, "feature_movement_s": 0.25, "compute_s": 3.0}
    result["training"].append({"name": graphed, "model": "gat", "precision": "fp32",
                               "epoch_s": 4.0, **phases})  # fmt: skip
    result["precision_sweep"] = [{"name": graphed, "model": "gat", "precision": "tf32",
                                  "epoch_s": 3.1, **phases}]  # fmt: skip
    figures = []
    monkeypatch.setattr(gpu, "save_figure", lambda fig, path: figures.append(fig))
    gpu.plot(result, tmp_path / "gpu.png")
    (fig,) = figures
    try:
        fig.canvas.draw()
        rows = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        assert rows == [f"{graphed} tf32", graphed, "cache10/fused"]  # the first on top
    finally:
        plt.close(fig)
