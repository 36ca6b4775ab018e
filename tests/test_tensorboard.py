"""``--tensorboard DIR``: the JSON record's numbers as TensorBoard scalars (rank 0), read back
with TensorBoard's own EventAccumulator; a clear error when the package is missing."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import FAST_FLAGS, SMALL

from distmb.cli.train import main as train_main
from distmb.engine.tensorboard import record_scalars


def _run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = train_main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def test_record_scalars_flattens_every_number():
    record = {
        "epoch": 4, "loss": 0.5, "iterations": 3, "hec_hit_rate": [0.25, None],
        "feature_cache": {"hit_rate": 0.75, "policy": "lru"}, "dataset": "cora",
        "converged": True,
    }  # fmt: skip
    assert dict(record_scalars(record)) == {
        "loss": 0.5, "iterations": 3.0, "hec_hit_rate/0": 0.25, "feature_cache/hit_rate": 0.75,
    }  # fmt: skip


def test_missing_package_is_one_line_naming_the_flag_and_pip(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    code, err = _run(
        ["--dataset", SMALL, *FAST_FLAGS, "--epochs", "1", "--tensorboard", str(tmp_path / "tb")],
        capsys,
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--tensorboard needs the tensorboard package" in err and "pip install tensorboard" in err
    assert not (tmp_path / "tb").exists()  # refused before any work


def test_event_file_holds_the_records_scalars(tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="optional: pip install tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    results, board = tmp_path / "r.jsonl", tmp_path / "tb"
    argv = ["--dataset", SMALL, *FAST_FLAGS, "--epochs", "2", "--results", str(results),
            "--tensorboard", str(board)]  # fmt: skip
    code, err = _run(argv, capsys)
    assert code == 0, err
    records = [json.loads(line) for line in results.read_text().splitlines()]
    events = EventAccumulator(str(board), size_guidance={"scalars": 0})
    events.Reload()
    expected = {tag for r in records for tag, _ in record_scalars(r)}
    assert set(events.Tags()["scalars"]) == expected
    for tag in ("loss", "train_acc", "val_acc", "test_acc", "epoch_time", "samples_per_s"):
        assert tag in expected
    for record in records:
        for tag, value in record_scalars(record):
            (event,) = [e for e in events.Scalars(tag) if e.step == record["epoch"]]
            assert event.value == pytest.approx(value, rel=1e-6), tag  # stored as float32
