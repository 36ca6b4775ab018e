"""Progress of long loops (distmb/core/progress.py): the rate/ETA arithmetic on a fake clock, the
choice of bar / lines / nothing, and the plain lines of a real run with stderr in a file."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMALL

from distmb.core import progress
from distmb.core.progress import (
    LINE_PATTERN,
    ProgressSettings,
    RateMeter,
    format_duration,
    meter,
)

ROOT = Path(__file__).resolve().parents[1]


class FakeClock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rate_and_eta_on_a_fake_clock():
    clock, lines = FakeClock(), []
    bar = RateMeter(
        "epoch 3", 10, "iterations", rate_unit="samples", every=3.0, write=lines.append,
        clock=clock,
    )  # fmt: skip
    assert bar.eta() is None and bar.rate() == 0.0
    clock.now += 4.0
    bar.update(2, items=200, loss="0.5000")  # 2 of 10 steps in 4 s: 2 s per step, 8 left
    assert bar.rate() == 50.0 and bar.eta() == 16.0
    assert lines == [
        "progress: epoch 3: 2/10 iterations (20.0%), 50.0 samples/s, elapsed 0:04, ETA 0:16, "
        "loss 0.5000"
    ]
    clock.now += 1.0  # 1 s after the last line: nothing
    bar.update(3, items=300)
    assert len(lines) == 1 and bar.eta() == pytest.approx(5.0)  # 5 s for 5 steps, 5 left
    clock.now += 2.0  # 3 s after the last line: one more
    bar.update(0, items=0)
    assert len(lines) == 2
    fields = LINE_PATTERN.match(lines[1]).groupdict()
    assert fields["done"] == "5" and fields["total"] == "10" and fields["percent"] == "50.0"
    assert float(fields["rate"]) == pytest.approx(500 / 7, abs=0.05)
    assert fields["eta"] == "0:07" and fields["extra"] == ", loss 0.5000"  # 7 s for 5, 5 left


def test_eta_never_negative_and_durations():
    clock = FakeClock()
    bar = RateMeter("x", 4, "MiB", every=1e9, write=lambda _: None, clock=clock)
    clock.now += 2
    bar.update(5)  # more than the total (a gzip's size is only an estimate of its reads)
    assert bar.eta() == 0.0
    assert [format_duration(s) for s in (0, 59.9, 61, 3600, 3725, -3)] == [
        "0:00", "0:59", "1:01", "1:00:00", "1:02:05", "0:00",
    ]  # fmt: skip


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_meter_picks_bar_lines_or_nothing():
    on = ProgressSettings(enabled=True, every=0.0)
    lines_on = ProgressSettings(enabled=True, every=1e-9)
    off = ProgressSettings(enabled=False, every=1e-9)
    plain, tty = io.StringIO(), _Tty()
    for options, stream in ((on, plain), (off, plain), (off, tty)):
        bar = meter("t", 3, "steps", options=options, stream=stream)
        bar.update(3)
        bar.close()
        assert stream.getvalue() == ""
    bar = meter("t", 3, "steps", options=lines_on, stream=plain)
    bar.update(1)
    assert LINE_PATTERN.match(plain.getvalue().splitlines()[0])
    bar = meter("t", 3, "steps", options=on, stream=tty)  # a terminal: tqdm's bar, no lines
    bar.update(1)
    bar.close()
    assert "progress:" not in tty.getvalue() and "\rt:   0%|" in tty.getvalue()  # one line


def test_ogb_parse_reports_progress(tmp_path, capsys, monkeypatch):
    from test_loaders import _write_ogb

    from distmb.data.datasets.ogb import load_ogb

    monkeypatch.setattr(progress, "_settings", ProgressSettings(enabled=True, every=1e-9))
    load_ogb(str(_write_ogb(tmp_path / "ogbn_tiny")))
    lines = capsys.readouterr().err.splitlines()
    parsed = {LINE_PATTERN.match(x)["label"]: LINE_PATTERN.match(x) for x in lines}
    assert {"parsing edge.csv.gz", "parsing node-feat.csv.gz"} <= set(parsed)
    edge = parsed["parsing edge.csv.gz"]
    size = (tmp_path / "ogbn_tiny" / "raw" / "edge.csv.gz").stat().st_size / 2**20
    assert (edge["unit"], float(edge["total"])) == ("MiB", pytest.approx(size, abs=0.05))


def test_training_writes_progress_lines_when_stderr_is_a_file(tmp_path):
    """A real run, stderr redirected to a file as under mpirun/srun: training and evaluation
    lines appear, parse, and count the run's iterations and vertices."""
    err = tmp_path / "stderr.txt"
    argv = [
        sys.executable, "-m", "distmb.train", "--dataset", SMALL, "--layers", "2", "--fanout",
        "4,4", "--hidden", "16", "--batch-size", "100", "--epochs", "2", "--threads", "1",
        "--eval-batch-size", "500", "--progress-every", "0.000001",
    ]  # fmt: skip
    with open(err, "w") as stderr:
        subprocess.run(argv, stderr=stderr, stdout=subprocess.DEVNULL, check=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})  # fmt: skip
    lines = [x for x in err.read_text().splitlines() if x.startswith("progress:")]
    parsed = [LINE_PATTERN.match(x) for x in lines]
    assert all(parsed), lines
    train = [m for m in parsed if m["label"].startswith("epoch ")]
    # SMALL: 3000 vertices, 10 % training -> 300 seeds in 3 batches of 100, per epoch.
    assert {m["label"] for m in train} == {"epoch 0", "epoch 1"}
    assert {(m["total"], m["unit"], m["rate_unit"]) for m in train} == {
        ("3", "iterations", "samples")
    }
    assert {m["done"] for m in train} == {"1", "2", "3"}
    assert all(m["extra"].startswith(", loss ") for m in train)
    last = [m for m in train if m["done"] == "3"]
    assert all(m["eta"] == "0:00" and m["percent"] == "100.0" for m in last)
    evaluation = [m for m in parsed if m["label"].startswith("evaluation layer")]
    assert {m["label"] for m in evaluation} == {"evaluation layer 1/2", "evaluation layer 2/2"}
    assert {m["total"] for m in evaluation} == {"3000"}
    assert {m["done"] for m in evaluation} == {str(k) for k in range(500, 3001, 500)}


def test_no_progress_and_zero_interval_print_no_lines(tmp_path):
    for flag in (["--no-progress"], ["--progress-every", "0"]):
        done = subprocess.run(
            [sys.executable, "-m", "distmb.train", "--dataset", SMALL, "--layers", "1",
             "--fanout", "2", "--hidden", "8", "--epochs", "1", "--threads", "1", *flag],
            capture_output=True, text=True, check=True, timeout=120,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert "progress:" not in done.stderr, flag


def test_progress_lines_come_from_rank_zero_alone(tmp_path):
    """Under a real ``mpiexec -n 2``: every training progress step is printed once (by rank
    0), not once per rank, and evaluation counts rank 0's part."""
    from test_distributed import mpirun

    from distmb.data import load_dataset
    from distmb.data.store.store import PartitionStore
    from distmb.partition import partition_graph

    parts = tmp_path / "p2"
    partition_graph(load_dataset(SMALL), 2, parts, seed=0)
    proc = mpirun(
        2,
        ["-m", "distmb.train", "--part-dir", str(parts), "--layers", "2", "--fanout", "4,4",
         "--hidden", "16", "--batch-size", "50", "--epochs", "1", "--threads", "1",
         "--progress-every", "0.000001"],
        120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    parsed = [LINE_PATTERN.match(x) for x in proc.stderr.splitlines() if x.startswith("progress:")]
    assert parsed and all(parsed)
    steps = [(m["label"], m["done"]) for m in parsed if m["label"].startswith("epoch ")]
    assert steps and len(steps) == len(set(steps)), steps  # no step printed twice
    evaluation = {m["total"] for m in parsed if m["label"].startswith("evaluation layer")}
    assert evaluation == {str(PartitionStore(parts, 0).n_solid)}
