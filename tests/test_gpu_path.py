"""The GPU path wired into training (``--device``, ``--sampler device``; docs/cuda.md).

On CPU-only machines the path runs on CPU tensors with ``--sampler device`` (the PyTorch-ops
sampler, the device feature cache, Match-Reorder): it must train as well as the C++ path,
resume bit-identically and report its cache. The ``cuda``-marked tests run the same on a GPU.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import FAST_FLAGS, SMALL, TIMING_KEYS, run_train_cli

from distmb.config.train import TrainConfig, parse_config
from distmb.core.errors import InputError
from distmb.data import load_dataset
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.device import check_device_path, resolve_device, uses_device_path
from distmb.pipeline.minibatch import MiniBatch
from distmb.pipeline.sample import NeighborSampler

FAST = [*FAST_FLAGS, "--eval-every", "1"]
#: A graph on which two epochs of the small model separate learning from guessing.
LEARNABLE = (
    "synthetic:nodes=4000,avg_degree=10,feat_dim=16,classes=4,train_fraction=0.3,"
    "val_fraction=0.1,test_fraction=0.6"
)


#: ``python -m distmb.train ARGV`` in this process: (exit code, stdout, stderr).
run = run_train_cli


def records(tmp_path, name: str, argv: list[str], capsys) -> list[dict]:
    results = tmp_path / f"{name}.jsonl"
    code, _, err = run([*argv, "--results", str(results)], capsys)
    assert code == 0, err
    return [json.loads(line) for line in results.read_text().splitlines()]


def untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


# ---- --device and the flags of the GPU path ------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_a_clear_error(capsys):
    with pytest.raises(InputError, match=r"--device cuda: this torch .* CPU build.*CUDA build"):
        resolve_device("cuda")
    code, _, err = run(["--dataset", SMALL, *FAST, "--epochs", "1", "--device", "cuda"], capsys)
    assert code == 2 and "--device cuda" in err and "Traceback" not in err


def test_auto_picks_what_torch_sees():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "cuda:", "CPU", "cpu:0"])
def test_bad_device_values(value):
    with pytest.raises(InputError, match="--device must be cpu, cuda, cuda:N"):
        parse_config(["--device", value])


@pytest.mark.parametrize(
    "flags",
    [["--graph-placement", "host"], ["--match-reorder"], ["--device-cache-mb", "1"]],
)
def test_gpu_options_outside_the_device_path_are_refused(flags):
    with pytest.raises(InputError, match="appl(y|ies) only to the GPU path"):
        parse_config(flags)  # --device cpu with the C++ sampler: refused when parsed
    config = parse_config([*flags, "--device", "auto", "--sampler", "cpp"])
    if torch.cuda.is_available():
        return  # auto is cuda here: --sampler cpp on a GPU is refused instead
    with pytest.raises(InputError, match="appl(y|ies) only to the GPU path"):
        check_device_path(config, resolve_device("auto"))


def test_which_runs_take_the_device_path():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not uses_device_path(TrainConfig(), cpu)
    assert uses_device_path(TrainConfig(sampler="device"), cpu)
    assert uses_device_path(TrainConfig(device="cuda"), cuda)
    assert not uses_device_path(TrainConfig(device="cuda", sampler="cpp"), cuda)


@pytest.mark.parametrize("sampler", ["cpp", "device"])
def test_the_run_counts_per_epoch_what_its_data_path_has(sampler):
    """The C++ path on in-memory data has no cache to count; the device path's feature cache
    counts each epoch's gathers from zero and reports them as ``device_cache``: its lookups
    are the input rows of the epoch's batches (counted here from the batches themselves)."""
    from distmb.engine.build.counters import DeviceCacheCounters
    from distmb.engine.build.watchdog import NoWatchdog

    config = TrainConfig(
        layers=2, fanout=(3, 3), hidden=8, batch_size=200, epochs=1, progress=False,
        sampler=sampler, prefetch=0, threads=1,
    )  # fmt: skip
    local = LocalGraph.from_graph(load_dataset(SMALL))
    trainer = Trainer(local, config, log=lambda _: None, device=torch.device("cpu"))
    assert isinstance(trainer.watchdog, NoWatchdog)
    owners = trainer.parts.counters
    if sampler == "cpp":
        assert owners == [] and trainer.parts.device_stages is None
        return
    (owner,) = owners
    assert isinstance(owner, DeviceCacheCounters)
    rows = []
    loader = trainer.loader
    plan = loader.plan(0, trainer.epoch_batches(0))
    owner.reset_epoch_counters()
    assert trainer.parts.device_stages.features.counters()["lookups"] == 0
    for batch in loader(plan):
        rows.append(batch.blocks[0].n_src)
    record = owner.epoch_stats(trainer.comm)["device_cache"]
    assert record["lookups"] == sum(rows)
    assert record["hits"] + record["misses"] == record["lookups"]
    owner.reset_epoch_counters()
    assert owner.epoch_stats(trainer.comm)["device_cache"]["lookups"] == 0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (TrainConfig(sampler="device", graph_layout="ooc"), "--graph-layout ooc"),
        (TrainConfig(device="cuda", sampler="cpp"), "--sampler cpp: the C\\+\\+ sampler"),
    ],
)
def test_unsupported_combinations_name_the_flags(config, message):
    with pytest.raises(InputError, match=message):
        check_device_path(config, torch.device("cuda" if config.device == "cuda" else "cpu"))


# ---- moving a batch ------------------------------------------------------------------------


def _batch() -> MiniBatch:
    graph = load_dataset(SMALL)
    sampler = NeighborSampler(graph.indptr, graph.indices, graph.num_nodes, graph.num_nodes,
                              [3, 3], seed=0)  # fmt: skip
    seeds = graph.train_idx[:20]
    blocks = sampler.sample(seeds, 0, 0)
    x = torch.from_numpy(np.ascontiguousarray(graph.features[blocks[0].src_ids.numpy()]))
    return MiniBatch(0, 0, seeds, blocks, torch.from_numpy(graph.labels[seeds]), x=x)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_minibatch_to_moves_every_tensor_and_keeps_values(device):
    batch = _batch()
    expected = [(b.indptr.clone(), b.indices.clone(), b.src_ids.clone()) for b in batch.blocks]
    x, labels = batch.x.clone(), batch.labels.clone()
    moved = batch.to(device)
    assert moved is batch
    for block, (indptr, indices, src_ids) in zip(batch.blocks, expected, strict=True):
        assert block.device.type == device
        assert torch.equal(block.indptr.cpu(), indptr) and torch.equal(block.indices.cpu(), indices)
        assert torch.equal(block.src_ids.cpu(), src_ids)
        assert block.dst_of_edges().device.type == device
    assert batch.x.device.type == device and torch.equal(batch.x.cpu(), x)
    assert batch.labels.device.type == device and torch.equal(batch.labels.cpu(), labels)
    if device == "cpu":  # nothing to move: the same tensors
        assert batch.blocks[0].to("cpu") is batch.blocks[0]


# ---- training through the GPU path ---------------------------------------------------------


def test_device_sampler_path_learns_like_the_cpp_path(tmp_path, capsys):
    base = ["--dataset", LEARNABLE, *FAST, "--epochs", "4", "--prefetch", "0"]
    cpp = records(tmp_path, "cpp", base, capsys)
    device_path = records(tmp_path, "gpu", [*base, "--sampler", "device"], capsys)
    chance = 1 / 4
    for rows in (cpp, device_path):
        assert rows[-1]["loss"] < rows[0]["loss"]
        assert rows[-1]["test_acc"] > chance + 0.2, rows[-1]["test_acc"]
    # Other random choices, the same distribution: close accuracies, not equal ones.
    assert abs(device_path[-1]["test_acc"] - cpp[-1]["test_acc"]) < 0.1
    assert "device_cache" not in cpp[-1]
    cache = device_path[-1]["device_cache"]
    assert cache["policy"] == "presc" and cache["lookups"] == cache["hits"] + cache["misses"]
    assert cache["hit_rate"] == pytest.approx(cache["hits"] / cache["lookups"])


def test_device_cache_counts_add_up_and_match_saves_host_reads(tmp_path, capsys):
    base = ["--dataset", LEARNABLE, *FAST, "--epochs", "2", "--sampler", "device",
            "--device-cache-mb", "0.02", "--superbatch", "4"]  # fmt: skip
    plain = records(tmp_path, "plain", base, capsys)[-1]["device_cache"]
    match = records(tmp_path, "match", [*base, "--match-reorder"], capsys)[-1]["device_cache"]
    none = records(tmp_path, "none", [*base, "--device-cache-policy", "none"], capsys)
    none = none[-1]["device_cache"]
    assert none["hits"] == 0 and none["memory_bytes"] == 0
    assert 0 < plain["hits"] < plain["lookups"] and plain["rows_reused"] == 0
    # Match takes rows of the previous batch instead of reading them again.
    assert match["rows_reused"] > 0
    assert match["bytes_h2d"] < plain["bytes_h2d"]
    row_bytes = plain["bytes_h2d"] // plain["rows_loaded"]
    assert match["bytes_h2d"] == match["rows_loaded"] * row_bytes


@pytest.mark.parametrize("extra", [[], ["--match-reorder", "--superbatch", "3"]])
def test_device_path_resume_equals_straight_run(tmp_path, capsys, extra):
    base = ["--dataset", SMALL, *FAST, "--sampler", "device", *extra]
    straight = records(tmp_path, "straight", [*base, "--epochs", "4"], capsys)
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    first = records(tmp_path, "first", [*base, "--epochs", "2", *ckpt], capsys)
    second = records(tmp_path, "second", [*base, "--epochs", "4", *ckpt, "--resume"], capsys)
    drop = {"run_id", "started"}
    assert [r["loss"] for r in first + second] == [r["loss"] for r in straight]
    assert [{k: v for k, v in r.items() if k not in drop} for r in untimed(first + second)] == [
        {k: v for k, v in r.items() if k not in drop} for r in untimed(straight)
    ]


def test_device_path_with_prefetch_trains_identically(tmp_path, capsys):
    base = ["--dataset", SMALL, *FAST, "--sampler", "device", "--epochs", "2"]
    sync = untimed(records(tmp_path, "sync", [*base, "--prefetch", "0"], capsys))
    assert untimed(records(tmp_path, "ahead", [*base, "--prefetch", "2"], capsys)) == sync


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["device", "host"])
def test_cuda_training_learns_and_reports(tmp_path, capsys, placement):
    rows = records(
        tmp_path,
        "cuda",
        [
            "--dataset",
            LEARNABLE,
            *FAST,
            "--epochs",
            "4",
            "--device",
            "cuda",
            "--graph-placement",
            placement,
        ],  # fmt: skip
        capsys,
    )
    assert rows[-1]["test_acc"] > 0.25 + 0.2
    assert rows[-1]["device_cache"]["lookups"] > 0


@pytest.mark.cuda
def test_cuda_trainer_keeps_the_model_on_the_gpu():
    config = TrainConfig(**{"device": "cuda", "layers": 2, "fanout": (4, 4), "hidden": 16,
                            "batch_size": 100, "epochs": 1, "progress": False})  # fmt: skip
    trainer = Trainer(LocalGraph.from_graph(load_dataset(SMALL)), config, log=lambda _: None)
    assert all(p.device.type == "cuda" for p in trainer.model.parameters())
    record = trainer.train_epoch(0)
    assert np.isfinite(record["loss"])
    assert 0.0 <= trainer.evaluate()["test_acc"] <= 1.0
