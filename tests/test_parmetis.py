"""``distmb-partition --method parmetis``: the assignment as an MPI job over ParMETIS, under a
real ``mpiexec -n 2``. The distributed graph construction is checked everywhere; ParMETIS runs
where a library built against mpi4py's MPI is found (``DISTMB_PARMETIS_LIB``), and is skipped
with that reason elsewhere (docs/partitioning-at-scale.md)."""

from __future__ import annotations

import ctypes.util
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_distributed import mpiexec

from distmb.cli.partition import main as partition_main
from distmb.core.errors import InputError
from distmb.data.datasets.ogb import load_ogb
from distmb.data.store.store import PartitionStore
from distmb.partition import partition_graph
from distmb.partition.parmetis import LIB_ENV

SCRIPTS = Path(__file__).parent / "mpi_scripts"


def mpirun(n: int, args: list[str], env: dict | None = None, timeout: float = 180):
    """``mpiexec -n N python ARGS``; fails (never hangs) after ``timeout`` seconds."""
    return subprocess.run(
        [mpiexec(), "-n", str(n), sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        check=False,
    )


def parmetis_library() -> str:
    """The library the tests use, or skip saying how to provide one."""
    path = os.environ.get(LIB_ENV) or ctypes.util.find_library("parmetis")
    if not path or (os.environ.get(LIB_ENV) and not Path(path).is_file()):
        pytest.skip(
            f"no ParMETIS library: set {LIB_ENV} to a libparmetis.so (ParMETIS 4, 64- or "
            "32-bit idx_t) built against the MPI library mpi4py uses (here the PyPI mpich "
            "wheel); Debian's libptscotch/libscotchparmetis link Open MPI and cannot take its "
            "communicator (docs/partitioning-at-scale.md)"
        )
    return path


# Four planted communities of 100 vertices: dense inside (avg degree ~10), 20 edges between
# neighbouring communities. A good 4-way partition cuts about 80 edges; a random one ~75 %.
COMMUNITIES, SIZE = 4, 100


def _write_planted_ogb(root: Path) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    n = COMMUNITIES * SIZE
    src, dst = [], []
    for c in range(COMMUNITIES):
        src.append(rng.integers(0, SIZE, 500) + c * SIZE)
        dst.append(rng.integers(0, SIZE, 500) + c * SIZE)
        src.append(rng.integers(0, SIZE, 20) + c * SIZE)
        dst.append(rng.integers(0, SIZE, 20) + ((c + 1) % COMMUNITIES) * SIZE)
    edge_index = np.stack([np.concatenate(src), np.concatenate(dst)]).astype(np.int64)
    (root / "raw").mkdir(parents=True)
    np.savez_compressed(
        root / "raw" / "data.npz",
        edge_index=edge_index,
        node_feat=rng.standard_normal((n, 8)).astype(np.float32),
        num_nodes_list=np.array([n]),
        num_edges_list=np.array([edge_index.shape[1]]),
    )
    labels = np.full((n, 1), np.nan, dtype=np.float32)
    labelled = rng.choice(n, 200, replace=False)
    labels[labelled, 0] = np.arange(labelled.size) % 3
    np.savez_compressed(root / "raw" / "node-label.npz", node_label=labels)
    for name, ids in zip(("train", "valid", "test"), np.split(labelled, [120, 160]), strict=True):
        path = root / "split" / "time" / f"{name}.csv.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            f.write("".join(f"{i}\n" for i in ids))
    return edge_index, np.sort(labelled[:120])


@pytest.mark.parametrize("ranks", [2, 3])
def test_distributed_csr_against_brute_force(ranks: int) -> None:
    proc = mpirun(ranks, [str(SCRIPTS / "distributed_csr.py"), "50", "400"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok"), proc.stdout


def test_missing_library_fails_on_every_rank_without_hanging(tmp_path: Path) -> None:
    root = tmp_path / "ogbn_planted"
    _write_planted_ogb(root)
    argv = ["-m", "distmb.partition", "--dataset", f"ogb:{root}", "--parts", "2"]
    argv += ["--method", "parmetis", "--out", str(tmp_path / "p")]
    proc = mpirun(2, argv, env={LIB_ENV: str(tmp_path / "absent.so")}, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.count(f"{LIB_ENV}={tmp_path / 'absent.so'}: no such file") == 2
    assert not (tmp_path / "p").exists()


def test_parmetis_needs_an_assignment_from_the_mpi_job(tmp_path: Path) -> None:
    root = tmp_path / "ogbn_planted"
    _write_planted_ogb(root)
    graph = load_ogb(str(root))
    with pytest.raises(InputError, match="exactly when method is 'parmetis'"):
        partition_graph(graph, 2, tmp_path / "p", method="parmetis")


def test_parmetis_partition_under_mpiexec(tmp_path: Path, capsys) -> None:
    library = parmetis_library()
    root = tmp_path / "ogbn_planted"
    edge_index, train = _write_planted_ogb(root)
    out = tmp_path / "parts"
    argv = ["-m", "distmb.partition", "--dataset", f"ogb:{root}", "--parts", str(COMMUNITIES)]
    argv += ["--method", "parmetis", "--out", str(out), "--threads", "1", "--seed", "3"]
    proc = mpirun(2, argv, env={LIB_ENV: library})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("partition written to") == 1  # rank 0 reports
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".node_part.npy")]

    graph = load_ogb(str(root))
    parts = [PartitionStore(out, k, verify=True) for k in range(COMMUNITIES)]
    meta = json.loads((out / "partition.json").read_text())
    assert meta["graph_sha256"] == graph.identity()["sha256"]  # same format, same graph
    assert meta["partitioner"]["method"] == "parmetis"
    assert meta["partitioner"]["parmetis_ranks"] == 2
    solid = [p.orig_ids[: p.n_solid] for p in parts]
    np.testing.assert_array_equal(np.sort(np.concatenate(solid)), np.arange(graph.num_nodes))
    trained = np.sort(np.concatenate([p.orig_ids[p.train_idx] for p in parts]))
    np.testing.assert_array_equal(trained, train)

    # Quality, against an independent count: ParMETIS finds the planted communities, so it
    # cuts far fewer undirected edges than a balanced random assignment of the same graph.
    part_of = np.empty(graph.num_nodes, dtype=np.int64)
    for k, vids in enumerate(solid):
        part_of[vids] = k
    u, v = edge_index
    undirected = {(min(a, b), max(a, b)) for a, b in zip(u.tolist(), v.tolist(), strict=True)}
    undirected = {e for e in undirected if e[0] != e[1]}
    cut = sum(part_of[a] != part_of[b] for a, b in undirected)
    assert partition_main(
        ["--dataset", f"ogb:{root}", "--parts", str(COMMUNITIES), "--method", "random",
         "--out", str(tmp_path / "random"), "--quiet"]
    ) == 0  # fmt: skip
    capsys.readouterr()
    random_parts = [PartitionStore(tmp_path / "random", k) for k in range(COMMUNITIES)]
    random_of = np.empty(graph.num_nodes, dtype=np.int64)
    for k, p in enumerate(random_parts):
        random_of[p.orig_ids[: p.n_solid]] = k
    random_cut = sum(random_of[a] != random_of[b] for a, b in undirected)
    assert cut < 0.3 * random_cut, (cut, random_cut)
