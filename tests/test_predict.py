"""distmb.predict: predictions, logits and embeddings from a checkpoint, on one rank and under a
real ``mpiexec -n 2`` (gathered and per part), against the trainer's own evaluation and an
independent float64 full-graph forward pass; bad input."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FAST_FLAGS, SMALL, run_cli
from test_distributed import mpirun

from distmb.cli.predict import build_parser
from distmb.cli.predict import main as predict_main
from distmb.cli.train import main as train_main
from distmb.config.train import TrainConfig
from distmb.data import Graph, load_dataset
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.checkpoint import CHECKPOINT_FILE
from distmb.engine.evaluate import layerwise_inference
from distmb.engine.predict import predict
from distmb.partition import partition_graph

EPOCHS = ["--epochs", "3", "--threads", "1"]
#: The trainer's options of the runs below, as a TrainConfig.
CONFIG = dict(layers=2, fanout=(4, 4), hidden=16, batch_size=100, progress=False, threads=1)
DOCS = Path(__file__).resolve().parents[1] / "docs" / "predict.md"


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """``python -m distmb.predict ARGV`` in this process: (exit code, stdout, stderr)."""
    return run_cli(predict_main, argv, capsys)


def sage_reference(graph: Graph, state: dict[str, torch.Tensor], layers: int) -> list[np.ndarray]:
    """Every layer's output of GraphSAGE (mean aggregator) with the weights ``state``, in
    float64 over the whole graph's in-edges (scatter-mean), by ``VID_o``; independent of the
    blocks, kernels and halo exchanges under test."""
    n = graph.num_nodes
    dst = torch.from_numpy(np.repeat(np.arange(n), np.diff(graph.indptr)))
    src = torch.from_numpy(np.asarray(graph.indices, dtype=np.int64))
    deg = torch.bincount(dst, minlength=n).clamp(min=1).double().unsqueeze(1)
    h = torch.from_numpy(graph.features).double()
    weights = {k: v.double() for k, v in state.items()}
    outputs = []
    for layer in range(layers):
        mean = torch.zeros(n, h.shape[1], dtype=torch.float64).index_add_(0, dst, h[src]) / deg
        w_n = weights[f"layers.{layer}.fc_neigh.weight"]
        w_s = weights[f"layers.{layer}.fc_self.weight"]
        h = mean @ w_n.T + h @ w_s.T + weights[f"layers.{layer}.bias"]
        if layer < layers - 1:
            h = torch.relu(h)
        outputs.append(h.numpy())
    return outputs


def assert_matches_reference(logits: np.ndarray, predictions: np.ndarray, reference: np.ndarray):
    """float32 logits within 1e-4 of the float64 reference; the predicted class is the
    reference's arg-max wherever its two best classes are more than 1e-4 apart."""
    np.testing.assert_allclose(logits, reference, rtol=1e-4, atol=1e-4)
    top2 = np.sort(reference, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-4
    assert clear.mean() > 0.99
    np.testing.assert_array_equal(predictions[clear], reference.argmax(axis=1)[clear])


def split_accuracy(predictions: np.ndarray, graph: Graph) -> dict[str, float]:
    splits = {"train": graph.train_idx, "val": graph.val_idx, "test": graph.test_idx}
    return {
        name: float((predictions[idx] == graph.labels[idx]).mean()) for name, idx in splits.items()
    }


@pytest.fixture(scope="module")
def graph() -> Graph:
    return load_dataset(SMALL)


@pytest.fixture(scope="module")
def one_rank_run(tmp_path_factory) -> tuple[Path, list[dict]]:
    """3 epochs on one rank with a checkpoint: (checkpoint dir, epoch records)."""
    root = tmp_path_factory.mktemp("one")
    ckpt, results = root / "ckpt", root / "run.jsonl"
    argv = ["--dataset", SMALL, *FAST_FLAGS, *EPOCHS, "--checkpoint-dir", str(ckpt)]
    assert train_main([*argv, "--results", str(results)]) == 0
    return ckpt, [json.loads(line) for line in results.read_text().splitlines()]


@pytest.fixture(scope="module")
def two_parts(tmp_path_factory, graph) -> Path:
    out = tmp_path_factory.mktemp("parts") / "p2"
    partition_graph(graph, 2, out, seed=0)
    return out


# ---- one rank ----------------------------------------------------------------------------


def test_one_rank_round_trip_equals_the_trainers_evaluation(one_rank_run, graph, tmp_path, capsys):
    ckpt, records = one_rank_run
    out = tmp_path / "pred"
    code, stdout, err = run(
        ["--checkpoint", str(ckpt), "--dataset", SMALL, "--out", str(out), "--embeddings"], capsys
    )
    assert code == 0, err
    manifest = json.loads((out / "predict.json").read_text())
    logits = np.load(out / "logits.npy", mmap_mode="r")
    predictions = np.load(out / "predictions.npy", mmap_mode="r")
    embedding = np.load(out / "embeddings-layer0.npy", mmap_mode="r")
    assert logits.dtype == np.float32 and logits.shape == (graph.num_nodes, graph.num_classes)
    assert predictions.dtype == np.int64 and embedding.shape == (graph.num_nodes, 16)
    assert manifest["files"] == ["embeddings-layer0.npy", "logits.npy", "predictions.npy"]
    assert manifest["num_nodes"] == graph.num_nodes and manifest["checkpoint_epoch"] == 2

    # The trainer's own exact evaluation of the same checkpoint (resumed into a Trainer).
    trainer = Trainer(
        LocalGraph.from_graph(graph),
        TrainConfig(**CONFIG, epochs=3, checkpoint_dir=str(ckpt), resume=True),
        log=lambda _: None,
    )
    evaluation = trainer.evaluate()
    assert evaluation["val_acc"] == records[-1]["val_acc"] == manifest["accuracy"]["val"]
    assert evaluation["test_acc"] == records[-1]["test_acc"] == manifest["accuracy"]["test"]
    expected = layerwise_inference(
        trainer.model, trainer.features, trainer.sampler, trainer.cfg.eval_batch_size
    ).numpy()
    np.testing.assert_array_equal(logits, expected)  # bit for bit

    # Independently: the float64 full-graph forward pass, and accuracies from the files.
    state = torch.load(ckpt / CHECKPOINT_FILE, weights_only=True)["model"]
    hidden, final = sage_reference(graph, state, 2)
    np.testing.assert_allclose(embedding, hidden, rtol=1e-4, atol=1e-4)
    assert_matches_reference(logits, predictions, final)
    assert manifest["accuracy"] == pytest.approx(split_accuracy(np.asarray(predictions), graph))

    (line,) = stdout.strip().splitlines()  # one summary line
    assert line.startswith(f"predicted {graph.num_nodes} vertices (4 classes)")
    assert re.search(r"train \d+\.\d\d%  val \d+\.\d\d%  test \d+\.\d\d%", line)
    assert str(out) in line


def test_gat_predictions_equal_the_trainers_evaluation(graph, tmp_path, capsys):
    """GAT: logits bit for bit as the trainer evaluates the checkpoint; the hidden layer's
    embeddings are its output, ``hidden x heads`` wide (heads concatenated)."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "pred"
    gat = ["--model", "gat", "--heads", "2", "--hidden", "8"]
    argv = ["--dataset", SMALL, *FAST_FLAGS, *gat, "--epochs", "1", "--threads", "1"]
    assert train_main([*argv, "--checkpoint-dir", str(ckpt)]) == 0
    code, _, err = run(["--checkpoint", str(ckpt), "--out", str(out), "--embeddings"], capsys)
    assert code == 0, err
    config = {**CONFIG, "hidden": 8}
    trainer = Trainer(
        LocalGraph.from_graph(graph),
        TrainConfig(**config, model="gat", heads=2, checkpoint_dir=str(ckpt), resume=True),
        log=lambda _: None,
    )
    hidden: list[np.ndarray] = []
    expected = layerwise_inference(
        trainer.model,
        trainer.features,
        trainer.sampler,
        trainer.cfg.eval_batch_size,
        on_layer=lambda layer, rows: hidden.append(rows.numpy().copy()),
    ).numpy()
    np.testing.assert_array_equal(np.load(out / "logits.npy"), expected)
    embedding = np.load(out / "embeddings-layer0.npy")
    assert embedding.shape == (graph.num_nodes, 16)
    np.testing.assert_array_equal(embedding, hidden[0])
    np.testing.assert_array_equal(np.load(out / "predictions.npy"), expected.argmax(axis=1))


@pytest.mark.parametrize("kind", ["row", "standard"])
def test_predict_normalises_features_as_the_run_did(graph, tmp_path, capsys, kind):
    """A run trained with --normalize-features: predict applies the checkpoint's normalisation
    (for standard: the training rows' mean and std), checked against the float64 reference
    on features normalised by numpy."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "pred"
    argv = ["--dataset", SMALL, *FAST_FLAGS, "--epochs", "1", "--threads", "1"]
    norm = ["--normalize-features", kind]
    assert train_main([*argv, *norm, "--checkpoint-dir", str(ckpt)]) == 0
    code, _, err = run(["--checkpoint", str(ckpt), "--out", str(out)], capsys)
    assert code == 0, err
    x = graph.features.astype(np.float64)
    if kind == "row":
        sums = x.sum(axis=1, keepdims=True)
        x = np.divide(x, sums, out=np.zeros_like(x), where=sums != 0)
    else:
        train = x[graph.train_idx]
        std = train.std(axis=0)
        x = (x - train.mean(axis=0)) / np.where(std > 0, std, 1.0)
    normalised = dataclasses.replace(graph, features=x.astype(np.float32))
    state = torch.load(ckpt / CHECKPOINT_FILE, weights_only=True)["model"]
    _, final = sage_reference(normalised, state, 2)
    assert_matches_reference(np.load(out / "logits.npy"), np.load(out / "predictions.npy"), final)


def test_predict_reads_the_table_as_the_run_stored_it(graph, tmp_path, capsys):
    """A run with --feature-dtype bfloat16: predict stores the table as the checkpoint says,
    so its logits are the float64 reference's on the bfloat16-rounded features."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "pred"
    argv = ["--dataset", SMALL, *FAST_FLAGS, "--epochs", "1", "--threads", "1",
            "--feature-dtype", "bfloat16", "--checkpoint-dir", str(ckpt)]  # fmt: skip
    assert train_main(argv) == 0
    code, _, err = run(["--checkpoint", str(ckpt), "--out", str(out)], capsys)
    assert code == 0, err
    x = torch.from_numpy(graph.features).to(torch.bfloat16).float().numpy()
    state = torch.load(ckpt / CHECKPOINT_FILE, weights_only=True)["model"]
    _, final = sage_reference(dataclasses.replace(graph, features=x), state, 2)
    assert_matches_reference(np.load(out / "logits.npy"), np.load(out / "predictions.npy"), final)


def test_python_api_returns_the_arrays_without_writing(one_rank_run, graph, tmp_path):
    ckpt, _ = one_rank_run
    written = predict(ckpt, dataset=SMALL, out=tmp_path / "a", log=lambda _: None)
    in_memory = predict(
        ckpt / CHECKPOINT_FILE, dataset=SMALL, embeddings=True, batch_size=97, log=lambda _: None
    )
    assert in_memory.out is None and in_memory.files == [] and in_memory.manifest is not None
    np.testing.assert_array_equal(in_memory.predictions, written.predictions)
    np.testing.assert_allclose(in_memory.logits, written.logits, rtol=1e-6, atol=1e-6)
    assert len(in_memory.embeddings) == 1 and written.embeddings == []
    assert in_memory.accuracy == written.accuracy
    assert isinstance(written.logits, np.memmap)  # memory-mapped from the written file


def test_overwrite_replaces_an_earlier_prediction(one_rank_run, tmp_path, capsys):
    ckpt, _ = one_rank_run
    out = tmp_path / "pred"
    base = ["--checkpoint", str(ckpt), "--dataset", SMALL, "--out", str(out)]
    assert run([*base, "--embeddings"], capsys)[0] == 0
    code, _, err = run(base, capsys)
    assert code == 2 and "already holds a prediction" in err and "--overwrite" in err
    assert run([*base, "--overwrite"], capsys)[0] == 0
    # No embeddings asked for this time: the earlier run's file is gone, not left stale.
    assert sorted(p.name for p in out.iterdir()) == [
        "logits.npy",
        "predict.json",
        "predictions.npy",
    ]


# ---- bad input ---------------------------------------------------------------------------


def test_missing_or_damaged_checkpoint(tmp_path, capsys):
    out = ["--dataset", SMALL, "--out", str(tmp_path / "o")]
    code, _, err = run(["--checkpoint", str(tmp_path / "nope"), *out], capsys)
    assert code == 2 and f"--checkpoint {tmp_path / 'nope'}: no such file or directory" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run(["--checkpoint", str(tmp_path / "empty"), *out], capsys)
    assert code == 2 and "holds no checkpoint.pt" in err
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    code, _, err = run(["--checkpoint", str(tmp_path / "bad.pt"), *out], capsys)
    assert code == 2 and "--checkpoint: " in err and "not a readable checkpoint" in err
    assert "Traceback" not in err


def test_checkpoint_of_another_dataset_is_refused_naming_both(one_rank_run, tmp_path, capsys):
    ckpt, _ = one_rank_run
    other = SMALL.replace("feat_dim=16", "feat_dim=8")
    code, _, err = run(
        ["--checkpoint", str(ckpt), "--dataset", other, "--out", str(tmp_path / "o")], capsys
    )
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "was trained on 'synthetic' (3000 vertices, 16 features, 4 classes" in err
    assert f"--dataset {other} is 'synthetic' (3000 vertices, 8 features, 4 classes" in err
    assert "feat_dim" in err
    assert not (tmp_path / "o" / "predict.json").exists()


def test_out_that_is_a_file_is_refused_before_any_work(one_rank_run, tmp_path, capsys):
    ckpt, _ = one_rank_run
    target = tmp_path / "out"
    target.write_text("x")
    code, out, err = run(["--checkpoint", str(ckpt), "--out", str(target)], capsys)
    assert code == 2 and f"--out {target}: exists and is not a directory" in err
    assert out == ""  # nothing loaded or predicted


def test_per_part_needs_an_output_directory(one_rank_run):
    with pytest.raises(Exception, match="--per-part writes files: give --out DIR"):
        predict(one_rank_run[0], dataset=SMALL, per_part=True)


def test_every_flag_is_documented():
    text = DOCS.read_text()
    flags = [a.option_strings[-1] for a in build_parser()._actions if a.option_strings]
    missing = [f for f in flags if f != "--help" and f"`{f}" not in text]
    assert not missing, f"docs/predict.md lacks {missing}"


# ---- two ranks ---------------------------------------------------------------------------


def test_two_rank_checkpoint_predicts_alike_on_two_ranks_and_on_one(
    two_parts, graph, tmp_path, capsys
):
    """Train on 2 ranks; predict on 2 ranks (gathered, and per part) and on one rank over
    the whole dataset: the same classes in original id order, logits equal to the float64
    full-graph reference, accuracies equal to the training run's final evaluation."""
    ckpt, results = tmp_path / "ckpt", tmp_path / "run.jsonl"
    train = ["--part-dir", str(two_parts), *FAST_FLAGS, *EPOCHS, "--checkpoint-dir", str(ckpt)]
    proc = mpirun(2, ["-m", "distmb.train", *train, "--results", str(results)], 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = json.loads(results.read_text().splitlines()[-1])

    base = ["-m", "distmb.predict", "--checkpoint", str(ckpt), "--embeddings"]
    gathered, per_part, single = tmp_path / "gathered", tmp_path / "per-part", tmp_path / "one"
    proc = mpirun(2, [*base, "--out", str(gathered)], 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("predicted 3000 vertices") == 1  # rank 0 alone prints
    proc = mpirun(2, [*base, "--out", str(per_part), "--per-part"], 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    code, _, err = run(
        ["--checkpoint", str(ckpt), "--dataset", SMALL, "--embeddings", "--out", str(single)],
        capsys,
    )
    assert code == 0, err

    def load(directory: Path, name: str) -> np.ndarray:
        return np.load(directory / name, allow_pickle=False)

    # Per part: each rank's rows with their original ids; together every vertex once.
    manifest = json.loads((per_part / "predict.json").read_text())
    assert manifest["layout"] == "per-part" and [p["dir"] for p in manifest["parts"]] == [
        "part-0",
        "part-1",
    ]
    names = ["embeddings-layer0.npy", "logits.npy", "predictions.npy"]
    assembled = {name: np.zeros_like(load(gathered, name)) for name in names}
    covered = np.zeros(graph.num_nodes, dtype=int)
    for part in manifest["parts"]:
        ids = load(per_part / part["dir"], "orig_ids.npy")
        assert ids.size == part["rows"]
        covered[ids] += 1
        for name in names:
            assembled[name][ids] = load(per_part / part["dir"], name)
    assert (covered == 1).all()
    for name in names:  # the same computation, split differently
        np.testing.assert_array_equal(assembled[name], load(gathered, name))

    reference = sage_reference(
        graph, torch.load(ckpt / CHECKPOINT_FILE, weights_only=True)["model"], 2
    )
    for directory in (gathered, single):
        predictions = load(directory, "predictions.npy")
        assert_matches_reference(load(directory, "logits.npy"), predictions, reference[1])
        np.testing.assert_allclose(
            load(directory, "embeddings-layer0.npy"), reference[0], rtol=1e-4, atol=1e-4
        )
        accuracy = json.loads((directory / "predict.json").read_text())["accuracy"]
        assert accuracy["val"] == final["val_acc"] and accuracy["test"] == final["test_acc"]
        assert accuracy == pytest.approx(split_accuracy(predictions, graph))
    np.testing.assert_array_equal(
        load(gathered, "predictions.npy"), load(single, "predictions.npy")
    )


def test_one_rank_checkpoint_predicts_on_two_ranks(one_rank_run, two_parts, tmp_path, capsys):
    ckpt, records = one_rank_run
    out, single = tmp_path / "two", tmp_path / "one"
    argv = ["-m", "distmb.predict", "--checkpoint", str(ckpt), "--part-dir", str(two_parts)]
    proc = mpirun(2, [*argv, "--out", str(out)], 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert run(["--checkpoint", str(ckpt), "--out", str(single)], capsys)[0] == 0
    np.testing.assert_array_equal(
        np.load(out / "predictions.npy"), np.load(single / "predictions.npy")
    )
    np.testing.assert_allclose(
        np.load(out / "logits.npy"), np.load(single / "logits.npy"), rtol=1e-5, atol=1e-5
    )
    accuracy = json.loads((out / "predict.json").read_text())["accuracy"]
    assert accuracy["test"] == records[-1]["test_acc"]


def test_dataset_on_two_ranks_is_refused(one_rank_run, tmp_path):
    argv = ["-m", "distmb.predict", "--checkpoint", str(one_rank_run[0]), "--dataset", SMALL]
    proc = mpirun(2, [*argv, "--out", str(tmp_path / "o")], 60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "predicts on one rank; under mpirun -np 2 give --part-dir" in proc.stderr


def test_distmb_predict_is_callable_whichever_import_came_first(one_rank_run, tmp_path):
    """``distmb.predict`` is the function and also the module of ``python -m distmb.predict``:
    after ``import distmb.predict`` the package's attribute is the module, which must still
    predict."""
    import distmb
    import distmb.predict as module

    ckpt, records = one_rank_run
    assert callable(distmb.predict)
    result = distmb.predict(ckpt, dataset=SMALL)
    assert result.accuracy["val"] == records[-1]["val_acc"]
    assert module.predict is not None
