"""Partitioner and PartitionStore: invariants against a brute-force reference."""

from __future__ import annotations

import filecmp
import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import ENGINES, random_graph

from distmb.cli.partition import main as cli_main
from distmb.core.errors import InputError, PartitionError
from distmb.data import Graph, PartitionStore, load_dataset
from distmb.partition import partition_graph
from distmb.partition import writer as writer_module
from distmb.partition.assign import random_parts, rebalance_train_and_vertices


def edge_keys(graph: Graph) -> np.ndarray:
    """Sorted int64 keys dst * N + src of every in-edge of the whole graph."""
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    return np.sort(dst * graph.num_nodes + graph.indices)


def check_partition(graph: Graph, directory: Path, parts: int, halo_features: bool = False):
    """Assert every invariant of the format against the original graph; return the stores."""
    n = graph.num_nodes
    stores = [PartitionStore(directory, p, verify=True) for p in range(parts)]
    owner = np.full(n, -1)
    for p, s in enumerate(stores):
        solid = np.asarray(s.orig_ids[: s.n_solid])
        assert np.all(owner[solid] == -1), "a vertex is solid in two parts"
        owner[solid] = p
    assert np.all(owner >= 0), "a vertex is solid in no part"
    node_part = np.load(directory / "node_part.npy")
    np.testing.assert_array_equal(node_part, owner)

    keys, train, val, test = [], [], [], []
    halo_sets = []
    for p, s in enumerate(stores):
        orig = np.asarray(s.orig_ids)
        solid, halo = orig[: s.n_solid], orig[s.n_solid :]
        # Halo vertices: exactly the foreign in-neighbours of this part's solid vertices.
        ref_halo = set()
        for v in solid:
            for u in graph.indices[graph.indptr[v] : graph.indptr[v + 1]]:
                if owner[u] != p:
                    ref_halo.add(int(u))
        assert set(halo.tolist()) == ref_halo
        assert np.all(np.diff(solid) > 0) and np.all(np.diff(halo) > 0)
        np.testing.assert_array_equal(s.halo_owner, owner[halo])  # owner holds it as solid
        halo_sets.append(halo)
        dst = orig[np.repeat(np.arange(s.n_solid), np.diff(s.indptr))]
        keys.append(dst * n + orig[np.asarray(s.indices)])
        np.testing.assert_array_equal(s.features, graph.features[solid])
        np.testing.assert_array_equal(s.labels, graph.labels[solid])
        np.testing.assert_array_equal(s.in_degree, np.diff(graph.indptr)[orig])
        train.append(solid[s.train_idx])
        val.append(solid[s.val_idx])
        test.append(solid[s.test_idx])
        if halo_features:
            np.testing.assert_array_equal(s.halo_features, graph.features[halo])
        else:
            assert s.halo_features is None
    np.testing.assert_array_equal(np.sort(np.concatenate(keys)), edge_keys(graph))
    for got, ref in ((train, graph.train_idx), (val, graph.val_idx), (test, graph.test_idx)):
        np.testing.assert_array_equal(np.sort(np.concatenate(got)), ref)
    # send_lists[j] of part i == part-i solid vertices that are halo in part j.
    for i, s in enumerate(stores):
        solid_i = np.asarray(s.orig_ids[: s.n_solid])
        for j in range(parts):
            sent = solid_i[np.asarray(s.send_list(j))]
            expected = np.sort(halo_sets[j][owner[halo_sets[j]] == i]) if j != i else []
            np.testing.assert_array_equal(sent, expected)
    return stores


@pytest.mark.parametrize("parts", [1, 2, 3, 8])
@pytest.mark.parametrize("method", [*ENGINES, "random"])
def test_invariants_random_graph(tmp_path, parts, method):
    graph = random_graph(n=500, m=2500, seed=parts)
    meta = partition_graph(graph, parts, tmp_path / "p", method=method, seed=1)
    check_partition(graph, tmp_path / "p", parts)
    assert meta["num_parts"] == parts
    assert meta["edge_cut"] == sum(c["cut_edges"] for c in meta["parts"])


@pytest.mark.parametrize("method", ENGINES)
def test_directed_graph_and_halo_features(tmp_path, method):
    graph = random_graph(n=300, m=1500, symmetrize=False)
    assert not graph.symmetric
    partition_graph(graph, 3, tmp_path / "p", method=method, replicate_halo_features=True)
    check_partition(graph, tmp_path / "p", 3, halo_features=True)


@pytest.mark.parametrize("parts", [1, 2, 3, 8])
@pytest.mark.parametrize("method", ENGINES)
def test_invariants_cora(tmp_path, cora_dir, parts, method):
    graph = load_dataset(f"planetoid:{cora_dir}")
    meta = partition_graph(graph, parts, tmp_path / "p", method=method, seed=0)
    check_partition(graph, tmp_path / "p", parts)
    assert meta["partitioner"]["method"] == method
    if parts > 1:  # a min-cut engine must beat a random cut by far on a real graph
        assert meta["edge_cut"] < 0.5 * graph.num_edges * (1 - 1 / parts)


@pytest.fixture(scope="module")
def synthetic_graph() -> Graph:
    return load_dataset("synthetic")


@pytest.mark.parametrize("parts", [2, 3, 8])
@pytest.mark.parametrize("method", ENGINES)
def test_invariants_synthetic(tmp_path, synthetic_graph, parts, method):
    partition_graph(synthetic_graph, parts, tmp_path / "p", method=method, seed=0)
    check_partition(synthetic_graph, tmp_path / "p", parts)


@pytest.mark.parametrize("method", ENGINES)
def test_train_balance_synthetic_p8(tmp_path, synthetic_graph, method):
    meta = partition_graph(synthetic_graph, 8, tmp_path / "p", method=method, seed=0)
    train = np.array([c["n_train"] for c in meta["parts"]])
    solid = np.array([c["n_solid"] for c in meta["parts"]])
    assert train.sum() == synthetic_graph.train_idx.size
    assert train.max() / train.mean() <= 1.05
    assert solid.max() / solid.mean() <= 1.05


def test_rebalance_moves_training_then_other_vertices():
    # All 120 training vertices in part 0, and part 2 far too large: both passes must fix it.
    graph = random_graph(n=600, m=3000, seed=5)
    train = np.arange(0, 120, dtype=np.int64)
    rest = np.setdiff1d(np.arange(600), train)
    graph.train_idx, graph.val_idx, graph.test_idx = train, rest[:100], rest[100:200]
    part_of = np.zeros(600, dtype=np.int32)
    part_of[150:250] = 1
    part_of[250:] = 2
    before = part_of.copy()
    moved_train, moved_other = rebalance_train_and_vertices(
        graph, part_of, 3, train_tolerance=0.0, vertex_tolerance=0.05
    )
    assert np.bincount(part_of[train], minlength=3).tolist() == [40, 40, 40]
    assert moved_train == 80
    counts = np.bincount(part_of, minlength=3)
    assert counts.max() <= 210  # floor(200 * 1.05)
    changed = np.flatnonzero(part_of != before)
    assert changed.size == moved_train + moved_other
    assert np.isin(changed[changed >= 120], rest).all()

    # Boundary first: a moved training vertex has at least as many neighbours in its new
    # part as the average training vertex left behind in part 0.
    def nbr(v: int, q: int) -> int:
        return int(np.sum(before[graph.indices[graph.indptr[v] : graph.indptr[v + 1]]] == q))

    moved_gain = np.mean([nbr(v, part_of[v]) - nbr(v, 0) for v in train if part_of[v] != 0])
    stay_gain = np.mean([max(nbr(v, 1), nbr(v, 2)) - nbr(v, 0) for v in train if part_of[v] == 0])
    assert moved_gain >= stay_gain


def test_random_parts_balanced():
    graph = random_graph(n=600, m=3000, seed=5)
    rp = random_parts(graph, 3, seed=0)
    train_counts = np.bincount(rp[graph.train_idx], minlength=3)
    assert train_counts.max() - train_counts.min() <= 1
    assert np.bincount(rp, minlength=3).max() - np.bincount(rp, minlength=3).min() <= 1


@pytest.mark.parametrize("method", ENGINES)
def test_deterministic_output(tmp_path, cora_dir, one_thread, method):
    graph = load_dataset(f"planetoid:{cora_dir}")
    for name in ("a", "b"):
        partition_graph(graph, 3, tmp_path / name, method=method, seed=7)
    files = sorted(
        p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file()
    )
    assert len(files) == 1 + 1 + 3 * 12
    for rel in files:
        if rel.name == "partition.json":  # identical but for the measured peak memory
            a, b = (json.loads((tmp_path / d / rel).read_text()) for d in ("a", "b"))
            assert a.pop("peak_memory").keys() == b.pop("peak_memory").keys()
            assert a == b
            continue
        assert filecmp.cmp(tmp_path / "a" / rel, tmp_path / "b" / rel, shallow=False), rel


def test_crash_leaves_nothing(tmp_path, monkeypatch):
    graph = random_graph()
    calls = {"n": 0}
    real = writer_module.save_npy

    def failing(path, array):
        calls["n"] += 1
        if calls["n"] == 10:
            raise OSError("disk full (simulated)")
        return real(path, array)

    monkeypatch.setattr(writer_module, "save_npy", failing)
    with pytest.raises(OSError, match="simulated"):
        partition_graph(graph, 2, tmp_path / "p")
    assert list(tmp_path.iterdir()) == []


def test_overwrite_replaces_only_when_asked(tmp_path):
    graph = random_graph()
    out = tmp_path / "p"
    partition_graph(graph, 2, out)
    with pytest.raises(InputError, match="already exists"):
        partition_graph(graph, 3, out)
    partition_graph(graph, 3, out, overwrite=True)
    assert PartitionStore(out, 2).num_parts == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]
    foreign = tmp_path / "not-a-partition"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    with pytest.raises(InputError, match="not a distmb partition"):
        partition_graph(graph, 2, foreign, overwrite=True)
    # A partition.json alone does not make a directory replaceable: every file must be the
    # partition's (its verification stamps aside).
    PartitionStore(out, 0)  # writes part-0/.verified.json, which may go
    (out / "notes.md").write_text("my experiment log")
    with pytest.raises(InputError, match="holds notes.md, which is not part of the partition"):
        partition_graph(graph, 2, out, overwrite=True)
    (out / "notes.md").unlink()
    (foreign / "partition.json").write_text('{"format_version": 1}')
    with pytest.raises(InputError, match="not a distmb partition"):
        partition_graph(graph, 2, foreign, overwrite=True)
    assert (foreign / "precious.txt").read_text() == "keep me"
    partition_graph(graph, 2, out, overwrite=True)
    assert PartitionStore(out, 1).num_parts == 2


def test_the_next_write_removes_the_temporaries_of_killed_writers(tmp_path):
    """A writer killed during --overwrite leaves ``.OUT.tmp-HOST-PID`` (and perhaps
    ``.OUT.old-HOST-PID``); the next write to OUT removes those of dead processes of this
    host (older versions' host-less ``.OUT.tmp-PID`` too), never a live writer's or another
    host's."""
    import socket

    graph = random_graph()
    out = tmp_path / "p"
    partition_graph(graph, 2, out)
    dead, alive, host = 999_999_999, os.getppid(), socket.gethostname()  # no pid is that high
    stale = [f".p.tmp-{host}-{dead}", f".p.tmp-{dead}", f".p.old-{host}-{dead}"]
    kept = [f".p.tmp-{host}-{alive}", f".p.tmp-elsewhere-{dead}", f".q.tmp-{host}-{dead}"]
    for name in stale + kept:
        (tmp_path / name / "part-0").mkdir(parents=True)
        (tmp_path / name / "part-0" / "features.npy").write_bytes(b"\0" * 1024)
    partition_graph(graph, 2, out, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["p", *kept])
    assert PartitionStore(out, 1).num_parts == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--parts", "0"], "--parts must be >= 1"),
        (["--parts", "100000"], "exceeds the graph's"),
        (["--parts", "2", "--dataset", "nosuch:x"], "unknown dataset kind"),
        (["--parts", "2", "--dataset", "planetoid:/no/such/dir"], "/no/such/dir"),
        (["--parts", "2", "--threads", "0"], "--threads must be in [1, 4096]"),
        (["--parts", "2", "--threads", "100000000"], "--threads must be in [1, 4096]"),
    ],
)
def test_cli_bad_input(tmp_path, capsys, argv, message):
    dataset = [] if "--dataset" in argv else ["--dataset", "synthetic:nodes=2000,avg_degree=6"]
    with pytest.raises(SystemExit) as exc:
        cli_main(argv + dataset + ["--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("distmb-partition: error:")]
    assert len(errors) == 1 and errors[0] == err[-1] and message in errors[0]
    assert not any("Traceback" in line for line in err)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs a /proc filesystem")
def test_cli_out_where_nothing_can_be_created(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["--parts", "2", "--dataset", "synthetic:nodes=500", "--out", "/proc/distmb"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--out /proc/distmb: cannot create" in err
    assert "Traceback" not in err


def test_cli_refuses_existing_out(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    with pytest.raises(SystemExit) as exc:
        cli_main(["--parts", "2", "--out", str(tmp_path / "out")])
    assert exc.value.code == 2 and "--overwrite" in capsys.readouterr().err


@pytest.mark.parametrize("method", ENGINES)
def test_cli_end_to_end(tmp_path, capsys, one_thread, method):
    code = cli_main(
        [
            "--method",
            method,
            "--dataset",
            "synthetic:nodes=3000,avg_degree=8",
            "--parts",
            "3",
            "--out",
            str(tmp_path / "missing" / "parent" / "p"),
            "--quiet",
            "--threads",
            "1",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "halo/solid" in out and "edge cut" in out and "peak memory" in out
    assert len(out.strip().splitlines()) == 1 + 3 + 3
    assert PartitionStore(tmp_path / "missing" / "parent" / "p", 2, verify=True).num_parts == 3


# ---- PartitionStore: corrupt, truncated, mismatched partitions ---------------------------


@pytest.fixture()
def small_partition(tmp_path) -> Path:
    partition_graph(random_graph(), 2, tmp_path / "p")
    return tmp_path / "p"


def test_store_detects_altered_file(small_partition):
    path = small_partition / "part-1" / "features.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    PartitionStore(small_partition, 1, verify=False)  # shapes still fine without verification
    with pytest.raises(PartitionError, match=r"part-1/features.npy: sha256 does not match"):
        PartitionStore(small_partition, 1, verify=True)


def _rewrite(directory: Path, rel: str, array: np.ndarray) -> None:
    """Replace a part's array and record its new sha256, as a crafted partition would."""
    from distmb.data.store.store import sha256_file

    np.save(directory / rel, array)
    meta = json.loads((directory / "partition.json").read_text())
    meta["files"][rel] = sha256_file(directory / rel)
    (directory / "partition.json").write_text(json.dumps(meta))


def test_store_verifies_by_default_and_stamps_the_pass(small_partition, monkeypatch):
    import distmb.data.store.store as store_module

    calls = []
    real = store_module.sha256_file
    monkeypatch.setattr(store_module, "sha256_file", lambda p: calls.append(p) or real(p))
    PartitionStore(small_partition, 0)
    first = len(calls)
    assert first >= 12 and (small_partition / "part-0" / store_module.STAMP_FILE).is_file()
    PartitionStore(small_partition, 0)  # the stamp vouches for the same files: no hashing
    assert len(calls) == first
    PartitionStore(small_partition, 0, verify="always")
    assert len(calls) == 2 * first
    os.utime(small_partition / "part-0" / "labels.npy", ns=(1, 1))  # a changed file
    PartitionStore(small_partition, 0)
    assert len(calls) == 3 * first
    PartitionStore(small_partition, 0, verify="never")
    assert len(calls) == 3 * first
    # Flipped bytes after a stamped pass (size kept, mtime changed): caught.
    path = small_partition / "part-0" / "features.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(PartitionError, match="features.npy: sha256 does not match"):
        PartitionStore(small_partition, 0)


@pytest.mark.parametrize(
    ("rel", "change", "message"),
    [
        ("part-0/indices.npy", lambda a: _set(a, 3, 10**6), r"value 1000000 at index 3 is outside"),
        (
            "part-0/labels.npy",
            lambda a: _set(a, 0, 99),
            r"value 99 at index 0 is outside \[-1, 3\)",
        ),
        ("part-1/train_idx.npy", lambda a: _set(a, 1, -5), "value -5 at index 1"),
        ("part-0/indptr.npy", lambda a: _set(a, 2, 0), "decreases at index"),
        ("part-1/features.npy", lambda a: _set(a, (4, 1), np.nan), "row 4 holds NaN or Inf"),
    ],
)
def test_store_rejects_values_out_of_range(small_partition, rel, change, message):
    array = np.load(small_partition / rel)
    _rewrite(small_partition, rel, change(array))
    part = int(rel.split("/")[0].split("-")[1])
    with pytest.raises(PartitionError, match=message) as info:
        PartitionStore(small_partition, part)
    assert rel in str(info.value)


def _set(array: np.ndarray, index, value) -> np.ndarray:
    out = array.copy()
    out[index] = value
    return out


def test_store_detects_truncated_file(small_partition):
    path = small_partition / "part-0" / "indices.npy"
    path.write_bytes(path.read_bytes()[:-16])
    with pytest.raises(PartitionError, match=r"part-0/indices.npy"):
        PartitionStore(small_partition, 0)


def test_store_detects_missing_and_wrong_files(small_partition):
    (small_partition / "part-0" / "labels.npy").unlink()
    with pytest.raises(PartitionError, match=r"part-0/labels.npy: missing"):
        PartitionStore(small_partition, 0)
    np.save(small_partition / "part-1" / "labels.npy", np.zeros(3, dtype=np.float32))
    with pytest.raises(PartitionError, match=r"part-1/labels.npy: dtype float32"):
        PartitionStore(small_partition, 1)


def test_store_rejects_pickled_array(small_partition):
    path = small_partition / "part-0" / "labels.npy"
    np.save(path, np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(PartitionError, match="labels.npy"):
        PartitionStore(small_partition, 0)


def test_store_meta_errors(small_partition, tmp_path):
    with pytest.raises(PartitionError, match="part 5 requested"):
        PartitionStore(small_partition, 5)
    with pytest.raises(PartitionError, match="no such directory"):
        PartitionStore(tmp_path / "nope", 0)
    meta_path = small_partition / "partition.json"
    meta = json.loads(meta_path.read_text())
    meta["format_version"] = 99
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(PartitionError, match="format version 99"):
        PartitionStore(small_partition, 0)
    meta_path.write_text("{ not json")
    with pytest.raises(PartitionError, match="not valid JSON"):
        PartitionStore(small_partition, 0)
    os.unlink(meta_path)
    with pytest.raises(PartitionError, match="partition.json: missing"):
        PartitionStore(small_partition, 0)


def test_store_identity_matches_graph(tmp_path, cora_dir):
    graph = load_dataset(f"planetoid:{cora_dir}")
    partition_graph(graph, 2, tmp_path / "p")
    ident = PartitionStore(tmp_path / "p", 0).graph_identity()
    assert ident["graph_sha256"] == graph.identity()["sha256"]
    assert ident["num_nodes"] == 2708 and ident["num_classes"] == 7


# ---- METIS memory budget: cut sparsification of METIS' input ------------------------------


def test_sparsify_symmetric_kernel():
    from distmb import _C

    graph = random_graph(n=2000, m=20000, seed=3)
    indptr, indices = _C.sparsify_symmetric(graph.indptr, graph.indices, 0.4, 11)
    n = graph.num_nodes
    dst = np.repeat(np.arange(n), np.diff(indptr))
    kept = dst * n + indices
    reverse = np.sort(indices * n + dst)
    np.testing.assert_array_equal(np.sort(kept), reverse)  # symmetric
    assert np.isin(kept, edge_keys(graph)).all()  # a subset of the graph's edges
    assert abs(indices.size / graph.num_edges - 0.4) < 0.02
    again = _C.sparsify_symmetric(graph.indptr, graph.indices, 0.4, 11)
    np.testing.assert_array_equal(again[1], indices)  # deterministic for a seed
    other = _C.sparsify_symmetric(graph.indptr, graph.indices, 0.4, 12)
    assert not np.array_equal(other[1], indices)
    full = _C.sparsify_symmetric(graph.indptr, graph.indices, 1.0, 11)
    np.testing.assert_array_equal(full[1], graph.indices)
    with pytest.raises(ValueError, match="keep_fraction"):
        _C.sparsify_symmetric(graph.indptr, graph.indices, 0.0, 1)


def test_memory_budget_sparsifies_metis_input(tmp_path, cora_dir):
    from distmb.partition.assign import (
        METIS_BYTES_PER_ENTRY,
        METIS_BYTES_PER_NEIGHBOUR_PART,
        METIS_BYTES_PER_VERTEX,
        PROCESS_BASELINE_BYTES,
        metis_edge_fraction,
        metis_memory_bytes,
    )

    graph = load_dataset(f"planetoid:{cora_dir}")
    n, m = graph.num_nodes, graph.num_edges
    fixed = PROCESS_BASELINE_BYTES + graph.nbytes + METIS_BYTES_PER_VERTEX * n
    assert metis_memory_bytes(graph, 0.0, 4) == fixed
    # Cora's average degree is ~3.9 < P = 4: every vertex may neighbour ~3.9 parts.
    full_need = int(fixed + METIS_BYTES_PER_NEIGHBOUR_PART * m + m * METIS_BYTES_PER_ENTRY)
    assert metis_memory_bytes(graph, 1.0, 4) == full_need
    assert metis_memory_bytes(graph, 1.0, 2) == int(
        fixed + METIS_BYTES_PER_NEIGHBOUR_PART * 2 * n + m * METIS_BYTES_PER_ENTRY
    )
    assert metis_edge_fraction(graph, full_need, 4) == 1.0
    budget = metis_memory_bytes(graph, 0.5, 4)
    assert metis_edge_fraction(graph, budget, 4) == pytest.approx(0.5, abs=1e-5)
    assert metis_memory_bytes(graph, metis_edge_fraction(graph, budget, 4), 4) <= budget
    assert metis_edge_fraction(graph, budget, 2) > 0.5  # fewer parts, less refinement memory
    with pytest.raises(InputError, match="--memory-budget"):
        metis_edge_fraction(graph, fixed, 4)
    # A directed graph's symmetrised copy (at most twice its entries) is counted too.
    directed = random_graph(n=300, m=1500, symmetrize=False)
    copy = 8 * directed.num_nodes + directed.indices.itemsize * 2 * directed.num_edges
    assert metis_memory_bytes(directed, 0.0, 3) == (
        PROCESS_BASELINE_BYTES + directed.nbytes + copy + METIS_BYTES_PER_VERTEX * 300
    )

    meta = partition_graph(graph, 4, tmp_path / "half", memory_budget_gib=budget / 2**30)
    assert meta["partitioner"]["metis_edge_fraction"] == pytest.approx(0.5, abs=1e-3)
    check_partition(graph, tmp_path / "half", 4)  # the format invariants are unaffected
    full = partition_graph(graph, 4, tmp_path / "full", memory_budget_gib=64.0)
    assert full["partitioner"]["metis_edge_fraction"] == 1.0
    # The sparsified METIS still finds a cut far below a random partition's 75 %.
    assert meta["edge_cut"] < 0.35 * graph.num_edges
    assert full["edge_cut"] <= meta["edge_cut"] * 1.5
