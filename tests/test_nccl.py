"""NCCL as far as one GPU allows: world size 1 under ``torchrun --nproc_per_node 1``.

The ``cuda``-marked tests initialise NCCL and run every collective the device path sends over
it, on device tensors: the gradient all-reduce (flat, and in buckets during the backward
pass), the all-to-all-v of the HEC pushes, of ``--exact-remote`` and of the halo exchange
(with the count exchange before each), and the group's teardown barrier
(``tests/mpi_scripts/comm_contract.py`` ``torch-nccl`` and ``push_contract.py cuda torch``);
then a training run of the device path with ``--device cuda --comm torch``. The small
collectives (allgather, broadcast, barrier, scalar reductions) go over the gloo group beside
the NCCL one and are checked in the same jobs. What one GPU cannot show (two ranks over NCCL)
is listed in docs/cuda.md, "What one GPU tests of NCCL".

The CPU twins run the same scripts under torchrun at world size 1 on gloo, so the scripts'
torchrun path runs in CI too.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from conftest import FAST_FLAGS
from test_comm_torch import ACC_NOISE, TORCH_LINE
from test_distributed import SCRIPTS, small_parts  # noqa: F401 (fixture)
from test_torchrun import TORCHRUN_LINE, records, torchrun

#: What the trainer logs when its gradient all-reduce goes over NCCL at world size 1.
NCCL_LINE = "(1 ranks, nccl; in buckets during the backward pass)"


def comm_contract(impl: str) -> None:
    proc = torchrun(1, [str(SCRIPTS / "comm_contract.py"), impl], 180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"contract holds: {impl} on 1 ranks" in proc.stdout, proc.stdout[-2000:]


def push_contract(device: str) -> None:
    proc = torchrun(1, [str(SCRIPTS / "push_contract.py"), device, "torch"], 180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for delay in (1, 2):
        assert f"push contract holds: torch, delay {delay}, on 1 ranks" in proc.stdout


# ---- NCCL on the GPU -----------------------------------------------------------------------


@pytest.mark.cuda
def test_cuda_nccl_world1_holds_the_comm_contract():
    comm_contract("torch-nccl")


@pytest.mark.cuda
def test_cuda_nccl_world1_holds_the_push_contract():
    push_contract("cuda")


@pytest.mark.cuda
def test_cuda_nccl_world1_trains_the_device_path(small_parts, tmp_path):  # noqa: F811
    """The gradient all-reduce of every step goes over NCCL (one rank: the average is the
    rank's own gradient), and training reaches a plain one-process run's accuracy."""
    flags = [*FAST_FLAGS, "--epochs", "2", "--device", "cuda", "--threads", "2"]
    argv = ["-m", "distmb.train", "--part-dir", str(small_parts[1]), *flags]
    proc = torchrun(1, [*argv, "--comm", "torch", "--results", str(tmp_path / "nccl.jsonl")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert TORCH_LINE in proc.stdout and NCCL_LINE in proc.stdout and TORCHRUN_LINE in proc.stdout
    nccl = records(tmp_path / "nccl.jsonl")
    assert all(r["per_rank"][0]["allreduce_calls"] == r["iterations"] > 0 for r in nccl)
    assert all(math.isfinite(r["loss"]) for r in nccl)
    single = subprocess.run(
        [sys.executable, *argv, "--results", str(tmp_path / "single.jsonl")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-3000:]
    alone = records(tmp_path / "single.jsonl")
    assert all(r["per_rank"][0]["allreduce_calls"] == 0 for r in alone)  # nothing to reduce
    assert abs(nccl[-1]["val_acc"] - alone[-1]["val_acc"]) <= ACC_NOISE


# ---- the same scripts on the CPU (gloo) ----------------------------------------------------


def test_torchrun_world1_gloo_holds_the_comm_contract():
    comm_contract("torch")


def test_torchrun_world1_gloo_holds_the_push_contract():
    push_contract("cpu")
