"""Several ranks on the GPU path (docs/cuda.md, "Several GPUs").

On CPU-only machines the path runs on CPU tensors with ``--sampler device`` under a real
``mpiexec -n 2/3``: the device HEC (``DeviceHistoricalCache``) on the training device, the
halo filtering of device blocks, ``--no-hec`` and ``--exact-remote``, and ``--comm torch``
(gloo): the bucketed gradient all-reduce and the HEC push over ``all_to_all_single``. The
``cuda``-marked tests run the same on GPUs (NCCL needs one GPU per rank).
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from conftest import TIMING_KEYS
from test_comm_torch import ACC_NOISE, HIT_RATE_NOISE
from test_distributed import (  # noqa: F401 (fixture)
    FAST,
    SCRIPTS,
    launch_runs,
    mpirun,
    small_parts,
)

from distmb.comm.mpienv import local_rank_from_env
from distmb.core.errors import InputError
from distmb.engine.device import resolve_comm, shares_gpu

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
DEVICE_PATH = ["--sampler", "device"]


def _train(ranks: int, part_dir, tmp_path, name: str, *extra: str) -> tuple[list[dict], str]:
    results = tmp_path / f"{name}.jsonl"
    argv = ["-m", "distmb.train", "--part-dir", str(part_dir), *FAST, "--epochs", "3",
            "--results", str(results), *extra]  # fmt: skip
    proc = mpirun(ranks, argv, 240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows], proc.stdout


def _train_in_one_launch(
    ranks: int, part_dir, tmp_path, runs: dict[str, list[str]]
) -> dict[str, tuple[list[dict], str]]:
    """:func:`_train`'s runs (name -> extra flags), one after the other in one launch."""
    argvs = {
        name: ["--part-dir", str(part_dir), *FAST, "--epochs", "3",
               "--results", str(tmp_path / f"{name}.jsonl"), *extra]
        for name, extra in runs.items()
    }  # fmt: skip
    outputs = launch_runs(ranks, argvs, tmp_path, 240 * len(runs))
    out = {}
    for name, stdout in outputs.items():
        rows = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        out[name] = ([{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows], stdout)
    return out


def _close_hit_rates(a: list[dict], b: list[dict]) -> None:
    for ra, rb in zip(a, b, strict=True):
        for layer, (x, y) in enumerate(zip(ra["hec_hit_rate"], rb["hec_hit_rate"], strict=True)):
            if x is None or y is None:  # a layer without lookups (replicated features)
                assert x is y, (layer, x, y)
            else:
                assert abs(x - y) <= HIT_RATE_NOISE, (ra["epoch"], layer, x, y)


# ---- which GPU and which library -------------------------------------------------------------


def test_local_rank_comes_from_the_launcher():
    assert local_rank_from_env({}) is None
    assert local_rank_from_env({"SLURM_LOCALID": "3"}) == 3
    assert local_rank_from_env({"MPI_LOCALRANKID": "1", "SLURM_LOCALID": "3"}) == 1
    assert local_rank_from_env({"OMPI_COMM_WORLD_LOCAL_RANK": "2", "MPI_LOCALRANKID": "1"}) == 2
    with pytest.raises(ValueError, match="SLURM_LOCALID='x'"):
        local_rank_from_env({"SLURM_LOCALID": "x"})


@pytest.mark.parametrize("ranks", [2, 3])
def test_local_rank_split_agrees_with_the_launcher(ranks):
    proc = mpirun(ranks, [str(SCRIPTS / "local_rank.py")], 60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "environment and split agree" in proc.stdout


def test_comm_auto_and_shared_gpus():
    assert resolve_comm("auto", CPU) == "mpi"
    assert resolve_comm("auto", CUDA) == "torch"
    assert resolve_comm("torch", CPU) == "torch" and resolve_comm("mpi", CUDA) == "mpi"
    assert resolve_comm("auto", CUDA, shared_gpu=True) == "mpi"  # NCCL: one rank per GPU
    with pytest.raises(InputError, match="--comm torch: several ranks train on one GPU"):
        resolve_comm("torch", CUDA, shared_gpu=True)
    assert shares_gpu([("a", "g0"), ("a", "g0")])
    assert not shares_gpu([("a", "g0"), ("a", "g1"), ("b", "g0")])


# ---- training ----------------------------------------------------------------------------------


def _run_hit_rates(runs: list[list[dict]]) -> list[float]:
    """Per layer: HEC hits over lookups pooled over runs, epochs and ranks."""
    per_rank = [p for rows in runs for r in rows for p in r["per_rank"]]
    hits = [sum(v) for v in zip(*(p["hec_hits"] for p in per_rank), strict=True)]
    looks = [sum(v) for v in zip(*(p["hec_lookups"] for p in per_rank), strict=True)]
    return [h / n for h, n in zip(hits, looks, strict=True) if n]


#: Runs of the sampler comparison: 3 seeds of 5 epochs of small batches. One such run knows
#: its hit rate to about a point and a half (1200-4000 lookups per layer), and the two
#: samplers' runs differ by up to about 2.3 points either way (measured over seeds 0-2);
#: pooled over the 3 seeds the rates are within the issue's 2 points.
SAMPLER_RUN = ["--epochs", "5", "--batch-size", "50"]
SAMPLER_SEEDS = (0, 1, 2)


@pytest.mark.parametrize("ranks", [2, 3])
def test_device_path_trains_like_the_cpp_path(small_parts, tmp_path, ranks):  # noqa: F811
    """Other sampler draws, the same distribution: mean accuracy within the multi-rank
    noise, HEC hit rates per layer within 2 points (pooled over seeds); the device HEC is
    the one in use."""
    runs: dict[str, list[list[dict]]] = {"cpp": [], "device": []}
    flags = {
        f"{sampler}{seed}": [*SAMPLER_RUN, "--sampler", sampler, "--seed", str(seed)]
        for seed in SAMPLER_SEEDS
        for sampler in runs
    }
    trained = _train_in_one_launch(ranks, small_parts[ranks], tmp_path, flags)
    for seed in SAMPLER_SEEDS:
        for sampler, rows in runs.items():
            records, out = trained[f"{sampler}{seed}"]
            rows.append(records)
            # HistoricalEmbeddingScheme.describe: the device cache's tables (not the C++ path's)
            assert ("on cpu (--hec-size" in out) == (sampler == "device"), out
            assert all(r["bytes_pushed"] > 0 for r in records)

    def mean_acc(key: str, sampler: str) -> float:
        return sum(rows[-1][key] for rows in runs[sampler]) / len(SAMPLER_SEEDS)

    for key in ("val_acc", "test_acc"):
        assert abs(mean_acc(key, "cpp") - mean_acc(key, "device")) <= ACC_NOISE, key
    rates_cpp, rates_dev = _run_hit_rates(runs["cpp"]), _run_hit_rates(runs["device"])
    assert len(rates_cpp) == len(rates_dev) == 2
    for a, b in zip(rates_cpp, rates_dev, strict=True):
        assert abs(a - b) <= HIT_RATE_NOISE, (rates_cpp, rates_dev)


def test_device_path_torch_equals_mpi_on_two_ranks(small_parts, tmp_path):  # noqa: F811
    """2 ranks: every collective adds a + b, so --comm torch (bucketed all-reduce, push over
    all_to_all_single) and the unbucketed all-reduce give the MPI run's records to the bit."""
    runs = _train_in_one_launch(2, small_parts[2], tmp_path, {
        "mpi": [*DEVICE_PATH, "--comm", "mpi"],
        "torch": [*DEVICE_PATH, "--comm", "torch"],
        "flat": [*DEVICE_PATH, "--comm", "torch", "--grad-bucket-mb", "0"],
    })  # fmt: skip
    (mpi, _), (tch, out), (flat, _) = runs["mpi"], runs["torch"], runs["flat"]
    assert "in buckets during the backward pass" in out
    assert mpi == tch == flat


def test_device_path_torch_and_mpi_agree_on_three_ranks(small_parts, tmp_path):  # noqa: F811
    runs = _train_in_one_launch(3, small_parts[3], tmp_path, {
        "mpi": [*DEVICE_PATH, "--comm", "mpi"],
        "torch": [*DEVICE_PATH, "--comm", "torch"],
    })  # fmt: skip
    (mpi, _), (tch, _) = runs["mpi"], runs["torch"]
    assert abs(mpi[-1]["val_acc"] - tch[-1]["val_acc"]) <= ACC_NOISE
    _close_hit_rates(mpi, tch)


@pytest.mark.parametrize("comm", ["mpi", "torch"])
def test_device_path_without_hec_and_exact(small_parts, tmp_path, comm):  # noqa: F811
    """--no-hec and --exact-remote on the GPU path: nothing pushed without the HEC; the exact
    baseline moves its bytes and fills no cache."""
    runs = _train_in_one_launch(2, small_parts[2], tmp_path, {
        "drop": [*DEVICE_PATH, "--comm", comm, "--no-hec"],
        "exact": [*DEVICE_PATH, "--comm", comm, "--exact-remote"],
    })  # fmt: skip
    (drop, _), (exact, _) = runs["drop"], runs["exact"]
    assert all(r["bytes_pushed"] == 0 and r["bytes_exact_remote"] == 0 for r in drop)
    assert all(r["bytes_exact_remote"] > 0 and r["bytes_pushed"] == 0 for r in exact)
    assert all(0.0 <= r["test_acc"] <= 1.0 for r in drop + exact)


@pytest.mark.parametrize("comm", ["mpi", "torch"])
def test_device_path_resume_is_bit_identical_with_the_device_hec(small_parts, tmp_path, comm):  # noqa: F811
    base = [*DEVICE_PATH, "--comm", comm, "--eval-every", "1"]
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    # The uninterrupted run and the first half share a launch; the resumed half starts in a
    # fresh launch (nothing but the checkpoint carries over).
    runs = _train_in_one_launch(2, small_parts[2], tmp_path, {
        "straight": [*base, "--epochs", "4"],
        "first": [*base, "--epochs", "2", *ckpt],
    })  # fmt: skip
    (straight, _), (first, _) = runs["straight"], runs["first"]
    second, out = _train(2, small_parts[2], tmp_path, "second", *base, "--epochs", "4", *ckpt,
                         "--resume")  # fmt: skip
    assert "caches start empty" not in out  # the device caches' lines were restored
    drop = {"run_id", "started"}
    assert [{k: v for k, v in r.items() if k not in drop} for r in first + second] == [
        {k: v for k, v in r.items() if k not in drop} for r in straight
    ]
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("hec-*.npz")) == [
        "hec-epoch3-rank0.npz",
        "hec-epoch3-rank1.npz",
    ]


def test_failing_rank_aborts_the_device_path_with_torch(small_parts):  # noqa: F811
    start = time.monotonic()
    proc = mpirun(2, [str(SCRIPTS / "fail_rank.py"), str(small_parts[2]), *DEVICE_PATH,
                      "--comm", "torch"], 90)  # fmt: skip
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "[rank 1] failed" in proc.stderr and "injected failure on rank 1" in proc.stderr
    assert elapsed < 60, f"the job took {elapsed:.0f}s to die"


# ---- on GPUs -------------------------------------------------------------------------------------


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.cuda
def test_cuda_two_ranks_share_one_gpu(small_parts, tmp_path):  # noqa: F811
    """Two ranks on one GPU: --comm auto falls back to MPI (NCCL wants one rank per GPU);
    the device HEC lives on the GPU; training reaches the CPU GPU-path's accuracy."""
    env_gpu = ["--device", "cuda:0"]
    gpu, out = _train(2, small_parts[2], tmp_path, "gpu", *env_gpu)
    cpu, _ = _train(2, small_parts[2], tmp_path, "cpu", *DEVICE_PATH)
    assert "shared by several ranks" in out and "on cuda:0 (--hec-size" in out
    assert abs(gpu[-1]["val_acc"] - cpu[-1]["val_acc"]) <= ACC_NOISE
    assert gpu[-1]["hec_hit_rate"] == pytest.approx(cpu[-1]["hec_hit_rate"], abs=HIT_RATE_NOISE)


@pytest.mark.cuda
@pytest.mark.skipif(_gpus() < 2, reason="NCCL needs one GPU per rank: two GPUs")
def test_cuda_two_gpus_nccl_equals_mpi(small_parts, tmp_path):  # noqa: F811
    nccl, out = _train(2, small_parts[2], tmp_path, "nccl", "--device", "cuda", "--comm", "torch")
    mpi, _ = _train(2, small_parts[2], tmp_path, "mpi", "--device", "cuda", "--comm", "mpi")
    assert "nccl" in out
    assert abs(nccl[-1]["val_acc"] - mpi[-1]["val_acc"]) <= ACC_NOISE
    _close_hit_rates(nccl, mpi)


@pytest.mark.cuda
@pytest.mark.skipif(_gpus() < 2, reason="NCCL needs one GPU per rank: two GPUs")
def test_cuda_nccl_push_holds_the_push_contract():
    proc = mpirun(2, [str(SCRIPTS / "push_contract.py"), "cuda", "torch"], 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "push contract holds: torch, delay 2, on 2 ranks" in proc.stdout
