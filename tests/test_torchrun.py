"""Multi-rank runs started by ``torchrun`` (no MPI at all:
:class:`distmb.comm.TorchGroup`)
against the same runs under a real ``mpiexec``, and the exchanges of ``--exact-remote`` and
exact evaluation over torch.distributed (``--comm torch``, gloo on the CPU) against MPI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SMALL, TIMING_KEYS
from test_comm_torch import ACC_NOISE, HIT_RATE_NOISE, TORCH_LINE
from test_distributed import (  # noqa: F401 (fixture)
    FAST,
    SCRIPTS,
    launch_runs,
    mpirun,
    small_parts,
)

from distmb.comm.mpienv import MPI_LAUNCH_MARKERS, is_torchrun_launch
from distmb.core.errors import InputError
from distmb.engine.device import check_comm_launch, resolve_comm

#: The trainer's log line that says the ranks were started without MPI.
TORCHRUN_LINE = "(started by torchrun, without MPI)"
#: What torchrun sets in each worker (values as in a 2-worker job).
TORCHRUN_ENV = {
    "TORCHELASTIC_RUN_ID": "none",
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}


def torchrun(n: int, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --standalone --nproc_per_node N ARGS`` (a script or
    ``-m module``, then its arguments); fail (never hang) after ``timeout`` seconds."""
    env = {k: v for k, v in os.environ.items() if k not in MPI_LAUNCH_MARKERS}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(n), *args]  # fmt: skip
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def records(path: Path) -> list[dict]:
    """The run's records without timings (they differ between any two runs)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def train_argv(part_dir: Path, results: Path, *flags: str) -> list[str]:
    return ["-m", "distmb.train", "--part-dir", str(part_dir), *FAST, "--epochs", "3",
            "--results", str(results), *flags]  # fmt: skip


def train_torchrun(n: int, part_dir: Path, results: Path, *flags: str) -> tuple[list[dict], str]:
    proc = torchrun(n, train_argv(part_dir, results, *flags), 180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return records(results), proc.stdout


def train_mpiexec(n: int, part_dir: Path, results: Path, *flags: str) -> tuple[list[dict], str]:
    proc = mpirun(n, train_argv(part_dir, results, *flags), 180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return records(results), proc.stdout


# ---- the launch ----------------------------------------------------------------------------


def test_torchrun_is_recognised_from_its_environment() -> None:
    assert is_torchrun_launch(TORCHRUN_ENV)
    assert is_torchrun_launch({"TORCHELASTIC_RUN_ID": "x"})
    env_only = {k: v for k, v in TORCHRUN_ENV.items() if k != "TORCHELASTIC_RUN_ID"}
    assert is_torchrun_launch(env_only)  # env:// set by hand
    assert not is_torchrun_launch({})
    assert not is_torchrun_launch({"RANK": "0", "WORLD_SIZE": "2"})  # no rendezvous address
    assert not is_torchrun_launch({**env_only, "MASTER_PORT": ""})
    for marker in MPI_LAUNCH_MARKERS:  # an MPI job stays one, whatever else it exports
        assert not is_torchrun_launch({**TORCHRUN_ENV, marker: "0"})


def test_comm_mpi_is_refused_without_mpi() -> None:
    cpu = torch.device("cpu")
    with pytest.raises(InputError, match="--comm mpi: this job was started by torchrun"):
        check_comm_launch("mpi", "torchrun")
    with pytest.raises(InputError, match="--comm mpi"):
        resolve_comm("mpi", cpu, launcher="torchrun")
    check_comm_launch("mpi", "mpi")  # fine under an MPI launcher
    assert resolve_comm("auto", cpu, launcher="torchrun") == "torch"
    assert resolve_comm("torch", cpu, launcher="torchrun") == "torch"
    assert resolve_comm("auto", cpu, launcher="mpi") == "mpi"
    gpu = torch.device("cuda", 0)  # a device object only: nothing runs on it
    with pytest.raises(InputError, match="one rank per GPU"):
        resolve_comm("auto", gpu, shared_gpu=True, launcher="torchrun")  # no MPI to fall to
    assert resolve_comm("auto", gpu, shared_gpu=True, launcher="mpi") == "mpi"


def test_comm_mpi_under_torchrun_stops_the_job_naming_the_flag(small_parts, tmp_path):  # noqa: F811
    start = time.monotonic()
    proc = torchrun(2, train_argv(small_parts[2], tmp_path / "r.jsonl", "--comm", "mpi"), 90)
    assert proc.returncode != 0
    # Every rank refuses the flag alike: rank 0 alone prints it (distmb.cli.usage).
    line = "distmb.train: error: --comm mpi: this job was started by torchrun, without MPI"
    assert proc.stderr.count(line) == 1, proc.stderr[-2000:]
    assert "epoch" not in proc.stdout and not (tmp_path / "r.jsonl").exists()
    assert time.monotonic() - start < 60


def test_failing_rank_ends_the_torchrun_job(small_parts):  # noqa: F811
    """Rank 1 raises in its second epoch: its message reaches stderr, it exits, torchrun stops
    rank 0 (waiting in a collective) and the job fails within seconds."""
    start = time.monotonic()
    proc = torchrun(2, [str(SCRIPTS / "fail_rank.py"), str(small_parts[2])], 90)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "distmb.train: [rank 1] failed: RuntimeError: injected failure on rank 1" in (
        proc.stderr
    )
    assert elapsed < 60, f"the job took {elapsed:.0f}s to die"


# ---- training: torchrun against mpiexec ------------------------------------------------------


def test_two_ranks_under_torchrun_equal_mpiexec_with_comm_torch(small_parts, tmp_path):  # noqa: F811
    """The same group operations in the same order: losses, accuracies, HEC hit rates and
    bytes to the bit."""
    mpi, out_mpi = train_mpiexec(2, small_parts[2], tmp_path / "m.jsonl", "--comm", "torch")
    run, out = train_torchrun(2, small_parts[2], tmp_path / "t.jsonl")
    assert TORCH_LINE in out and TORCHRUN_LINE in out and TORCHRUN_LINE not in out_mpi
    assert run == mpi and len(run) == 3
    assert all(r["bytes_pushed"] > 0 for r in run)


def test_three_ranks_under_torchrun_reach_mpiexecs_accuracy(small_parts, tmp_path):  # noqa: F811
    mpi, _ = train_mpiexec(3, small_parts[3], tmp_path / "m.jsonl", "--comm", "torch")
    run, _ = train_torchrun(3, small_parts[3], tmp_path / "t.jsonl")
    assert len(mpi) == len(run) == 3
    assert abs(mpi[-1]["val_acc"] - run[-1]["val_acc"]) <= ACC_NOISE
    for a, b in zip(mpi, run, strict=True):
        for hit_a, hit_b in zip(a["hec_hit_rate"], b["hec_hit_rate"], strict=True):
            assert (hit_a is None) == (hit_b is None)
            if hit_a is not None:
                assert abs(hit_a - hit_b) <= HIT_RATE_NOISE


# ---- exact exchanges over torch.distributed ------------------------------------------------


def test_exact_remote_over_torch_equals_mpi(small_parts, tmp_path):  # noqa: F811
    """--exact-remote: remote sampling and feature fetch over the torch group train the same
    model as over MPI, to the bit (the same bytes move), under mpiexec and under torchrun."""
    flags = ("--exact-remote",)
    paths = {"mpi": tmp_path / "m.jsonl", "torch": tmp_path / "t.jsonl"}
    outs = launch_runs(  # both mpiexec runs in one launch (train_argv without "-m distmb.train")
        2,
        {k: train_argv(small_parts[2], path, *flags, "--comm", k)[2:] for k, path in paths.items()},
        tmp_path,
        180,
    )
    mpi, over_torch, out = records(paths["mpi"]), records(paths["torch"]), outs["torch"]
    run, _ = train_torchrun(2, small_parts[2], tmp_path / "r.jsonl", *flags)
    assert TORCH_LINE in out
    assert all(r["bytes_exact_remote"] > 0 and r["bytes_pushed"] == 0 for r in mpi)
    assert over_torch == mpi and run == mpi


def test_exact_evaluation_over_torch_equals_the_full_graph_reference(small_parts):  # noqa: F811
    """Layer-wise exact evaluation with its halo exchanges over the torch group (mpiexec with
    --comm torch, and torchrun) against the float64 full-graph forward (as the MPI twin in
    test_distributed)."""
    argv = [str(SCRIPTS / "eval_reference.py"), str(small_parts[2]), SMALL]
    for proc in (mpirun(2, [*argv, "torch"], 120), torchrun(2, argv, 120)):
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "evaluation equals the full-graph reference on 2 rank(s)" in proc.stdout


# ---- distmb.predict ------------------------------------------------------------------------


def test_predict_under_torchrun_writes_what_mpiexec_writes(small_parts, tmp_path):  # noqa: F811
    """A checkpoint trained under torchrun, predicted on 2 ranks under torchrun and under
    mpiexec (halo exchanges and the gathering of rows to rank 0 over gloo vs MPI): the
    same files, byte for byte."""
    ckpt = tmp_path / "ckpt"
    train = train_argv(small_parts[2], tmp_path / "r.jsonl", "--checkpoint-dir", str(ckpt))
    proc = torchrun(2, train, 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    base = ["-m", "distmb.predict", "--checkpoint", str(ckpt), "--embeddings", "--out"]
    by_torchrun, by_mpi = tmp_path / "torchrun", tmp_path / "mpi"
    proc = torchrun(2, [*base, str(by_torchrun)], 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("predicted 3000 vertices") == 1  # rank 0 alone prints
    proc = mpirun(2, [*base, str(by_mpi)], 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("embeddings-layer0.npy", "logits.npy", "predictions.npy"):
        np.testing.assert_array_equal(
            np.load(by_torchrun / name, allow_pickle=False),
            np.load(by_mpi / name, allow_pickle=False),
        )


# ---- teardown --------------------------------------------------------------------------------


@pytest.mark.parametrize("launcher", ["torchrun", "mpiexec"])
def test_group_teardown_frees_the_gloo_threads(launcher: str) -> None:
    """The group is freed at ``close_torch_distributed`` even though an optimizer (importing
    ``torch._dynamo``) was built after it: its gloo threads are gone before the interpreter
    exits. A group kept alive by a module's default argument let a gloo thread free a
    collective during finalization and abort rank 0 at exit, now and then (SIGABRT)."""
    script = [str(SCRIPTS / "group_teardown.py")]
    proc = torchrun(2, script, 90) if launcher == "torchrun" else mpirun(2, script, 90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = [  # the ranks' lines may interleave
        tuple(map(int, m)) for m in re.findall(r"threads (\d+) -> (\d+) -> (\d+)", proc.stdout)
    ]
    assert len(counts) == 2, proc.stdout
    for before, opened, after in counts:
        assert opened > before, "the group started no threads: nothing is measured"
        assert after <= before, f"threads {before} -> {opened} -> {after}: the group lives on"
