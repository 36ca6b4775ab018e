"""Dataset loaders: planetoid, npz, ogb and edgelist, against hand-written files and Cora."""

from __future__ import annotations

import collections
import gzip
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from distmb.core.errors import InputError
from distmb.data import UNLABELED, Graph, load_dataset
from distmb.data.datasets import ogb_cache, ogb_csv
from distmb.data.datasets.edgelist import load_edgelist
from distmb.data.datasets.npz import load_npz
from distmb.data.datasets.ogb import load_ogb
from distmb.data.datasets.ogb_cache import CACHE_DIRNAME, CACHE_TMP_PREFIX
from distmb.data.datasets.planetoid import load_planetoid

# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def edge_set(g: Graph) -> set[tuple[int, int]]:
    """All edges ``(u, v)`` of the in-edge CSR (``u`` in the in-list of ``v``)."""
    dst = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    return set(zip(g.indices.tolist(), dst.tolist(), strict=True))


def expected_edges(pairs, symmetric: bool = True) -> set[tuple[int, int]]:
    """The edge set a loader must produce: self-loops and repeats dropped, reversed if
    ``symmetric``."""
    out = {(int(u), int(v)) for u, v in pairs if u != v}
    if symmetric:
        out |= {(v, u) for u, v in out}
    return out


# A small directed graph used by several loaders: 6 vertices, one self-loop, one repeat.
EDGES = np.array([[0, 1], [1, 2], [2, 0], [3, 4], [4, 5], [5, 5], [0, 1], [2, 3]])
N = 6
FEATURES = (np.arange(N * 3, dtype=np.float32).reshape(N, 3) / 4 - 1).astype(np.float32)
LABELS = np.array([0, 1, 2, 1, UNLABELED, 0], dtype=np.int64)


# --------------------------------------------------------------------------------------------
# planetoid
# --------------------------------------------------------------------------------------------

CORA_CLASS_SIZES = [351, 217, 418, 818, 426, 298, 180]  # PyG's Cora


def test_planetoid_cora(cora_dir: Path) -> None:
    g = load_planetoid(str(cora_dir))
    assert g.name == "cora"
    assert (g.num_nodes, g.feat_dim, g.num_classes) == (2708, 1433, 7)
    assert g.num_edges == 10556  # PyG's Cora edge_index
    assert (g.train_idx.size, g.val_idx.size, g.test_idx.size) == (140, 500, 1000)
    np.testing.assert_array_equal(g.train_idx, np.arange(140))
    np.testing.assert_array_equal(g.val_idx, np.arange(140, 640))
    test_index = [int(line) for line in (cora_dir / "ind.cora.test.index").read_text().split()]
    np.testing.assert_array_equal(g.test_idx, np.sort(test_index))
    assert np.bincount(g.labels).tolist() == CORA_CLASS_SIZES
    assert np.bincount(g.labels[g.train_idx]).tolist() == [20] * 7
    assert g.features.dtype == np.float32 and set(np.unique(g.features)) == {0.0, 1.0}
    assert int(np.count_nonzero(g.features)) == 49216  # binary bag of words of Cora
    edges = edge_set(g)
    assert all((v, u) in edges for u, v in edges)
    assert any("public split" in n for n in g.notes)


def _write_planetoid(d: Path, name: str, arrays: dict[str, object], test_index: list[int]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for suffix, obj in arrays.items():
        (d / f"ind.{name}.{suffix}").write_bytes(pickle.dumps(obj, protocol=2))
    (d / f"ind.{name}.test.index").write_text("".join(f"{i}\n" for i in test_index))


def _one_hot(labels: np.ndarray, classes: int) -> np.ndarray:
    out = np.zeros((labels.size, classes), dtype=np.int32)
    out[np.arange(labels.size), labels] = 1
    return out


def _tiny_planetoid(tmp_path: Path, sparse: bool) -> tuple[Path, dict[str, np.ndarray]]:
    """A CiteSeer-like dataset: 2 train + 500 val rows in allx, 3 test rows listed out of
    order in test.index, and vertex 503 missing from test.index (the isolated-vertex gap)."""
    rng = np.random.default_rng(5)
    n_all, classes, feat = 502, 3, 4
    allx = rng.integers(0, 3, size=(n_all, feat)).astype(np.float32)
    ally_lab = rng.integers(0, classes, n_all)
    tx = np.array([[1, 0, 0, 2], [0, 3, 0, 0], [0, 0, 4, 0]], dtype=np.float32)
    ty_lab = np.array([2, 0, 1])
    test_index = [505, 502, 504]  # 503 is missing
    wrap = (lambda m: __import__("scipy.sparse").sparse.csr_matrix(m)) if sparse else (lambda m: m)
    graph = collections.defaultdict(list, {0: [1, 1, 505], 1: [0], 502: [504], 505: [505]})
    arrays = {
        "x": wrap(allx[:2]),
        "y": _one_hot(ally_lab[:2], classes),
        "allx": wrap(allx),
        "ally": _one_hot(ally_lab, classes),
        "tx": wrap(tx),
        "ty": _one_hot(ty_lab, classes),
        "graph": graph,
    }
    d = tmp_path / "planetoid"
    _write_planetoid(d, "tiny", arrays, test_index)
    features = np.zeros((506, feat), dtype=np.float32)
    features[:n_all] = allx
    features[test_index] = tx
    labels = np.full(506, UNLABELED)
    labels[:n_all] = ally_lab
    labels[test_index] = ty_lab
    return d, {"features": features, "labels": labels}


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "scipy-csr"])
def test_planetoid_handbuilt_reorders_test_rows(tmp_path: Path, sparse: bool) -> None:
    if sparse:
        pytest.importorskip("scipy")
    d, expected = _tiny_planetoid(tmp_path, sparse)
    g = load_planetoid(str(d))
    assert g.name == "tiny" and g.num_nodes == 506 and g.num_classes == 3
    np.testing.assert_array_equal(g.features, expected["features"])
    np.testing.assert_array_equal(g.labels, expected["labels"])
    assert g.labels[503] == UNLABELED and not g.features[503].any()
    np.testing.assert_array_equal(g.train_idx, [0, 1])
    np.testing.assert_array_equal(g.val_idx, np.arange(2, 502))
    np.testing.assert_array_equal(g.test_idx, [502, 504, 505])
    assert edge_set(g) == expected_edges([(0, 1), (0, 505), (1, 0), (502, 504)])
    assert any("1 vertices missing from ind.tiny.test.index" in n for n in g.notes)


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _copy_cora(cora_dir: Path, tmp_path: Path) -> Path:
    d = tmp_path / "cora"
    shutil.copytree(cora_dir, d)
    for p in d.iterdir():
        p.chmod(0o644)
    return d


def test_planetoid_refuses_foreign_globals(cora_dir: Path, tmp_path: Path) -> None:
    d = _copy_cora(cora_dir, tmp_path)
    marker = tmp_path / "pwned"
    (d / "ind.cora.x").write_bytes(pickle.dumps(_Exploit(marker), protocol=2))
    with pytest.raises(InputError, match=r"ind\.cora\.x: refused to unpickle global \w+\.system"):
        load_planetoid(str(d))
    assert not marker.exists()


def test_planetoid_missing_and_truncated_files(cora_dir: Path, tmp_path: Path) -> None:
    d = _copy_cora(cora_dir, tmp_path)
    data = (d / "ind.cora.allx").read_bytes()
    (d / "ind.cora.allx").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"ind\.cora\.allx: not a readable Planetoid pickle"):
        load_planetoid(str(d))
    (d / "ind.cora.ty").unlink()
    with pytest.raises(InputError, match=r"missing ind\.cora\.ty"):
        load_planetoid(str(d))


def test_planetoid_name_inference_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such directory"):
        load_planetoid(str(tmp_path / "absent"))
    with pytest.raises(InputError, match="no Planetoid files"):
        load_planetoid(str(tmp_path))
    (tmp_path / "ind.cora.x").write_bytes(b"")
    (tmp_path / "ind.citeseer.graph").write_bytes(b"")
    with pytest.raises(InputError, match="several Planetoid datasets .*citeseer, cora"):
        load_planetoid(str(tmp_path))


def test_planetoid_bad_test_index_line(tmp_path: Path) -> None:
    d, _ = _tiny_planetoid(tmp_path, sparse=False)
    (d / "ind.tiny.test.index").write_text("505\n50x\n504\n")
    with pytest.raises(InputError, match=r"ind\.tiny\.test\.index: line 2: expected a vertex id"):
        load_planetoid(str(d))


# --------------------------------------------------------------------------------------------
# npz
# --------------------------------------------------------------------------------------------


def _csr(dense: np.ndarray, prefix: str) -> dict[str, np.ndarray]:
    rows, cols = np.nonzero(dense)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=dense.shape[0]))])
    return {
        f"{prefix}_data": dense[rows, cols],
        f"{prefix}_indices": cols.astype(np.int32),
        f"{prefix}_indptr": indptr.astype(np.int32),
        f"{prefix}_shape": np.array(dense.shape, dtype=np.int64),
    }


def _npz_arrays(attr: str) -> dict[str, np.ndarray]:
    adj = np.zeros((N, N), dtype=np.float32)
    adj[EDGES[:, 0], EDGES[:, 1]] = 1.0
    out = _csr(adj, "adj")
    if attr == "dense":
        out["attr_matrix"] = FEATURES
    else:
        out.update(_csr(FEATURES, "attr"))
    out["labels"] = LABELS
    return out


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> str:
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.parametrize("attr", ["dense", "csr"])
def test_npz_round_trip(tmp_path: Path, attr: str) -> None:
    arrays = _npz_arrays(attr)
    arrays.update(train_idx=np.array([3, 0]), val_idx=np.array([1]), test_idx=np.array([5, 2]))
    g = load_npz(_write_npz(tmp_path / "tiny_graph.npz", arrays))
    assert g.name == "tiny_graph"
    assert edge_set(g) == expected_edges(EDGES)
    np.testing.assert_array_equal(g.features, FEATURES)
    np.testing.assert_array_equal(g.labels, LABELS)
    assert g.num_classes == 3
    np.testing.assert_array_equal(g.train_idx, [0, 3])
    np.testing.assert_array_equal(g.test_idx, [2, 5])
    directed = load_npz(str(tmp_path / "tiny_graph.npz"), symmetrize=False)
    assert edge_set(directed) == expected_edges(EDGES, symmetric=False)


def test_npz_csr_labels_take_row_argmax(tmp_path: Path) -> None:
    arrays = _npz_arrays("dense")
    del arrays["labels"]
    one_hot = np.zeros((N, 4), dtype=np.float32)
    one_hot[[0, 1, 2, 3, 5], [2, 0, 3, 1, 1]] = 1.0
    one_hot[2, 1] = 0.5  # the larger entry (column 3) wins
    arrays.update(_csr(one_hot, "labels"))
    g = load_npz(_write_npz(tmp_path / "g.npz", arrays))
    np.testing.assert_array_equal(g.labels, [2, 0, 3, 1, UNLABELED, 1])
    assert g.num_classes == 4
    assert "1 of 6 vertices unlabelled" in g.notes


def test_npz_seeded_split_is_deterministic_and_stratified(tmp_path: Path) -> None:
    n = 200
    arrays = _npz_arrays("dense")
    arrays.update(_csr(np.eye(n, k=1, dtype=np.float32), "adj"))
    arrays["attr_matrix"] = np.ones((n, 2), dtype=np.float32)
    arrays["labels"] = np.array([0] * 150 + [1] * 40 + [UNLABELED] * 10)
    path = _write_npz(tmp_path / "g.npz", arrays)
    a, b, c = load_npz(path, seed=3), load_npz(path, seed=3), load_npz(path, seed=4)
    for split in ("train_idx", "val_idx", "test_idx"):
        np.testing.assert_array_equal(getattr(a, split), getattr(b, split))
    assert not np.array_equal(a.train_idx, c.train_idx)
    for split, sizes in (("train_idx", [15, 4]), ("val_idx", [15, 4]), ("test_idx", [120, 32])):
        assert np.bincount(a.labels[getattr(a, split)]).tolist() == sizes
    assert any("seeded stratified split (seed 3" in note for note in a.notes)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a.pop("adj_indptr"), r"missing adj_indptr; expected keys: adj_data"),
        (lambda a: a.pop("labels"), r"missing labels_data.*expected keys"),
        (lambda a: a.update(attr_matrix=FEATURES[:5]), r"attr_matrix has 5 rows but .* 6 vert"),
        (lambda a: a.update(labels=LABELS[:5]), r"5 labels but the adjacency has 6 vertices"),
        (
            lambda a: a.update(labels=np.array([0, 1, -5, 1, 0, 0])),
            r"label -5 of vertex 2 is out of range",
        ),
        (lambda a: a.update(labels=LABELS.astype(np.float64)), r"labels must be integers"),
        (
            lambda a: a.update(attr_matrix=np.where(FEATURES > 1, np.nan, FEATURES)),
            r"features contain NaN or Inf \(first at vertex 3\)",
        ),
        (
            lambda a: a.update(adj_indices=np.array([1, 2, 0, 4, 9, 5, 3])),
            r"adj_indices holds a column outside \[0, 6\)",
        ),
        (lambda a: a.update(train_idx=np.array([0])), r"give all of train_idx, val_idx"),
        (
            lambda a: a.update(
                train_idx=np.array([0, 0]), val_idx=np.array([1]), test_idx=np.array([2])
            ),
            r"train_idx: vertex id 0 is listed twice",
        ),
    ],
)
def test_npz_bad_contents(tmp_path: Path, change, message: str) -> None:
    arrays = _npz_arrays("dense")
    change(arrays)
    path = _write_npz(tmp_path / "bad.npz", arrays)
    with pytest.raises(InputError, match=message) as info:
        load_npz(path)
    assert str(tmp_path / "bad.npz") in str(info.value)


def test_npz_bad_files(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"this is not a zip archive\n" * 10)
    with pytest.raises(InputError, match=r"garbage\.npz: not a readable \.npz archive"):
        load_npz(str(garbage))
    with pytest.raises(InputError, match=r"absent\.npz: no such file"):
        load_npz(str(tmp_path / "absent.npz"))
    arrays = _npz_arrays("dense")
    arrays["labels"] = np.array([0, 1, 2, 1, None, 0], dtype=object)
    path = _write_npz(tmp_path / "objects.npz", arrays)
    with pytest.raises(InputError, match=r"objects\.npz: array 'labels' cannot be read without"):
        load_npz(path)
    whole = tmp_path / "g.npz"
    _write_npz(whole, _npz_arrays("dense"))
    (tmp_path / "cut.npz").write_bytes(whole.read_bytes()[:300])
    with pytest.raises(InputError, match=r"cut\.npz: "):
        load_npz(str(tmp_path / "cut.npz"))


# --------------------------------------------------------------------------------------------
# ogb
# --------------------------------------------------------------------------------------------

OGB_LABELS = ["1", "0", "nan", "2", "1", "0"]
OGB_SPLITS = {"train": [4, 0], "valid": [1], "test": [5, 3]}


def _gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(text)


def _write_ogb(root: Path, *, scheme: str = "sales_ranking") -> Path:
    _gz(root / "raw" / "edge.csv.gz", "".join(f"{u},{v}\n" for u, v in EDGES))
    _gz(
        root / "raw" / "node-feat.csv.gz",
        "".join(",".join(repr(float(x)) for x in row) + "\n" for row in FEATURES),
    )
    _gz(root / "raw" / "node-label.csv.gz", "".join(f"{y}\n" for y in OGB_LABELS))
    _gz(root / "raw" / "num-node-list.csv.gz", f"{N}\n")
    for name, ids in OGB_SPLITS.items():
        _gz(root / "split" / scheme / f"{name}.csv.gz", "".join(f"{i}\n" for i in ids))
    return root


def _check_ogb_graph(g: Graph, edges=EDGES) -> None:
    assert edge_set(g) == expected_edges(edges)
    np.testing.assert_array_equal(g.features, FEATURES)
    np.testing.assert_array_equal(g.labels, [1, 0, UNLABELED, 2, 1, 0])
    np.testing.assert_array_equal(g.train_idx, [0, 4])
    np.testing.assert_array_equal(g.val_idx, [1])
    np.testing.assert_array_equal(g.test_idx, [3, 5])
    assert g.num_classes == 3


def test_ogb_round_trip_and_cache(tmp_path: Path) -> None:
    root = _write_ogb(tmp_path / "ogbn_tiny")
    g = load_ogb(str(root))
    assert g.name == "ogbn-tiny"
    _check_ogb_graph(g)
    assert any(n.startswith("cache miss (no cache yet)") for n in g.notes)
    assert "1 of 6 vertices unlabelled" in g.notes
    assert (root / CACHE_DIRNAME / "meta.json").is_file()

    # Same size and mtime but other edges: a cache hit must still return the cached edges.
    edge_file = root / "raw" / "edge.csv.gz"
    st = edge_file.stat()
    other = EDGES.copy()
    other[0] = [0, 5]
    _gz(edge_file, "".join(f"{u},{v}\n" for u, v in other))
    data = edge_file.read_bytes()
    edge_file.write_bytes(data[: st.st_size].ljust(st.st_size, b"\0"))  # size as before
    os.utime(edge_file, ns=(st.st_atime_ns, st.st_mtime_ns))
    g2 = load_ogb(str(root))
    assert any(n.startswith("cache hit") for n in g2.notes)
    _check_ogb_graph(g2)

    # A changed mtime invalidates the cache: the (restored, valid) new file is parsed.
    _gz(edge_file, "".join(f"{u},{v}\n" for u, v in other))
    os.utime(edge_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    g3 = load_ogb(str(root))
    assert any("source files changed" in n for n in g3.notes)
    assert edge_set(g3) == expected_edges(other)


def test_ogb_corrupt_cache_is_rebuilt(tmp_path: Path) -> None:
    root = _write_ogb(tmp_path / "ogbn-tiny")
    load_ogb(str(root))
    features = root / CACHE_DIRNAME / "features.npy"
    features.write_bytes(features.read_bytes()[:-7])
    g = load_ogb(str(root))
    assert any("invalid cache" in n and "features.npy" in n for n in g.notes)
    _check_ogb_graph(g)
    assert any(n.startswith("cache hit") for n in load_ogb(str(root)).notes)


def test_ogb_interrupted_cache_write_leaves_no_cache(tmp_path: Path, monkeypatch) -> None:
    root = _write_ogb(tmp_path / "ogbn-tiny")
    real_save = ogb_csv.save_array
    calls = []

    def crash_on_third(path, arr):
        calls.append(path)
        if len(calls) == 3:
            raise RuntimeError("simulated crash")
        return real_save(path, arr)

    monkeypatch.setattr(ogb_csv, "save_array", crash_on_third)
    with pytest.raises(RuntimeError):
        load_ogb(str(root))
    assert not (root / CACHE_DIRNAME).exists()
    assert not [p for p in root.iterdir() if p.name.startswith(CACHE_TMP_PREFIX)]
    monkeypatch.setattr(ogb_csv, "save_array", real_save)
    assert any("no cache yet" in n for n in load_ogb(str(root)).notes)
    assert any(n.startswith("cache hit") for n in load_ogb(str(root)).notes)


def test_ogb_unwritable_directory_loads_without_cache(tmp_path: Path, monkeypatch) -> None:
    root = _write_ogb(tmp_path / "ogbn-tiny")

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(ogb_cache.tempfile, "mkdtemp", refuse)
    g = load_ogb(str(root))
    _check_ogb_graph(g)
    assert any("cache not written" in n and "not writable" in n for n in g.notes)
    assert not (root / CACHE_DIRNAME).exists()


def test_ogb_small_blocks_and_several_schemes(tmp_path: Path, monkeypatch) -> None:
    root = _write_ogb(tmp_path / "ogbn-tiny", scheme="time")
    _gz(root / "split" / "another" / "train.csv.gz", "0\n")  # sorts first, but incomplete
    monkeypatch.setattr(ogb_csv, "BLOCK_BYTES", 5)  # lines span several reads
    with pytest.raises(InputError, match=r"another/valid\.csv\.gz: no such file"):
        load_ogb(str(root))
    shutil.rmtree(root / "split" / "another")
    _write_ogb(root, scheme="zeta")
    g = load_ogb(str(root))
    _check_ogb_graph(g)
    assert any("used 'time', the first in sorted order" in n for n in g.notes)


def test_ogb_line_numbers_across_blocks(tmp_path: Path, monkeypatch) -> None:
    root = _write_ogb(tmp_path / "ogbn-tiny")
    _gz(root / "raw" / "edge.csv.gz", "0,1\n1,2\n2,3\n3,4\n4,x\n")
    monkeypatch.setattr(ogb_csv, "BLOCK_BYTES", 3)
    with pytest.raises(InputError, match=r"edge\.csv\.gz: line 5: expected 2 comma-separated int"):
        load_ogb(str(root))


@pytest.mark.parametrize(
    ("file", "text", "message"),
    [
        ("raw/node-feat.csv.gz", "1,2,3\n4,5,6\n7,8\n", r"line 3: expected 3 comma-separated"),
        ("raw/node-feat.csv.gz", "1,2,3\n4, ,6\n", r"line 2: expected 3 comma-separated num"),
        ("raw/node-feat.csv.gz", "1,2,3\n" * 5 + "1,nan,3\n", r"line 6: feature value is NaN"),
        ("raw/node-feat.csv.gz", "1,2,3\n" * 5, r"5 lines, expected 6"),
        ("raw/edge.csv.gz", "0,1\n1,-\n", r"edge\.csv\.gz: line 2: expected 2 comma-separated"),
        ("raw/edge.csv.gz", "0,1\n1,2.5\n", r"line 2: expected 2 comma-separated integers"),
        ("raw/edge.csv.gz", "0,1\n\n1,2\n", r"line 2: expected 2 comma-separated values"),
        ("raw/edge.csv.gz", "0,1\n1,6\n", r"line 2: edge 1,6 has an endpoint outside the 6"),
        ("raw/node-label.csv.gz", "1\n0\n2.5\n0\n0\n0\n", r"line 3: label 2\.5 is not a class"),
        ("raw/node-feat.csv.gz", "1,2,3\n" * 7, r"node-feat\.csv\.gz: more than 6 lines"),
        ("raw/num-node-list.csv.gz", "7\n", r"6 lines but num-node-list\.csv\.gz declares 7"),
        ("split/sales_ranking/valid.csv.gz", "1\n6\n", r"valid\.csv\.gz: line 2: vertex id 6"),
        ("split/sales_ranking/test.csv.gz", "5\n5\n", r"test\.csv\.gz: vertex id 5 is listed tw"),
    ],
)
def test_ogb_bad_csv(tmp_path: Path, file: str, text: str, message: str) -> None:
    root = _write_ogb(tmp_path / "ogbn-tiny")
    _gz(root / file, text)
    with pytest.raises(InputError, match=message):
        load_ogb(str(root))
    assert not (root / CACHE_DIRNAME).exists()


def test_ogb_missing_and_corrupt_files(tmp_path: Path) -> None:
    root = _write_ogb(tmp_path / "ogbn-tiny")
    (root / "raw" / "edge.csv.gz").rename(root / "edge.bak")
    with pytest.raises(InputError, match=r"raw/edge\.csv\.gz: no such file \(expected raw/edge"):
        load_ogb(str(root))
    data = (root / "edge.bak").read_bytes()
    (root / "raw" / "edge.csv.gz").write_bytes(data[: len(data) - 10])
    with pytest.raises(InputError, match=r"edge\.csv\.gz: not a readable gzip'd CSV file"):
        load_ogb(str(root))
    with pytest.raises(InputError, match=r"no such directory"):
        load_ogb(str(tmp_path / "absent"))


# --------------------------------------------------------------------------------------------
# edgelist
# --------------------------------------------------------------------------------------------


def _write_edgelist(d: Path, edge_text: str | None = None, name: str = "edges.txt") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    np.save(d / "features.npy", FEATURES.astype(np.float64))
    np.save(d / "labels.npy", LABELS.astype(np.int32))
    if edge_text is None:
        np.save(d / "edges.npy", EDGES.astype(np.int32))
    else:
        (d / name).write_text(edge_text)
    return d


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("edges.npy", None),
        (
            "edges.txt",
            "# src dst\n"
            + "".join(f"{u} {v}\n" for u, v in EDGES[:4])
            + "\n"
            + "".join(f"{u}\t{v}  # note\n" for u, v in EDGES[4:]),
        ),
        ("edges.csv", "".join(f"{u}, {v}\n" for u, v in EDGES)),
        ("edges.tsv", "".join(f"{u}\t{v}\n" for u, v in EDGES).rstrip("\n")),
    ],
)
def test_edgelist_round_trip(tmp_path: Path, name: str, text: str | None) -> None:
    d = _write_edgelist(tmp_path / "mygraph", text, name)
    g = load_edgelist(str(d))
    assert g.name == "mygraph"
    assert edge_set(g) == expected_edges(EDGES)
    np.testing.assert_array_equal(g.features, FEATURES)
    np.testing.assert_array_equal(g.labels, LABELS)
    assert g.features.dtype == np.float32 and g.labels.dtype == np.int64


def test_edgelist_splits(tmp_path: Path) -> None:
    d = _write_edgelist(tmp_path / "g")
    g = load_edgelist(str(d), seed=1)
    assert np.array_equal(g.train_idx, load_edgelist(str(d), seed=1).train_idx)
    assert any("seeded stratified split (seed 1" in n for n in g.notes)
    np.save(d / "train_idx.npy", np.array([5, 0]))
    np.save(d / "val_idx.npy", np.array([1]))
    np.save(d / "test_idx.npy", np.array([], dtype=np.int64))
    g = load_edgelist(str(d))
    np.testing.assert_array_equal(g.train_idx, [0, 5])
    np.testing.assert_array_equal(g.val_idx, [1])
    assert g.test_idx.size == 0
    np.save(d / "test_idx.npy", np.array([4]))  # vertex 4 is unlabelled
    with pytest.raises(InputError, match="test_idx contains unlabelled vertices"):
        load_edgelist(str(d))


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("edges.txt", "# c\n0 1\n\n1 6\n", r"edges\.txt: line 4: 1 -> 6 has a vertex id outside"),
        ("edges.npy", None, r"edges\.npy: edge 2: 2 -> 9 has a vertex id outside \[0, 6\)"),
        ("edges.txt", "0 1\n1 2 3\n", r"edges\.txt: line 2: expected two integer vertex ids"),
        ("edges.csv", "0,1\n# x\n1,\n", r"edges\.csv: line 3: expected two .* by a comma"),
        ("edges.txt", "0 1\n1 x\n", r"edges\.txt: line 2: expected two integer vertex ids"),
    ],
)
def test_edgelist_bad_edges(tmp_path: Path, name: str, text: str | None, message: str) -> None:
    d = _write_edgelist(tmp_path / "g", text, name)
    if text is None:
        bad = EDGES.copy()
        bad[2, 1] = 9
        np.save(d / "edges.npy", bad)
    with pytest.raises(InputError, match=message):
        load_edgelist(str(d))


def test_edgelist_bad_arrays(tmp_path: Path) -> None:
    d = _write_edgelist(tmp_path / "g")
    np.save(d / "features.npy", FEATURES[:5])
    with pytest.raises(InputError, match=r"features\.npy: 5 rows but labels\.npy has 6"):
        load_edgelist(str(d))
    np.save(d / "features.npy", FEATURES)
    (d / "edges.txt").write_text("0 1\n")
    with pytest.raises(InputError, match=r"several edge files \(edges\.npy, edges\.txt\)"):
        load_edgelist(str(d))
    (d / "edges.txt").unlink()
    (d / "labels.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(InputError, match=r"labels\.npy: not a readable \.npy array"):
        load_edgelist(str(d))
    (d / "labels.npy").unlink()
    with pytest.raises(InputError, match=r"labels\.npy: no such file"):
        load_edgelist(str(d))


# --------------------------------------------------------------------------------------------
# The --dataset dispatcher
# --------------------------------------------------------------------------------------------


def test_load_dataset_specs(tmp_path: Path) -> None:
    npz_path = _write_npz(tmp_path / "g.npz", _npz_arrays("dense"))
    ogb_root = _write_ogb(tmp_path / "ogbn_tiny")
    edgelist_dir = _write_edgelist(tmp_path / "el")
    for spec in (f"npz:{npz_path}", f"ogb:{ogb_root}", f"edgelist:{edgelist_dir}"):
        g = load_dataset(spec, symmetrize=False)
        assert edge_set(g) == expected_edges(EDGES, symmetric=False), spec


def test_spec_paths_expand_home(monkeypatch, tmp_path):
    from distmb.data import parse_spec

    monkeypatch.setenv("HOME", str(tmp_path))
    assert parse_spec("ogb:~/data/ogbn_products") == ("ogb", str(tmp_path / "data/ogbn_products"))
    assert parse_spec("synthetic:nodes=10") == ("synthetic", "nodes=10")


def _labelled_graph(labels: np.ndarray, num_classes: int) -> Graph:
    n = labels.size
    rng = np.random.default_rng(0)
    return Graph.from_edges(
        "classes",
        rng.integers(0, n, 3 * n),
        rng.integers(0, n, 3 * n),
        n,
        np.zeros((n, 2), dtype=np.float32),
        labels.astype(np.int64),
        np.arange(0, n // 2, dtype=np.int64),
        np.arange(n // 2, n, dtype=np.int64),
        np.zeros(0, dtype=np.int64),
        num_classes,
    )


def test_absurd_class_count_is_refused():
    """One stray label of 10**9 must not size the model and every per-class buffer."""
    labels = np.zeros(500, dtype=np.int64)
    labels[7] = 10**9
    with pytest.raises(InputError, match=r"1000000001 classes .* for 500 labelled vertices"):
        _labelled_graph(labels, 10**9 + 1)


def test_sparse_class_ids_are_warned_about():
    labels = np.zeros(2000, dtype=np.int64)
    labels[::2] = 1
    labels[5] = 100
    graph = _labelled_graph(labels, 101)
    assert any("use 3 of 101 class ids" in note for note in graph.notes)
    dense = _labelled_graph(labels.clip(0, 1), 2)
    assert not any("class ids" in note for note in dense.notes)


def test_stray_label_in_an_edgelist_is_refused_before_splitting(tmp_path):
    n = 300
    np.save(tmp_path / "edges.npy", np.stack([np.arange(n), (np.arange(n) + 1) % n], axis=1))
    np.save(tmp_path / "features.npy", np.zeros((n, 3), dtype=np.float32))
    labels = np.arange(n) % 3
    labels[42] = 10**9
    np.save(tmp_path / "labels.npy", labels)
    with pytest.raises(InputError, match=r"label 1000000000 of vertex 42 implies 1000000001"):
        load_dataset(f"edgelist:{tmp_path}")
