"""The KaMinPar engine (``--method kaminpar``): its input file against the bindings' own
reader, the cut on hand-built graphs with a known optimum, and its errors.

The format invariants of a KaMinPar partition are checked by the METIS tests of
``test_partition.py``, parametrised over the engine.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import needs_kaminpar, random_graph

from distmb.cli.partition import main as cli_main
from distmb.core.errors import InputError
from distmb.data import Graph, PartitionStore, load_dataset
from distmb.data.graph import undirected_csr
from distmb.partition import kaminpar as kaminpar_module
from distmb.partition import partition_graph
from distmb.partition.assign import assign_parts, random_parts
from distmb.partition.kaminpar import (
    KAMINPAR_INSTALL,
    kaminpar_parts,
    parhip_nbytes,
    vertex_weights,
    write_parhip,
)


def directed_cut(graph: Graph, part_of: np.ndarray) -> int:
    """In-edges whose two ends lie in different parts (brute force over the CSR)."""
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    return int(np.count_nonzero(part_of[dst] != part_of[graph.indices]))


def cliques(k: int, size: int) -> Graph:
    """``k`` cliques of ``size`` vertices, clique ``i`` holding ``[i*size, (i+1)*size)``, each
    joined to the next by one edge (a ring): the best k-way cut is exactly the cliques, with
    ``k`` undirected (``2k`` directed) cut edges. Two training vertices per clique."""
    src, dst = [], []
    for i in range(k):
        members = np.arange(i * size, (i + 1) * size)
        u, v = np.meshgrid(members, members)
        keep = u < v
        src.append(u[keep])
        dst.append(v[keep])
    bridges = np.arange(k) * size  # first vertex of clique i -> last vertex of clique i+1
    src.append(bridges)
    dst.append((bridges + size + size - 1) % (k * size))
    n = k * size
    rng = np.random.default_rng(0)
    starts = np.arange(k) * size
    return Graph.from_edges(
        "cliques",
        np.concatenate(src),
        np.concatenate(dst),
        n,
        rng.standard_normal((n, 3)).astype(np.float32),
        np.repeat(np.arange(k), size).astype(np.int64),
        np.sort(np.concatenate([starts + 1, starts + 2])),
        np.sort(starts + 3),
        np.sort(starts + 4),
        k,
    )


@needs_kaminpar
@pytest.mark.parametrize("offsets_64bit", [True, False])
def test_parhip_file_reads_back_as_the_csr(tmp_path, offsets_64bit):
    import kaminpar

    graph = random_graph(n=300, m=1500, seed=4)
    weights = vertex_weights(graph, 3)
    path = tmp_path / "g.parhip"
    write_parhip(path, graph.indptr, graph.indices, weights, offsets_64bit=offsets_64bit)
    if offsets_64bit:
        assert path.stat().st_size == parhip_nbytes(graph.num_nodes, graph.num_edges)
    kgraph = kaminpar.load_graph(str(path), kaminpar.GraphFileFormat.PARHIP)
    assert (kgraph.n(), kgraph.m()) == (graph.num_nodes, graph.num_edges)
    assert kgraph.is_node_weighted() and not kgraph.is_edge_weighted()
    for u in range(graph.num_nodes):
        row = graph.indices[graph.indptr[u] : graph.indptr[u + 1]]
        assert [v for v, _ in kgraph.neighbors(u)] == row.tolist()
        assert all(w == 1 for _, w in kgraph.neighbors(u))
        assert kgraph.node_weight(u) == weights[u]
    assert set(np.flatnonzero(weights == 4)) == set(graph.train_idx.tolist())


def test_write_parhip_rejects_weights_out_of_range(tmp_path):
    graph = random_graph(n=50, m=100)
    bad = np.zeros(graph.num_nodes, dtype=np.int64)
    with pytest.raises(InputError, match="vertex weights must lie in"):
        write_parhip(tmp_path / "g", graph.indptr, graph.indices, bad)
    with pytest.raises(InputError, match="must be >= 0"):
        vertex_weights(graph, -1)


def test_undirected_csr_copies_only_a_directed_graph():
    graph = random_graph(n=200, m=800, seed=2)
    assert graph.symmetric
    indptr, indices = undirected_csr(graph)
    assert indptr is graph.indptr and indices is graph.indices  # no symmetrised copy

    directed = random_graph(n=200, m=800, seed=2, symmetrize=False)
    indptr, indices = undirected_csr(directed)
    n = directed.num_nodes
    dst = np.repeat(np.arange(n), np.diff(directed.indptr))
    ref = np.unique(np.concatenate([dst * n + directed.indices, directed.indices * n + dst]))
    got_dst = np.repeat(np.arange(n), np.diff(indptr))
    np.testing.assert_array_equal(np.sort(got_dst * n + indices), ref)


@needs_kaminpar
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("k", [4, 8])
def test_kaminpar_finds_the_cliques(k, threads):
    graph = cliques(k, size=16)
    part_of = kaminpar_parts(graph, k, seed=0, threads=threads)
    assert part_of.dtype == np.int32 and part_of.shape == (graph.num_nodes,)
    for i in range(k):  # every clique whole in one part, every part one clique
        assert np.unique(part_of[i * 16 : (i + 1) * 16]).size == 1
    assert np.unique(part_of).size == k
    assert directed_cut(graph, part_of) == 2 * k
    assert directed_cut(graph, random_parts(graph, k, seed=0)) > 10 * 2 * k


@needs_kaminpar
def test_pipeline_keeps_the_cliques_and_balances_training(tmp_path):
    graph = cliques(4, size=16)
    meta = partition_graph(graph, 4, tmp_path / "p", method="kaminpar", seed=3)
    assert meta["edge_cut"] == 8  # the 4 ring edges, both directions
    assert [c["n_train"] for c in meta["parts"]] == [2, 2, 2, 2]
    assert meta["partitioner"]["train_vertices_moved"] == 0
    store = PartitionStore(tmp_path / "p", 0)
    solid = np.asarray(store.orig_ids[: store.n_solid])
    assert np.unique(solid // 16).size == 1 and solid.size == 16


@needs_kaminpar
def test_seed_reaches_kaminpar(cora_dir, one_thread):
    graph = load_dataset(f"planetoid:{cora_dir}")
    a = assign_parts(graph, 4, method="kaminpar", seed=1)
    np.testing.assert_array_equal(a, assign_parts(graph, 4, method="kaminpar", seed=1))
    assert not np.array_equal(a, assign_parts(graph, 4, method="kaminpar", seed=2))


@needs_kaminpar
def test_graph_without_edges():
    n = 20
    graph = Graph.from_edges(
        "empty",
        np.zeros(0, dtype=np.int64),
        np.zeros(0, dtype=np.int64),
        n,
        np.zeros((n, 2), dtype=np.float32),
        np.zeros(n, dtype=np.int64),
        np.arange(4),
        np.arange(4, 8),
        np.arange(8, 12),
        1,
    )
    part_of = kaminpar_parts(graph, 4, seed=0)
    assert np.bincount(part_of, minlength=4).tolist() == [5, 5, 5, 5]


@needs_kaminpar
def test_temporary_file_removed_and_disk_space_checked(tmp_path, monkeypatch):
    import shutil
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    graph = random_graph(n=300, m=1500)
    kaminpar_parts(graph, 2, seed=0)
    assert list(tmp_path.iterdir()) == []  # the ParHIP file and its directory are gone

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(kaminpar_module.shutil, "disk_usage", lambda _: usage._replace(free=100))
    with pytest.raises(InputError, match="point TMPDIR at a larger disk"):
        kaminpar_parts(graph, 2, seed=0)


def test_missing_package_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "kaminpar", None)  # import fails
    message = f"--method kaminpar needs the kaminpar package: {KAMINPAR_INSTALL}"
    assert KAMINPAR_INSTALL == "pip install 'distmb[kaminpar]'"
    with pytest.raises(InputError) as info:
        partition_graph(random_graph(), 2, tmp_path / "p", method="kaminpar")
    assert str(info.value) == message
    assert not (tmp_path / "p").exists()
    # The CLI refuses before loading the dataset (whose directory does not exist).
    with pytest.raises(SystemExit) as exc:
        cli_main(
            ["--method", "kaminpar", "--parts", "2", "--dataset", "planetoid:/no/such/dir"]
            + ["--out", str(tmp_path / "out")]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and err[-1] == f"distmb-partition: error: {message}"
    assert not any("Traceback" in line for line in err)


def test_balance_edges_needs_metis(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(
            ["--method", "kaminpar", "--balance-edges", "--parts", "2"]
            + ["--dataset", "planetoid:/no/such/dir", "--out", str(tmp_path / "out")]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--balance-edges needs --method metis" in err
    with pytest.raises(InputError, match="--balance-edges needs --method metis"):
        partition_graph(random_graph(), 2, tmp_path / "p", method="kaminpar", balance_edges=True)


def test_broken_install_names_the_loader_error(monkeypatch):
    import builtins

    from distmb.partition.kaminpar import import_kaminpar

    real_import = builtins.__import__

    def failing(name, *args, **kwargs):
        if name == "kaminpar":
            raise ImportError("libtbb.so.12: cannot open shared object file")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", failing)
    with pytest.raises(InputError, match="does not load .libtbb.so.12.*reinstall it"):
        import_kaminpar()
