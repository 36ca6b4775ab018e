"""The distributed writer (``distmb-partition --assignment FILE`` and ``--method parmetis``
under ``mpiexec``): every rank writes its own parts. Checked under a real ``mpiexec -n 2/3``
against the single-process writer given the same assignment: every file byte-identical,
``partition.json`` equal but for the fields listed in :data:`RANK_DEPENDENT`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_parmetis import SCRIPTS, _write_planted_ogb, mpirun

from distmb.cli.partition import main as partition_main
from distmb.data.datasets.ogb import load_ogb
from distmb.data.store.format import META_FILE
from distmb.partition import partition_graph
from distmb.partition.pipeline import assignment_record

#: partition.json fields that legitimately differ: the memory high-water mark (whose process,
#: and how many ranks), and the number of writer ranks.
RANK_DEPENDENT = (("peak_memory",), ("partitioner", "writer_ranks"))
#: Explicit so that both sides record the same budget whatever the machine.
BUDGET_GIB = "8"
N = 400  # vertices of the planted fixture


def _dataset(tmp_path: Path) -> Path:
    root = tmp_path / "ogbn_planted"
    _write_planted_ogb(root)
    load_ogb(str(root))  # converts into the cache: both sides then read the same "cache hit"
    return root


def _assignment(tmp_path: Path, parts: int, *, skewed: bool, dtype: type) -> Path:
    """A seeded random assignment; ``skewed`` fills part 0 with half the vertices, so the
    rebalancing moves training and other vertices."""
    rng = np.random.default_rng(parts)
    weights = np.ones(parts)
    if skewed:
        weights[0] = parts - 1
    part_of = rng.choice(parts, N, p=weights / weights.sum()).astype(dtype)
    path = tmp_path / f"assign-{parts}.npy"
    np.save(path, part_of)
    return path


def _without(meta: dict, fields: tuple[tuple[str, ...], ...]) -> dict:
    meta = json.loads(json.dumps(meta))
    for field in fields:
        holder = meta
        for key in field[:-1]:
            holder = holder[key]
        holder.pop(field[-1], None)  # the single-process side has no writer_ranks
    return meta


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize(
    ("ranks", "parts", "options", "skewed"),
    [
        (2, 5, [], True),  # parts > ranks, not divisible; vertices move
        (3, 2, ["--replicate-halo-features", "--features-layout", "ooc"], False),  # parts < ranks
        (3, 7, ["--replicate-halo-features", "--no-symmetrize"], True),
        (2, 4, ["--features-layout", "ooc"], True),
    ],
)
def test_distributed_output_equals_single_process(
    tmp_path: Path, ranks: int, parts: int, options: list[str], skewed: bool
) -> None:
    root = _dataset(tmp_path)
    path = _assignment(tmp_path, parts, skewed=skewed, dtype=np.int64 if skewed else np.int32)
    out = tmp_path / "dist"
    argv = ["-m", "distmb.partition", "--dataset", f"ogb:{root}", "--parts", str(parts)]
    argv += ["--assignment", str(path), "--out", str(out), "--memory-budget", BUDGET_GIB]
    proc = mpirun(ranks, argv + options, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("partition written to") == 1  # rank 0 reports

    # Independent reference: the single-process pipeline on the loaded graph.
    graph = load_ogb(str(root), symmetrize="--no-symmetrize" not in options)
    ref = tmp_path / "ref"
    expected = partition_graph(
        graph,
        parts,
        ref,
        method="assignment",
        part_of=np.load(path),
        extra_options=assignment_record(path),
        memory_budget_gib=float(BUDGET_GIB),
        replicate_halo_features="--replicate-halo-features" in options,
        features_layout="ooc" if "ooc" in options else "npy",
    )
    assert _files(out) == _files(ref)
    for rel in _files(ref):
        if rel != META_FILE:
            assert (out / rel).read_bytes() == (ref / rel).read_bytes(), rel
    got = json.loads((out / META_FILE).read_text())
    assert _without(got, RANK_DEPENDENT) == _without(expected, RANK_DEPENDENT)
    assert got["graph_sha256"] == graph.identity()["sha256"]
    assert got["partitioner"]["writer_ranks"] == ranks
    assert got["peak_memory"]["ranks"] == ranks
    assert len(got["peak_memory"]["peak_rss_bytes_per_rank"]) == ranks
    if skewed:
        moved = got["partitioner"]
        assert moved["train_vertices_moved"] > 0 and moved["other_vertices_moved"] > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no tmp dir left


def test_error_on_one_rank_ends_every_rank(tmp_path: Path) -> None:
    root = _dataset(tmp_path)
    path = _assignment(tmp_path, 4, skewed=False, dtype=np.int32)
    out = tmp_path / "dist"
    argv = [str(SCRIPTS / "distwrite_fail.py"), "--dataset", f"ogb:{root}", "--parts", "4"]
    argv += ["--assignment", str(path), "--out", str(out)]
    proc = mpirun(3, argv, timeout=60)  # a hang fails here
    assert proc.returncode != 0
    assert proc.stderr.count("rank 2: injected failure writing part 2") == 3, proc.stderr
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_bad_assignment_under_mpiexec_fails_on_every_rank(tmp_path: Path) -> None:
    root = _dataset(tmp_path)
    path = tmp_path / "short.npy"
    np.save(path, np.zeros(N - 1, dtype=np.int32))
    argv = ["-m", "distmb.partition", "--dataset", f"ogb:{root}", "--parts", "2"]
    argv += ["--assignment", str(path), "--out", str(tmp_path / "p")]
    proc = mpirun(2, argv, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.count(f"--assignment {path}: holds {N - 1} parts") == 2, proc.stderr
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.zeros(N - 1, dtype=np.int32), f"holds {N - 1} parts but the graph has {N} vertices"),
        (np.full(N, 3, dtype=np.int64), "vertex 0 is in part 3, outside [0, 3)"),
        (np.full(N, -1, dtype=np.int32), "vertex 0 is in part -1, outside [0, 3)"),
        (np.zeros(N, dtype=np.float64), "expected a one-dimensional int32 or int64 array"),
        (np.zeros((N, 1), dtype=np.int32), "expected a one-dimensional int32 or int64 array"),
        (np.array([{"part": 0}] * N, dtype=object), "not a readable .npy array"),
        (None, "no such file"),
    ],
)
def test_bad_assignment_files_name_the_flag(tmp_path: Path, capsys, array, message) -> None:
    root = _dataset(tmp_path)
    path = tmp_path / "assign.npy"
    if array is not None:
        np.save(path, array, allow_pickle=array.dtype == object)
    argv = ["--dataset", f"ogb:{root}", "--parts", "3", "--assignment", str(path)]
    with pytest.raises(SystemExit) as exc:
        partition_main([*argv, "--out", str(tmp_path / "p"), "--quiet"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--assignment {path}: " in err and message in err, err
    assert not (tmp_path / "p").exists()


def test_assignment_excludes_method(tmp_path: Path, capsys) -> None:
    argv = ["--parts", "2", "--out", str(tmp_path / "p"), "--assignment", "a.npy"]
    with pytest.raises(SystemExit):
        partition_main([*argv, "--method", "random"])
    assert "--method random cannot be used with it" in capsys.readouterr().err


def test_single_process_assignment_is_recorded(tmp_path: Path, capsys) -> None:
    root = _dataset(tmp_path)
    path = _assignment(tmp_path, 3, skewed=False, dtype=np.int32)
    out = tmp_path / "p"
    argv = ["--dataset", f"ogb:{root}", "--parts", "3", "--assignment", str(path)]
    assert partition_main([*argv, "--out", str(out), "--quiet"]) == 0
    meta = json.loads((out / META_FILE).read_text())
    assert meta["partitioner"]["method"] == "assignment"
    assert meta["partitioner"]["assignment_file"] == str(path.resolve())
    assert meta["partitioner"]["assignment_sha256"] == assignment_record(path)["assignment_sha256"]
    # The file's assignment, rebalanced: every vertex moves at most once.
    changed = int((np.load(out / "node_part.npy") != np.load(path)).sum())
    record = meta["partitioner"]
    assert changed == record["train_vertices_moved"] + record["other_vertices_moved"]
