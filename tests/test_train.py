"""python -m distmb.train: flags, resume, divergence, checkpoints, report, accuracy."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest
import torch
from conftest import FAST_FLAGS, SMALL, TIMING_KEYS, run_train_cli

from distmb.cli.report import main as report_main
from distmb.config import recipes
from distmb.config.train import TrainConfig
from distmb.data import load_dataset
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.checkpoint import CHECKPOINT_FILE

FAST = [*FAST_FLAGS, "--eval-every", "1"]


#: ``python -m distmb.train ARGV`` in this process: (exit code, stdout, stderr).
run = run_train_cli


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--layers", "2", "--fanout", "5,10,15"], "lists 3 values but --layers is 2"),
        (["--fanout", "5,x,15"], "comma-separated integers"),
        (["--fanout", "5,0,15"], "must be >= 1"),
        (["--hidden", "0"], "--hidden must be >= 1"),
        (["--batch-size", "-5"], "--batch-size must be >= 1"),
        (["--lr", "0"], "--lr must be > 0"),
        (["--dropout", "1.0"], "--dropout must be in [0, 1)"),
        (["--aggr", "max"], "--aggr must be one of"),
        (["--resume"], "--resume needs --checkpoint-dir"),
        (["--exact-remote", "--no-hec"], "--exact-remote and --no-hec exclude each other"),
        (["--hidden", "100000000"], "needs"),
        (["--threads", "100000000"], "--threads must be in [1, 4096]"),
        (["--loader-threads", "100000000"], "--loader-threads must be in [1, 4096]"),
        (["--seed", str(2**64)], "--seed must be in [0, 9223372036854775807]"),
        (["--fanout", "5,10,99999999999"], "each value must be <= 2147483647"),
        (["--dataset", "synthetic:nodes=500,train_fraction=0"], "no training vertices"),
    ],
)
def test_bad_flags(capsys, argv, message):
    code, _, err = run(argv + ["--epochs", "1"], capsys)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_unknown_model(capsys):
    code, _, err = run(["--model", "gcnii"], capsys)
    assert code == 2 and "--model must be one of sage, gat, gcn, gin or package.module:Class" in err


def test_train_prints_epochs_and_writes_results(tmp_path, capsys):
    results = tmp_path / "run.jsonl"
    code, out, _ = run(
        ["--dataset", SMALL, *FAST, "--epochs", "2", "--results", str(results)], capsys
    )
    assert code == 0
    lines = [line for line in out.splitlines() if line.startswith("epoch")]
    assert len(lines) == 2 and all("MBC" in line and "ARed" in line for line in lines)
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["epoch"] for r in records] == [0, 1]
    for r in records:
        assert {
            "loss",
            "train_acc",
            "val_acc",
            "test_acc",
            "mbc",
            "fwd",
            "bwd",
            "ared",
            "load_wait",
            "sample",
            "gather",
            "samples_per_s",
        } <= set(r)
        # The loop's phases are disjoint parts of the epoch; MBC (sample + gather) runs on
        # the prefetch thread and overlaps them, only the wait for batches is the loop's.
        assert r["epoch_time"] >= r["load_wait"] + r["fwd"] + r["bwd"]
        assert r["mbc"] == pytest.approx(r["sample"] + r["gather"], abs=2e-4)
    assert report_main([str(results)]) == 0
    png = tmp_path / "run.jsonl.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_synchronous_loading_waits_for_every_batch(tmp_path, capsys):
    """--prefetch 0: the loop makes each batch itself, so it waits at least MBC, and MBC,
    FWD and BWD are disjoint parts of the epoch."""
    results = tmp_path / "run.jsonl"
    argv = ["--dataset", SMALL, *FAST, "--epochs", "2", "--prefetch", "0"]
    code, out, _ = run([*argv, "--results", str(results)], capsys)
    assert code == 0 and "synchronous loading" in out
    for r in (json.loads(line) for line in results.read_text().splitlines()):
        assert r["load_wait"] >= r["mbc"] - 2e-4
        assert r["epoch_time"] >= r["mbc"] + r["fwd"] + r["bwd"]


def test_report_rejects_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"epoch": 0, "loss": 1}\n{not json\n')
    with pytest.raises(SystemExit) as exc:
        report_main([str(bad)])
    assert exc.value.code == 2 and "bad.jsonl:2: not a JSON object" in capsys.readouterr().err
    bad.write_text('{"epoch": 0, "x": 1}\n')  # an epoch record of something else
    with pytest.raises(SystemExit) as exc:
        report_main([str(bad)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "bad.jsonl:1: an epoch record without loss" in err
    assert "Traceback" not in err


def _losses(tmp_path, name: str, argv: list[str], capsys) -> list[float]:
    results = tmp_path / f"{name}.jsonl"
    code, _, err = run([*argv, "--results", str(results)], capsys)
    assert code == 0, err
    return [json.loads(line)["loss"] for line in results.read_text().splitlines()]


def _records(tmp_path, name: str, argv: list[str], capsys) -> list[dict]:
    results = tmp_path / f"{name}.jsonl"
    code, out, err = run([*argv, "--results", str(results)], capsys)
    assert code == 0, err
    return [
        {k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS}
        for line in results.read_text().splitlines()
    ]


@pytest.mark.parametrize("model", ["sage", "gat"])
def test_prefetch_gives_identical_training(tmp_path, capsys, model):
    """Sampling and gathering ahead on a thread changes nothing but the time."""
    base = ["--dataset", SMALL, *FAST, "--model", model, "--heads", "2", "--epochs", "3"]
    sync = _records(tmp_path, "sync", [*base, "--prefetch", "0"], capsys)
    for prefetch in ("1", "3"):
        assert _records(tmp_path, prefetch, [*base, "--prefetch", prefetch], capsys) == sync


@pytest.mark.parametrize("prefetch", ["0", "2"])
@pytest.mark.parametrize("model", ["sage", "gat"])
def test_resume_equals_straight_run(tmp_path, capsys, model, prefetch):
    base = ["--dataset", SMALL, *FAST, "--model", model, "--heads", "2", "--prefetch", prefetch]
    straight = _losses(tmp_path, "straight", [*base, "--epochs", "4"], capsys)
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    first = _losses(tmp_path, "first", [*base, "--epochs", "2", *ckpt], capsys)
    second = _losses(tmp_path, "second", [*base, "--epochs", "4", *ckpt, "--resume"], capsys)
    assert first + second == straight  # bit-identical losses


def test_resume_refuses_other_dataset_or_model(tmp_path, capsys):
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    assert run(["--dataset", SMALL, *FAST, "--epochs", "1", *ckpt], capsys)[0] == 0
    other = SMALL.replace("nodes=3000", "nodes=3001")
    code, _, err = run(["--dataset", other, *FAST, "--epochs", "2", *ckpt, "--resume"], capsys)
    assert code == 2 and "trained on another dataset" in err
    code, _, err = run(
        ["--dataset", SMALL, *FAST, "--model", "gat", "--epochs", "2", *ckpt, "--resume"], capsys
    )
    assert code == 2 and "--model 'sage'" in err
    (tmp_path / "ckpt" / CHECKPOINT_FILE).write_bytes(b"garbage")
    code, _, err = run(["--dataset", SMALL, *FAST, "--epochs", "2", *ckpt, "--resume"], capsys)
    assert code == 2 and "not a readable checkpoint" in err


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, capsys, monkeypatch):
    import distmb.engine.trainer as trainer_module

    real_loss = trainer_module.F.cross_entropy
    calls = {"n": 0}

    def loss_turning_nan(logits, target, **kwargs):
        calls["n"] += 1  # 3 batches per epoch: call 5 is epoch 1, iteration 1
        loss = real_loss(logits, target, **kwargs)
        return loss * float("nan") if calls["n"] == 5 else loss

    monkeypatch.setattr(trainer_module.F, "cross_entropy", loss_turning_nan)
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    code, out, err = run(["--dataset", SMALL, *FAST, "--epochs", "3", *ckpt], capsys)
    assert code == 3
    assert "loss is nan at epoch 1, iteration 1" in err and "last good checkpoint" in err
    assert "epoch   0" in out and "epoch   1" not in out
    state = torch.load(tmp_path / "ckpt" / CHECKPOINT_FILE, weights_only=True)
    assert state["epoch"] == 0
    assert all(torch.isfinite(t).all() for t in state["model"].values())


def _median_test_acc(spec: str, config: TrainConfig, seeds=(0, 1, 2)) -> float:
    local = LocalGraph.from_graph(load_dataset(spec))
    accs = []
    for seed in seeds:
        config.seed = seed
        history = Trainer(local, config, log=lambda _: None).fit()
        accs.append(history[-1]["test_acc"])
    return statistics.median(accs)


#: Documented Cora hyper-parameters (README, "Accuracy"; distmb.config.recipes).
CORA_SAGE = {**recipes.CORA_SAGE, "progress": False, "eval_every": 30}
CORA_GAT = {**recipes.CORA_GAT, "progress": False, "eval_every": 30}


@pytest.mark.slow
def test_cora_accuracy_sage(cora_dir):
    acc = _median_test_acc(f"planetoid:{cora_dir}", TrainConfig(**CORA_SAGE))
    assert acc >= 0.78, acc


@pytest.mark.slow
def test_cora_accuracy_gat(cora_dir):
    acc = _median_test_acc(f"planetoid:{cora_dir}", TrainConfig(**CORA_GAT))
    assert acc >= 0.77, acc


def _mlp_test_acc(graph, seed: int = 0, epochs: int = 200) -> float:
    """Reference: a 2-layer MLP on raw features, full-batch Adam."""
    torch.manual_seed(seed)
    x = torch.from_numpy(graph.features)
    y = torch.from_numpy(graph.labels)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(x.shape[1], 256),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.5),
        torch.nn.Linear(256, graph.num_classes),
    )
    opt = torch.optim.Adam(mlp.parameters(), lr=0.003)
    train = torch.from_numpy(graph.train_idx)
    for _ in range(epochs):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(mlp(x[train]), y[train]).backward()
        opt.step()
    mlp.eval()
    test = torch.from_numpy(graph.test_idx)
    return float((mlp(x[test]).argmax(1) == y[test]).float().mean())


@pytest.mark.slow
def test_synthetic_gnn_beats_mlp():
    graph = load_dataset("synthetic")
    mlp = _mlp_test_acc(graph)
    config = TrainConfig(
        layers=2,
        fanout=(10, 15),
        hidden=128,
        batch_size=250,
        epochs=15,
        progress=False,
        eval_every=15,
    )
    gnn = Trainer(LocalGraph.from_graph(graph), config, log=lambda _: None).fit()[-1]["test_acc"]
    assert gnn >= mlp + 0.10, (gnn, mlp)
    assert np.isfinite(gnn)


#: The default generator config on fewer vertices: same features, degree law and homophily,
#: and 3000 training vertices, i.e. 3 default-sized batches per epoch as on the default graph.
QUICK_SYNTHETIC = "synthetic:nodes=10000,train_fraction=0.3,val_fraction=0.1,test_fraction=0.6"
#: Epochs of the quick run (3 Adam steps each) and the accuracy it must reach: the default
#: model's plateau on this graph (84.5 % after 30 epochs, seed 0); issue item 8 asks for 90 %
#: of the plateau within 10 epochs, here 80 % within QUICK_EPOCHS (measured: 72.6 %).
QUICK_EPOCHS = 6
QUICK_PLATEAU = 0.84


def test_default_model_learns_the_synthetic_task_quickly():
    """The default trainer (GraphSAGE 3x256, fan-out 5,10,15, batch 1000, Adam 0.003) gets
    most of the way to its plateau in a few epochs on the built-in features. Features of norm
    ``sqrt(feat_dim)`` started it at a loss of ~6 and cost ~10 epochs (issue item 8)."""
    graph = load_dataset(QUICK_SYNTHETIC)
    config = TrainConfig(epochs=QUICK_EPOCHS, eval_every=QUICK_EPOCHS, progress=False)
    history = Trainer(LocalGraph.from_graph(graph), config, log=lambda _: None).fit()
    chance = np.log(graph.num_classes)
    assert history[0]["loss"] <= 1.15 * chance, history[0]["loss"]
    assert history[-1]["test_acc"] >= 0.8 * QUICK_PLATEAU, history[-1]["test_acc"]


def test_part_dir_single_part_equals_dataset(tmp_path, capsys):
    from distmb.partition import partition_graph

    graph = load_dataset(SMALL)
    partition_graph(graph, 1, tmp_path / "p1")
    from_dataset = _losses(tmp_path, "ds", ["--dataset", SMALL, *FAST, "--epochs", "2"], capsys)
    from_parts = _losses(
        tmp_path, "pd", ["--part-dir", str(tmp_path / "p1"), *FAST, "--epochs", "2"], capsys
    )
    assert from_parts == from_dataset
    partition_graph(graph, 2, tmp_path / "p2")
    code, _, err = run(["--part-dir", str(tmp_path / "p2"), *FAST, "--epochs", "1"], capsys)
    assert code == 2 and "has 2 parts" in err and "mpirun -np 2" in err


def test_corrupt_partition_is_refused_unless_verification_is_off(tmp_path, capsys):
    from distmb.partition import partition_graph

    partition_graph(load_dataset(SMALL), 1, tmp_path / "p")
    path = tmp_path / "p" / "part-0" / "features.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # one flipped byte: trains a wrong model without verification
    path.write_bytes(bytes(data))
    argv = ["--part-dir", str(tmp_path / "p"), *FAST, "--epochs", "1"]
    code, out, err = run(argv, capsys)
    assert code == 2 and "part-0/features.npy: sha256 does not match" in err
    assert "epoch" not in out and "Traceback" not in err
    assert run([*argv, "--no-verify"], capsys)[0] == 0


@pytest.mark.slow
def test_cora_fused_kernels_match_torch_accuracy(cora_dir):
    seeds = (0, 1, 2, 3, 4)
    spec = f"planetoid:{cora_dir}"
    fused = _median_test_acc(spec, TrainConfig(**CORA_SAGE, kernels="fused"), seeds)
    torch_ = _median_test_acc(spec, TrainConfig(**CORA_SAGE, kernels="torch"), seeds)
    assert abs(fused - torch_) <= 0.015, (fused, torch_)
    assert min(fused, torch_) >= 0.78


# ---- output paths, checked before any work -----------------------------------------------


def test_results_parent_directories_are_created(tmp_path, capsys):
    results = tmp_path / "runs" / "deep" / "gat.jsonl"
    code, _, err = run(
        ["--dataset", SMALL, *FAST, "--epochs", "1", "--results", str(results)], capsys
    )
    assert code == 0, err
    assert len(results.read_text().splitlines()) == 1


@pytest.mark.parametrize(
    ("make", "flag", "message"),
    [
        (lambda p: p.mkdir(), "--results", "is a directory, expected a file"),
        (lambda p: p.write_text("x"), "--checkpoint-dir", "exists and is not a directory"),
    ],
)
def test_unusable_output_paths_fail_before_training(tmp_path, capsys, make, flag, message):
    target = tmp_path / "out"
    make(target)
    code, out, err = run(["--dataset", SMALL, *FAST, "--epochs", "1", flag, str(target)], capsys)
    assert code == 2 and f"{flag} {target}" in err and message in err
    assert "Traceback" not in err and "epoch" not in out  # refused before any training


def test_existing_checkpoint_is_not_replaced_without_being_asked(tmp_path, capsys):
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    base = ["--dataset", SMALL, *FAST, "--epochs", "1", *ckpt]
    assert run(base, capsys)[0] == 0
    first = (tmp_path / "ckpt" / CHECKPOINT_FILE).read_bytes()
    code, out, err = run([*base, "--seed", "5"], capsys)
    assert code == 2 and "already holds a checkpoint" in err and "--overwrite-checkpoint" in err
    assert (tmp_path / "ckpt" / CHECKPOINT_FILE).read_bytes() == first and "epoch" not in out
    assert run([*base, "--seed", "5", "--overwrite-checkpoint"], capsys)[0] == 0
    assert (tmp_path / "ckpt" / CHECKPOINT_FILE).read_bytes() != first


# ---- resume that tells the truth ---------------------------------------------------------


def test_resume_applies_a_new_lr_and_says_so(tmp_path, capsys):
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    base = ["--dataset", SMALL, *FAST, *ckpt]
    assert run([*base, "--epochs", "1", "--lr", "0.003"], capsys)[0] == 0
    code, out, err = run([*base, "--epochs", "2", "--resume", "--lr", "0.5"], capsys)
    assert code == 0, err
    assert "resume: applied --lr 0.003 -> 0.5" in out
    state = torch.load(tmp_path / "ckpt" / CHECKPOINT_FILE, weights_only=True)
    assert state["epoch"] == 1
    assert all(g["lr"] == 0.5 for g in state["optimizer"]["param_groups"])


@pytest.mark.parametrize(
    ("flag", "value"), [("--seed", "7"), ("--batch-size", "50"), ("--dropout", "0.1")]
)
def test_resume_refuses_options_that_change_the_run(tmp_path, capsys, flag, value):
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    base = ["--dataset", SMALL, *FAST, *ckpt]
    assert run([*base, "--epochs", "1"], capsys)[0] == 0
    code, _, err = run([*base, "--epochs", "2", "--resume", flag, value], capsys)
    assert code == 2 and f"was trained with {flag} " in err and "Traceback" not in err


def test_resuming_a_finished_run_says_so(tmp_path, capsys):
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    base = ["--dataset", SMALL, *FAST, *ckpt]
    assert run([*base, "--epochs", "2"], capsys)[0] == 0
    code, out, _ = run([*base, "--epochs", "1", "--resume"], capsys)
    assert code == 0 and "nothing to train" in out and "epochs 0-1" in out
    assert "epoch   " not in out


def test_resume_drops_records_written_after_the_last_checkpoint(tmp_path, capsys):
    """A run killed after writing epoch 2's record but before its checkpoint: the resumed run
    trains epoch 2 again and the results file holds every epoch once."""
    from distmb.engine.stats import drop_records_from

    results = tmp_path / "r.jsonl"
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    base = ["--dataset", SMALL, *FAST, *ckpt, "--results", str(results)]
    assert run([*base, "--epochs", "2"], capsys)[0] == 0
    with open(results, "a") as f:  # what the killed run left: epoch 2, then a torn line
        f.write(json.dumps({"epoch": 2, "loss": 1.0}) + "\n" + '{"epoch": 3, "lo')
    code, out, _ = run([*base, "--epochs", "4", "--resume"], capsys)
    assert code == 0 and "dropped 2 record(s) of epochs >= 2" in out
    epochs = [json.loads(line)["epoch"] for line in results.read_text().splitlines()]
    assert epochs == [0, 1, 2, 3]
    # Another run's records before them are kept; nothing to drop is a no-op.
    assert drop_records_from(results, 4) == 0
    assert drop_records_from(tmp_path / "missing.jsonl", 0) == 0


def test_stale_temporary_files_are_removed_by_the_next_run(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    dead = ckpt / ".checkpoint.pt.tmp-999999999"  # no such process
    dead.write_bytes(b"half a checkpoint")
    code, _, err = run(
        ["--dataset", SMALL, *FAST, "--epochs", "1", "--checkpoint-dir", str(ckpt)], capsys
    )
    assert code == 0, err
    assert not dead.exists() and (ckpt / CHECKPOINT_FILE).is_file()


# ---- runs that are easy to follow --------------------------------------------------------


def test_each_run_has_an_id_kept_by_its_resume(tmp_path, capsys):
    """Two runs into one --results file stay apart (the report draws the last by default,
    each with --all-runs); a resumed run keeps the id and start time of the run it
    continues."""
    from distmb.cli.report import read_records, split_runs

    results = tmp_path / "r.jsonl"
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    base = ["--dataset", SMALL, *FAST, "--results", str(results)]
    assert run([*base, "--epochs", "1"], capsys)[0] == 0
    assert run([*base, "--epochs", "1", *ckpt], capsys)[0] == 0
    assert run([*base, "--epochs", "2", *ckpt, "--resume"], capsys)[0] == 0
    records = read_records(results)
    assert all(r["run_id"] and r["started"].endswith("Z") for r in records)
    runs = split_runs(records)
    assert [[r["epoch"] for r in run_] for run_ in runs] == [[0], [0, 1]]
    assert runs[1][0]["started"] == runs[1][1]["started"]
    assert runs[0][0]["run_id"] != runs[1][0]["run_id"]
    assert report_main([str(results)]) == 0
    assert "holds 2 runs; drawing the last" in capsys.readouterr().out
    assert report_main([str(results), "--all-runs"]) == 0
    first = tmp_path / f"r.jsonl.{runs[0][0]['run_id']}.png"
    assert first.read_bytes()[:4] == b"\x89PNG" and (tmp_path / "r.jsonl.png").is_file()


def test_console_scripts_are_installed():
    import shutil
    import sys
    from pathlib import Path

    bin_dir = Path(sys.executable).parent
    for name in ("distmb-train", "distmb-report", "distmb-partition"):
        assert (bin_dir / name).is_file() or shutil.which(name), name
