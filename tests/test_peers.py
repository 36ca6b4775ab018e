"""The peer benchmark's graph hand-over (benchmarks/peers): the file distmb's side writes is
the graph DGL's side trains on. No DGL needed: the DGL worker builds its graph from
``peer_graph.edge_list`` of the file, which is checked here against the edges the graph was
built from."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from distmb.data.datasets.synthetic import SyntheticConfig, generate
from distmb.data.graph import Graph

PEERS = Path(__file__).resolve().parents[1] / "benchmarks" / "peers"


@pytest.fixture(scope="module")
def peers():
    """The benchmark's modules (a script directory, not a package)."""
    sys.path.insert(0, str(PEERS))
    try:
        yield (
            importlib.import_module("peer_graph"),
            importlib.import_module("dgl_vs_distmb"),
        )
    finally:
        sys.path.remove(str(PEERS))


def hand_built() -> tuple[Graph, set[tuple[int, int]]]:
    """A 5-vertex directed graph (not symmetrised) and its edge set ``{(src, dst)}``."""
    src = np.array([0, 0, 1, 3, 4, 4, 2])
    dst = np.array([1, 2, 2, 2, 0, 3, 4])
    features = np.arange(15, dtype=np.float32).reshape(5, 3)
    labels = np.array([0, 1, 1, 0, 2])
    ids = [np.array(a, dtype=np.int64) for a in ([0, 1], [2, 3], [4])]
    graph = Graph.from_edges("hand", src, dst, 5, features, labels, *ids, 3, symmetrize=False)
    return graph, set(zip(src.tolist(), dst.tolist(), strict=True))


def test_exported_file_holds_the_graph(peers, tmp_path):
    peer_graph, bench = peers
    graph, edges = hand_built()
    path = tmp_path / "graph.npz"
    bench.export_graph(graph, path)
    arrays = peer_graph.load_graph_arrays(path)
    src, dst = peer_graph.edge_list(arrays)
    # The edges DGL's graph((src, dst)) gets are exactly the input edges, in their direction
    # (the in-edge CSR is not read as out-edges).
    assert set(zip(src.tolist(), dst.tolist(), strict=True)) == edges
    assert src.size == len(edges)
    np.testing.assert_array_equal(arrays["features"], graph.features)
    np.testing.assert_array_equal(arrays["labels"], graph.labels)
    for split in peer_graph.SPLITS:
        np.testing.assert_array_equal(arrays[split], getattr(graph, split))
    assert int(arrays["num_classes"]) == 3
    assert not list(tmp_path.glob(".*tmp-*"))  # written atomically: no temporary left


def test_products_shaped_round_trip(peers, tmp_path):
    """The benchmark's own path on a small products-shaped graph: trimmed training set,
    export, load; every array identical, in-degrees those of the Graph."""
    peer_graph, bench = peers
    graph = generate(SyntheticConfig.from_spec("shape=products,nodes=3000"))
    batch = 128
    train = bench.whole_batches(graph.train_idx, batch, seed=0)
    assert train.size == (graph.train_idx.size // batch) * batch
    assert np.all(np.diff(train) > 0) and np.isin(train, graph.train_idx).all()
    graph = dataclasses.replace(graph, train_idx=train)
    path = tmp_path / "graph.npz"
    bench.export_graph(graph, path)
    arrays = peer_graph.load_graph_arrays(path)
    for key, value in bench.graph_arrays(graph).items():
        assert arrays[key].dtype == peer_graph.KEYS[key]
        np.testing.assert_array_equal(arrays[key], value)
    _, dst = peer_graph.edge_list(arrays)
    np.testing.assert_array_equal(np.bincount(dst, minlength=graph.num_nodes), graph.in_degree())


def test_whole_batches_keeps_a_small_training_set(peers):
    _, bench = peers
    ids = np.arange(10, dtype=np.int64)
    np.testing.assert_array_equal(bench.whole_batches(ids, 32, seed=0), ids)
    np.testing.assert_array_equal(bench.whole_batches(ids, 5, seed=0), ids)
    assert bench.whole_batches(ids, 4, seed=0).size == 8


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda a: a.pop("labels"), "missing keys ['labels']"),
        (lambda a: a.update(indices=a["indices"].astype(np.int32)), "indices has dtype int32"),
        (lambda a: a.update(indices=a["indices"] + 100), "indices must lie in [0, 5)"),
        (lambda a: a.update(features=a["features"][:4]), "features has shape [4, 3]"),
        (lambda a: a.update(labels=a["labels"] + 5), "labels must lie in [0, 3)"),
        (lambda a: a.update(test_idx=np.array([7])), "test_idx must be 1-D vertex ids"),
        (lambda a: a.update(indptr=a["indptr"][::-1].copy()), "indptr must be 1-D"),
    ],
)
def test_bad_files_are_refused(peers, tmp_path, change, fragment):
    peer_graph, bench = peers
    arrays = bench.graph_arrays(hand_built()[0])
    change(arrays)
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(peer_graph.GraphFileError) as err:
        peer_graph.load_graph_arrays(path)
    assert str(path) in str(err.value) and fragment in str(err.value)


def test_unreadable_file_is_refused(peers, tmp_path):
    peer_graph, _ = peers
    path = tmp_path / "graph.npz"
    path.write_text("not an archive")
    with pytest.raises(peer_graph.GraphFileError, match="not a readable graph .npz"):
        peer_graph.load_graph_arrays(path)
    with pytest.raises(peer_graph.GraphFileError, match="not a readable graph .npz"):
        peer_graph.load_graph_arrays(tmp_path / "missing.npz")
