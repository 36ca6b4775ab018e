"""Multi-rank behaviour under a real ``mpiexec -n 2/3/4`` (not mocked)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FAST_FLAGS, SMALL, TIMING_KEYS

from distmb.config import recipes
from distmb.config.train import TrainConfig
from distmb.data import Graph, load_dataset
from distmb.data.local import LocalGraph
from distmb.engine import Trainer, split_batches
from distmb.engine.checkpoint import CHECKPOINT_FILE
from distmb.partition import partition_graph

SCRIPTS = Path(__file__).parent / "mpi_scripts"
FAST = [*FAST_FLAGS, "--threads", "1"]
#: The environment of the launched ranks. MPIR_CVAR_ENABLE_HEAVY_YIELD: a rank waiting in a
#: blocking collective hands its core over (nanosleep) instead of spinning on sched_yield.
#: The tests run up to 4 ranks on 2 cores, where a spinning rank takes the core from the rank
#: that the others wait for (the 4-rank Cora accuracy launch: about 13 % less wall time, a
#: quarter of the system time). Scheduling only: the records are the same to the bit.
RANK_ENV = {"OMP_NUM_THREADS": "1", "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}


def mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.fail("mpiexec not found: install the mpich extra (pip install -e '.[mpich]')")
    return found


def mpirun(n: int, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``mpiexec -n N python ARGS``; fail (never hang) after ``timeout`` seconds."""
    env = {**os.environ, **RANK_ENV}
    return subprocess.run(
        [mpiexec(), "-n", str(n), sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def train_results(n: int, argv: list[str], results: Path, timeout: float = 180) -> list[dict]:
    proc = mpirun(n, ["-m", "distmb.train", *argv, "--results", str(results)], timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in results.read_text().splitlines()]


def launch_runs(
    n: int, runs: dict[str, list[str]], workdir: Path, timeout: float = 300
) -> dict[str, str]:
    """The ``python -m distmb.train`` runs ``runs`` (name -> flags), one after the other in
    one launch of ``n`` ranks (``mpi_scripts/train_runs.py``): one start-up for all of them.
    Every run must succeed. Returns each run's stdout: rank 0's lines of that run (and any
    other rank's that were printed meanwhile)."""
    runs_file = workdir / "runs.json"
    runs_file.write_text(json.dumps([{"name": k, "argv": v} for k, v in runs.items()]))
    proc = mpirun(n, [str(SCRIPTS / "train_runs.py"), str(runs_file)], timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    status = json.loads(Path(f"{runs_file}.status").read_text())
    assert list(status) == list(runs) and all(r["ok"] for r in status.values()), status
    outputs, rest = {}, proc.stdout
    for name in runs:  # rank 0 prints its END_OF_RUN line after its lines of the run
        outputs[name], sep, rest = rest.partition(f"run {name}: ")
        assert sep, f"no end-of-run line for {name}: {proc.stdout[-2000:]}"
    return outputs


@pytest.fixture(scope="module")
def small_parts(tmp_path_factory) -> dict[int, Path]:
    graph = load_dataset(SMALL)
    root = tmp_path_factory.mktemp("parts")
    out = {}
    for p in (1, 2, 3):
        out[p] = root / f"p{p}"
        partition_graph(graph, p, out[p], seed=0)
    return out


# ---- bad input and failures --------------------------------------------------------------


def test_parts_must_match_ranks(small_parts):
    start = time.monotonic()
    proc = mpirun(3, ["-m", "distmb.train", "--part-dir", str(small_parts[2]), *FAST], 60)
    assert proc.returncode != 0
    assert "has 2 parts but 3 ranks" in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - start < 60


def _rank1_opens(part_dir: Path, other: Path) -> subprocess.CompletedProcess:
    """2 ranks where rank 1 opens ``other`` instead of ``part_dir`` (node-local copies)."""
    script = (
        "import os, sys; from distmb.train import main; from mpi4py import MPI; "
        "d = sys.argv[1] if MPI.COMM_WORLD.rank == 0 else sys.argv[2]; "
        "sys.exit(main(['--part-dir', d, '--epochs', '1', '--no-progress']))"
    )
    return mpirun(2, ["-c", script, str(part_dir), str(other)], 60)


def test_partition_of_another_graph_on_one_rank(small_parts, tmp_path):
    other = tmp_path / "other"
    partition_graph(load_dataset(SMALL.replace("nodes=3000", "nodes=3100")), 2, other)
    proc = _rank1_opens(small_parts[2], other)
    assert proc.returncode != 0
    assert "opened a partition of another graph" in proc.stderr


def test_another_partitioning_of_the_same_graph_on_one_rank(small_parts, tmp_path):
    """Same graph, same part count and seed, another assignment (--method random): refused."""
    other = tmp_path / "random"
    partition_graph(load_dataset(SMALL), 2, other, method="random")
    proc = _rank1_opens(small_parts[2], other)
    assert proc.returncode != 0
    assert "opened a partition of another graph or partitioning" in proc.stderr


def test_unusable_results_path_stops_the_job_before_training(small_parts, tmp_path):
    (tmp_path / "r").mkdir()
    argv = ["--part-dir", str(small_parts[2]), *FAST, "--epochs", "5", "--results"]
    proc = mpirun(2, ["-m", "distmb.train", *argv, str(tmp_path / "r")], 60)
    assert proc.returncode != 0 and "is a directory, expected a file" in proc.stderr
    assert "epoch" not in proc.stdout


def test_cache_size_is_bounded_by_the_halo_and_a_pushless_schedule_is_reported(
    small_parts, tmp_path
):
    """The default --hec-size (1M lines) is clamped to the part's halo vertices (nothing else
    is ever pushed to it); an epoch of M <= d iterations, where no push can start, says so."""
    from distmb.data import PartitionStore

    n_halo = PartitionStore(small_parts[2], 0).n_halo
    argv = ["--part-dir", str(small_parts[2]), *FAST, "--epochs", "2"]
    out = launch_runs(2, {"one": [*argv, "--batch-size", "100000"], "many": argv}, tmp_path)
    assert f"HEC cs={n_halo} (--hec-size 1000000" in out["one"] and 0 < n_halo < 10**6
    assert out["one"].count("warning: HEC: an epoch has 1 iteration(s)") == 1
    assert "warning" not in out["many"]


def test_failing_rank_aborts_the_job(small_parts):
    start = time.monotonic()
    proc = mpirun(2, [str(SCRIPTS / "fail_rank.py"), str(small_parts[2])], 90)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "[rank 1] failed" in proc.stderr and "injected failure on rank 1" in proc.stderr
    assert elapsed < 60, f"the job took {elapsed:.0f}s to die"


def test_huge_hec_delay_allocates_nothing_up_front(small_parts, tmp_path):
    """--hec-delay 10**9 used to build 10**9 + 1 push buffer sets at start (the job was
    killed for memory); buffers are now made when a push first needs them."""
    proc = mpirun(
        2, ["-m", "distmb.train", "--part-dir", str(small_parts[2]), *FAST, "--epochs", "1",
            "--hec-delay", str(10**9)], 90,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "not more than --hec-delay 1000000000" in proc.stdout + proc.stderr


def _alive(marker: str) -> list[int]:
    """PIDs of processes whose command line contains ``marker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_text():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def test_stopped_rank_aborts_the_job_naming_it(small_parts):
    """A rank stopped by SIGSTOP (no heartbeats, no progress) mid-run: the others wait in a
    collective past --collective-timeout, then the job is aborted with a line naming rank 1
    (not a hang at 100 % CPU), and no process is left behind."""
    timeout = 2.0
    start = time.monotonic()
    proc = mpirun(
        3, [str(SCRIPTS / "quiet_rank.py"), str(small_parts[3]), "stop", str(timeout)], 90
    )
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "collective watchdog: rank 0 has waited" in proc.stderr, proc.stderr[-2000:]
    assert "rank 1 sent no heartbeat for" in proc.stderr
    assert "rank 2 sent no heartbeat" not in proc.stderr  # rank 2 is alive
    assert "Traceback" not in proc.stderr
    assert elapsed < 60, f"the job took {elapsed:.0f}s to die"
    time.sleep(0.5)
    assert not _alive(str(SCRIPTS / "quiet_rank.py")), "a stopped rank outlived the job"


def test_slow_rank_is_warned_about_not_killed(small_parts, tmp_path):
    """A rank that is slow but alive (heartbeats go on) for longer than the deadline: a
    warning naming the wait, and the job finishes normally."""
    timeout = 1.0
    proc = mpirun(
        2, [str(SCRIPTS / "quiet_rank.py"), str(small_parts[2]), "slow", str(timeout)], 90
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "warning: collective watchdog: rank 0 has waited" in proc.stderr
    assert "every peer still sends heartbeats (alive), behind: rank 1" in proc.stderr
    assert "Aborting" not in proc.stderr


# ---- equivalences ------------------------------------------------------------------------


def test_one_rank_equals_single_rank(small_parts, tmp_path):
    single = Trainer(
        LocalGraph.from_graph(load_dataset(SMALL)),
        TrainConfig(layers=2, fanout=(4, 4), hidden=16, batch_size=100, epochs=3, progress=False),
        log=lambda _: None,
    ).fit()
    multi = train_results(
        1, ["--part-dir", str(small_parts[1]), *FAST, "--epochs", "3"], tmp_path / "r.jsonl"
    )
    assert [r["loss"] for r in multi] == pytest.approx([r["loss"] for r in single], rel=1e-6)
    assert multi[-1]["test_acc"] == pytest.approx(single[-1]["test_acc"], abs=1e-9)


def _two_components(second_train_fraction: float = 1.0) -> Graph:
    """Two identical disjoint copies of a small synthetic graph (no edge between them); the
    second copy keeps the first ``second_train_fraction`` of its training vertices."""
    g = load_dataset("synthetic:nodes=400,avg_degree=6,feat_dim=8,classes=3")
    n = g.num_nodes
    n_train_second = int(round(second_train_fraction * g.train_idx.size))
    dst = np.repeat(np.arange(n), np.diff(g.indptr))
    src = np.concatenate([g.indices, g.indices + n])
    dst = np.concatenate([dst, dst + n])

    def twice(a):
        return np.concatenate([a, a + n])

    return Graph.from_edges(
        "twins",
        src,
        dst,
        2 * n,
        np.concatenate([g.features] * 2),
        np.concatenate([g.labels] * 2),
        np.concatenate([g.train_idx, g.train_idx[:n_train_second] + n]),
        twice(g.val_idx),
        twice(g.test_idx),
        g.num_classes,
    )


def _full_batch_runs(graph: Graph, part_dir: Path, ranks: int, batch: int, tmp: Path, *extra):
    """One rank on ``graph`` with one batch of all training vertices, and ``ranks`` ranks on
    ``part_dir`` with per-rank batch ``batch``: every neighbour, no dropout, 3 epochs, so
    both are deterministic. Returns (single trainer, multi-rank records, multi-rank model)."""
    config = dict(layers=2, fanout=(-1, -1), hidden=16, dropout=0.0, epochs=3, progress=False)
    single = Trainer(
        LocalGraph.from_graph(graph),
        TrainConfig(batch_size=graph.train_idx.size, **config),
        log=lambda _: None,
    )
    single.fit()
    flags = ["--layers", "2", "--fanout=-1,-1", "--hidden", "16", "--dropout", "0"]
    multi = train_results(
        ranks,
        [
            "--part-dir",
            str(part_dir),
            *flags,
            "--epochs",
            "3",
            "--batch-size",
            str(batch),
            "--no-progress",
            "--threads",
            "1",
            "--checkpoint-dir",
            str(tmp / "ckpt"),
            *extra,
        ],
        tmp / "r.jsonl",
    )
    model = torch.load(tmp / "ckpt" / CHECKPOINT_FILE, weights_only=True)["model"]
    return single, multi, model


def _assert_same_model(single: Trainer, model: dict) -> None:
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(model[name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_two_ranks_without_cut_equal_single_rank(tmp_path):
    graph = _two_components()
    meta = partition_graph(graph, 2, tmp_path / "p", replicate_halo_features=True)
    assert meta["edge_cut"] == 0
    single, multi, model = _full_batch_runs(
        graph, tmp_path / "p", 2, graph.train_idx.size // 2, tmp_path, "--no-hec"
    )
    assert [r["loss"] for r in multi] == pytest.approx(
        [r["loss"] for r in single.history], rel=1e-4
    )
    assert [r["test_acc"] for r in multi] == pytest.approx(
        [r["test_acc"] for r in single.history], abs=1e-6
    )
    _assert_same_model(single, model)


def test_unequal_parts_weigh_every_seed_equally(tmp_path):
    """Parts with 39 and 20 training vertices, one full batch each: the all-reduced gradient
    must be the mean over all 59 seeds (what one rank computes), not the mean of the two
    ranks' means, which would weigh the smaller part's seeds twice as much."""
    graph = _two_components(second_train_fraction=0.5)
    meta = partition_graph(
        graph, 2, tmp_path / "p", replicate_halo_features=True, train_tolerance=0.99
    )
    assert meta["edge_cut"] == 0
    train_counts = sorted(int(p["n_train"]) for p in meta["parts"])
    assert train_counts[1] >= 1.9 * train_counts[0], train_counts
    single, multi, model = _full_batch_runs(
        graph, tmp_path / "p", 2, train_counts[1], tmp_path, "--no-hec"
    )
    assert len(multi) == 3
    _assert_same_model(single, model)


@pytest.mark.parametrize("parts", [2, 3])
def test_exact_remote_equals_single_rank(small_parts, tmp_path, parts):
    """--exact-remote on a partition with cut edges and no replicated features: with every
    neighbour sampled, no dropout and one batch of all training vertices, P ranks must train
    exactly the model one rank trains on the whole graph (remote neighbourhoods, remote
    features and gradients through remote vertices all included)."""
    graph = load_dataset(SMALL)
    single, multi, model = _full_batch_runs(
        graph, small_parts[parts], parts, graph.train_idx.size, tmp_path, "--exact-remote"
    )
    assert all(r["bytes_exact_remote"] > 0 for r in multi)
    assert all(r["bytes_pushed"] == 0 for r in multi)
    _assert_same_model(single, model)


def test_batches_cover_each_rank_once_per_epoch():
    """split_batches: M batches, sizes within one of each other, a permutation of the input;
    fewer vertices than batches repeat one vertex per batch (never an empty batch)."""
    order = np.random.default_rng(0).permutation(23)
    batches = split_batches(order, 5)
    assert len(batches) == 5
    assert {b.size for b in batches} <= {4, 5}
    assert np.array_equal(np.concatenate(batches), order)
    few = split_batches(np.array([7, 3]), 5)
    assert [b.tolist() for b in few] == [[7], [3], [7], [3], [7]]
    with pytest.raises(ValueError):
        split_batches(np.array([], dtype=np.int64), 2)


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_evaluation_equals_an_independent_full_graph_forward(small_parts, parts, tmp_path):
    """Layer-wise exact evaluation across parts with cut edges (halo exchanges at every
    layer, and with replicated halo features at layer 0) against a float64 full-graph
    forward pass written with scatter-mean, not with the project's blocks or kernels."""
    dirs = [small_parts[parts]]
    if parts > 1:
        dirs.append(tmp_path / "replicated")
        partition_graph(load_dataset(SMALL), parts, dirs[-1], replicate_halo_features=True)
    joined = os.pathsep.join(map(str, dirs))  # both partitions in one launch
    proc = mpirun(parts, [str(SCRIPTS / "eval_reference.py"), joined, SMALL], 180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("evaluation equals the full-graph reference") == len(dirs)


@pytest.mark.parametrize("parts", [2, 3])
def test_aep_delivers_exactly_the_pushed_rows(small_parts, parts):
    proc = mpirun(parts, [str(SCRIPTS / "aep_exact.py"), str(small_parts[parts]), "2"], 180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "all equal" in proc.stdout


# ---- checkpoints -------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", [[], ["--no-hec"]])
def test_prefetch_gives_identical_multi_rank_training(small_parts, tmp_path, scheme):
    """2 ranks with the HEC (or without it): prefetching changes no loss, accuracy, hit
    rate or byte count."""
    argv = ["--part-dir", str(small_parts[2]), *FAST, "--epochs", "3", *scheme]
    prefetches = ("0", "2")
    results = {p: tmp_path / f"p{p}.jsonl" for p in prefetches}
    launch_runs(
        2, {p: [*argv, "--prefetch", p, "--results", str(results[p])] for p in prefetches}, tmp_path
    )
    runs = [
        [
            {k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS}
            for line in results[p].read_text().splitlines()
        ]
        for p in prefetches
    ]
    assert len(runs[0]) == 3 and runs[0] == runs[1]
    if not scheme:
        assert all(r["bytes_pushed"] > 0 for r in runs[0])


def test_killed_job_resumes_to_the_same_accuracy(small_parts, tmp_path):
    argv = ["--part-dir", str(small_parts[2]), *FAST, "--epochs", "30", "--eval-every", "30"]
    straight = train_results(2, argv, tmp_path / "straight.jsonl")
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, **RANK_ENV}
    job = subprocess.Popen(
        [
            mpiexec(),
            "-n",
            "2",
            sys.executable,
            "-m",
            "distmb.train",
            *argv,
            "--checkpoint-dir",
            str(ckpt),
            "--results",
            str(tmp_path / "killed.jsonl"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if (ckpt / "checkpoint.pt").exists():
            state = torch.load(ckpt / "checkpoint.pt", weights_only=True)
            if state["epoch"] >= 1:
                break
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait(30)
    resumed = train_results(
        2, [*argv, "--checkpoint-dir", str(ckpt), "--resume"], tmp_path / "resumed.jsonl"
    )
    assert resumed[0]["epoch"] >= 2
    assert resumed[-1]["epoch"] == 29
    # Model, optimizer, every rank's RNG state and every rank's cache lines are restored:
    # the resumed epochs repeat the uninterrupted run's exactly.
    by_epoch = {r["epoch"]: r for r in straight}
    for r in resumed:
        assert r["loss"] == pytest.approx(by_epoch[r["epoch"]]["loss"], rel=1e-6), r["epoch"]
        assert r["hec_hit_rate"] == by_epoch[r["epoch"]]["hec_hit_rate"], r["epoch"]
    assert resumed[-1]["test_acc"] == straight[-1]["test_acc"]
    assert sorted(p.name for p in ckpt.glob("hec-*.npz")) == [
        "hec-epoch29-rank0.npz",
        "hec-epoch29-rank1.npz",
    ]


def test_resume_refuses_other_rank_count(small_parts, tmp_path):
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    train_results(
        2, ["--part-dir", str(small_parts[2]), *FAST, "--epochs", "1", *ckpt], tmp_path / "a.jsonl"
    )
    proc = mpirun(
        3,
        [
            "-m",
            "distmb.train",
            "--part-dir",
            str(small_parts[3]),
            *FAST,
            "--epochs",
            "2",
            *ckpt,
            "--resume",
        ],
        60,
    )
    assert proc.returncode != 0 and "written by 2 ranks, this run has 3" in proc.stderr


def test_resume_with_other_halo_scheme_starts_with_empty_caches(small_parts, tmp_path):
    """A --no-hec checkpoint resumed with the HEC on: no cache state matches, so every rank
    starts empty (and says so) instead of failing."""
    base = ["--part-dir", str(small_parts[2]), *FAST, "--checkpoint-dir", str(tmp_path / "c")]
    train_results(2, [*base, "--epochs", "1", "--no-hec"], tmp_path / "a.jsonl")
    proc = mpirun(2, ["-m", "distmb.train", *base, "--epochs", "2", "--resume"], 60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("caches start empty") == 1
    assert "epoch   1" in proc.stdout


# ---- accuracy ----------------------------------------------------------------------------

#: Documented hyper-parameters (README, "Accuracy"): Cora as in tests/test_train.py; the
#: default synthetic graph with fewer, smaller batches than the paper's defaults so that the
#: 12 multi-rank runs stay within CI's time.
ACCURACY_CONFIGS = recipes.MULTI_RANK
_flags = recipes.as_flags


#: One rank's median test accuracy per dataset (computed once, shared by the rank counts).
_SINGLE_RANK_ACCURACY: dict[str, float] = {}


def _single_rank_accuracy(dataset: str, spec: str, seeds: tuple[int, ...]) -> float:
    if dataset not in _SINGLE_RANK_ACCURACY:
        cfg = ACCURACY_CONFIGS[dataset]
        local = LocalGraph.from_graph(load_dataset(spec))
        _SINGLE_RANK_ACCURACY[dataset] = statistics.median(
            Trainer(
                local,
                TrainConfig(**cfg, eval_every=cfg["epochs"], progress=False, seed=s),
                log=lambda _: None,
            ).fit()[-1]["test_acc"]
            for s in seeds
        )
    return _SINGLE_RANK_ACCURACY[dataset]


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("dataset", ["cora", "synthetic"])
def test_accuracy_multi_rank(cora_dir, tmp_path, dataset, ranks):
    spec = f"planetoid:{cora_dir}" if dataset == "cora" else "synthetic"
    cfg = ACCURACY_CONFIGS[dataset]
    # The protocol is the median of 3 seeds. That holds on the synthetic graph (24000
    # test vertices); on Cora one point is 10 test vertices and single runs spread over
    # 2-3 points, so the median of 3 would compare noise: Cora uses 10 seeds.
    seeds = recipes.MULTI_RANK_SEEDS[dataset]
    single = _single_rank_accuracy(dataset, spec, seeds)
    # Same global batch as the single rank (so the same number of optimizer steps): the
    # comparison isolates what partitioning and the HEC change. Every seed and mode is one
    # `python -m distmb.train` run; all of them run in one MPI launch (tests/mpi_scripts/
    # train_runs.py), which saves a launch's start-up per run.
    per_rank = {**cfg, "batch_size": cfg["batch_size"] // ranks}
    # Without the HEC only where its accuracy is asserted against (the synthetic graph).
    modes = ("hec", "no-hec") if dataset == "synthetic" else ("hec",)
    runs = {}
    for mode in modes:
        for s in seeds:
            runs[f"{mode}-{s}"] = [
                "--dataset",
                spec,
                *_flags(per_rank),
                "--eval-every",
                str(cfg["epochs"]),
                "--no-progress",
                "--threads",
                "1",
                "--seed",
                str(s),
                "--partition-cache",
                str(tmp_path / "cache"),
                "--results",
                str(tmp_path / f"{mode}-{s}.jsonl"),
                *(["--no-hec"] if mode == "no-hec" else []),
            ]
    launch_runs(ranks, runs, tmp_path, timeout=900)
    accs = {
        mode: statistics.median(
            json.loads((tmp_path / f"{mode}-{s}.jsonl").read_text().splitlines()[-1])["test_acc"]
            for s in seeds
        )
        for mode in modes
    }
    print(f"{dataset}, {ranks} ranks, {cfg['epochs']} epochs: single {single:.4f}, {accs}")
    # The target of DistGNN-MB and of the issue: within one point of one rank.
    assert accs["hec"] >= single - 0.01, (single, accs)
    if dataset == "synthetic":  # low-variance test set: the cache must be worth something
        assert accs["hec"] > accs["no-hec"], (single, accs)


def test_partition_cache_key_follows_the_dataset_files(tmp_path):
    """``mpirun ... --dataset npz:FILE`` must not reuse the partition of an older FILE."""
    import os

    from distmb.cli.launch import dataset_fingerprint, partition_cache_dir

    data = tmp_path / "g.npz"
    data.write_bytes(b"first version")
    first = partition_cache_dir("cache", f"npz:{data}", 2, 0)
    assert partition_cache_dir("cache", f"npz:{data}", 2, 0) == first  # stable
    data.write_bytes(b"second version, longer")
    assert partition_cache_dir("cache", f"npz:{data}", 2, 0) != first
    # A directory: any file's change changes the key; the loaders' binary cache does not.
    root = tmp_path / "ogb"
    (root / "raw").mkdir(parents=True)
    (root / "raw" / "edge.csv").write_text("0,1\n")
    before = dataset_fingerprint(f"ogb:{root}")
    (root / "distmb-cache").mkdir()
    (root / "distmb-cache" / "graph.bin").write_bytes(b"x")
    assert dataset_fingerprint(f"ogb:{root}") == before
    os.utime(root / "raw" / "edge.csv", ns=(1, 1))
    assert dataset_fingerprint(f"ogb:{root}") != before
    assert dataset_fingerprint("synthetic:nodes=100") == ""
