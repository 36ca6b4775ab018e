"""``ogb:DIR`` in OGB's binary layout (ogbn-papers100M): raw/data.npz, raw/node-label.npz and
split/time/*.csv.gz, written here in that exact layout and checked against the arrays written.
Also the .npz member reader it uses and the in-place compaction of the CSR build."""

from __future__ import annotations

import gzip
import io
import os
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from distmb.cli.partition import main as partition_main
from distmb.core.errors import InputError
from distmb.data import UNLABELED, load_dataset
from distmb.data.datasets import ogb_cache, ogb_npz
from distmb.data.datasets.ogb import load_ogb
from distmb.data.datasets.ogb_cache import CACHE_DIRNAME, CACHE_TMP_PREFIX
from distmb.data.store import npzmember
from distmb.data.store.store import PartitionStore

# A papers100M-shaped fixture: a directed citation graph with reciprocal citations, repeats
# and self-loops, 128 features, float32 labels [N, 1] with NaN for most vertices, node_year.
N, E, F, CLASSES = 300, 2400, 128, 7


def _fixture_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, N, E)
    dst = rng.integers(0, N, E)
    src[:20], dst[:20] = dst[20:40], src[20:40]  # reciprocal edges
    src[40:50], dst[40:50] = src[50:60], dst[50:60]  # repeats
    dst[60:65] = src[60:65]  # self-loops
    labels = np.full((N, 1), np.nan, dtype=np.float32)
    labelled = np.sort(rng.choice(N, 90, replace=False))
    labels[labelled, 0] = rng.integers(0, CLASSES, labelled.size)
    labels[labelled[0], 0] = CLASSES - 1  # every class id up to CLASSES - 1 occurs
    order = rng.permutation(labelled)  # OGB's split files are not sorted
    return {
        "edge_index": np.stack([src, dst]).astype(np.int64),
        "node_feat": rng.standard_normal((N, F)).astype(np.float32),
        "num_nodes_list": np.array([N], dtype=np.int64),
        "num_edges_list": np.array([E], dtype=np.int64),
        "node_year": rng.integers(1990, 2021, (N, 1)).astype(np.int64),
        "node_label": labels,
        "train": order[:50],
        "valid": order[50:65],
        "test": order[65:90],
    }


_DATA_KEYS = ("edge_index", "node_feat", "num_nodes_list", "num_edges_list", "node_year")
_SPLITS = ("train", "valid", "test")


def _write_papers(
    root: Path, a: dict[str, np.ndarray], *, save=np.savez_compressed, label_save=None
) -> Path:
    """``root`` in the layout of papers100M-bin.zip (what OGB's download unzips to)."""
    (root / "raw").mkdir(parents=True, exist_ok=True)
    save(root / "raw" / "data.npz", **{k: a[k] for k in _DATA_KEYS if k in a})
    (label_save or np.savez_compressed)(root / "raw" / "node-label.npz", node_label=a["node_label"])
    for name in _SPLITS:
        _gz(root / "split" / "time" / f"{name}.csv.gz", "".join(f"{i}\n" for i in a[name]))
    (root / "RELEASE_v1.txt").write_text("papers100M-shaped test fixture\n")
    return root


def _gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(text)


def _savez_aligned(path: Path, **arrays: np.ndarray) -> None:
    """Like ``np.savez`` (members stored uncompressed), with each member's data padded (a
    private zip extra field) to start at a multiple of 64 bytes of the archive."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for key, arr in arrays.items():
            buf = io.BytesIO()
            np.save(buf, arr, allow_pickle=False)
            npy = buf.getvalue()
            name = f"{key}.npy"
            data_start = zf.fp.tell() + 30 + len(name) + 4 + (len(npy) - arr.nbytes)
            pad = -data_start % 64
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_STORED
            info.extra = struct.pack("<HH", 0xCAFE, pad) + b"\0" * pad
            zf.writestr(info, npy)


def _reference_csr(src: np.ndarray, dst: np.ndarray, n: int, symmetric: bool = True):
    """In-edge CSR by brute force: distinct (u, v), u != v, both directions if symmetric."""
    pairs = {(int(u), int(v)) for u, v in zip(src, dst, strict=True) if u != v}
    if symmetric:
        pairs |= {(v, u) for u, v in pairs}
    rows = [sorted(u for u, v in pairs if v == w) for w in range(n)]
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    indices = np.array([u for r in rows for u in r], dtype=np.int64)
    return indptr, indices


def _check_graph(g, a: dict[str, np.ndarray]) -> None:
    indptr, indices = _reference_csr(a["edge_index"][0], a["edge_index"][1], N)
    np.testing.assert_array_equal(g.indptr, indptr)
    np.testing.assert_array_equal(g.indices, indices)
    np.testing.assert_array_equal(g.features, a["node_feat"].astype(np.float32))
    y = a["node_label"][:, 0]
    expected = np.full(N, UNLABELED, dtype=np.int64)
    expected[~np.isnan(y)] = y[~np.isnan(y)].astype(np.int64)
    np.testing.assert_array_equal(g.labels, expected)
    assert g.num_classes == CLASSES
    np.testing.assert_array_equal(g.train_idx, np.sort(a["train"]))
    np.testing.assert_array_equal(g.val_idx, np.sort(a["valid"]))
    np.testing.assert_array_equal(g.test_idx, np.sort(a["test"]))
    assert f"{N - 90} of {N} vertices unlabelled" in g.notes


def _cached_files(root: Path) -> set[str]:
    cache = root / CACHE_DIRNAME
    return {p.name for p in cache.iterdir()} if cache.is_dir() else set()


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def test_compressed_layout_as_ogb_ships_it(tmp_path: Path) -> None:
    a = _fixture_arrays()
    root = _write_papers(tmp_path / "ogbn_papers100M", a)
    g = load_ogb(str(root))
    assert g.name == "ogbn-papers100M"
    _check_graph(g, a)
    assert any(n.startswith("cache miss (no cache yet): converted raw/data.npz") for n in g.notes)
    assert "edges: edge_index is stored compressed; read from the cache" in g.notes
    assert "split: OGB split/time (50/15/25)" in g.notes
    assert _cached_files(root) >= {"src.npy", "dst.npy", "features.npy", "labels.npy"}
    assert isinstance(g.features, np.memmap)
    assert Path(g.features.filename) == (root / CACHE_DIRNAME / "features.npy").resolve()

    g2 = load_ogb(str(root))
    assert any(n.startswith("cache hit") for n in g2.notes)
    _check_graph(g2, a)

    # A changed data.npz (new mtime) invalidates the cache.
    b = _fixture_arrays(seed=1)
    b["node_label"], b["train"], b["valid"], b["test"] = (a[k] for k in ("node_label", *_SPLITS))
    np.savez_compressed(root / "raw" / "data.npz", **{k: b[k] for k in _DATA_KEYS})
    st = (root / "raw" / "data.npz").stat()
    os.utime(root / "raw" / "data.npz", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    g3 = load_ogb(str(root))
    assert any("source files changed" in n for n in g3.notes)
    _check_graph(g3, b)


def test_uncompressed_aligned_layout_is_memory_mapped_not_copied(tmp_path: Path) -> None:
    a = _fixture_arrays()
    root = _write_papers(tmp_path / "papers", a, save=_savez_aligned)
    g = load_dataset(f"ogb:{root}")
    _check_graph(g, a)
    data = (root / "raw" / "data.npz").resolve()
    assert isinstance(g.features, np.memmap) and Path(g.features.filename) == data
    assert "edges: memory-mapped from raw/data.npz (stored uncompressed)" in g.notes
    assert "features: memory-mapped from raw/data.npz (stored uncompressed)" in g.notes
    # Only labels and splits are cached: the big arrays stay in data.npz.
    assert _cached_files(root) == {
        "meta.json", "labels.npy", "train_idx.npy", "val_idx.npy", "test_idx.npy",
    }  # fmt: skip
    assert any(n.startswith("cache hit") for n in load_ogb(str(root)).notes)


def test_np_savez_layout_maps_the_aligned_member_and_caches_the_other(tmp_path: Path) -> None:
    # np.savez puts node_feat's data at an odd offset: it cannot be mapped for the kernels.
    a = _fixture_arrays()
    root = _write_papers(tmp_path / "papers", a, save=np.savez, label_save=np.savez)
    g = load_ogb(str(root))
    _check_graph(g, a)
    assert "edges: memory-mapped from raw/data.npz (stored uncompressed)" in g.notes
    assert any(
        n.startswith("features: node_feat is its data starts at byte") and "unaligned" in n
        for n in g.notes
    )
    assert "features.npy" in _cached_files(root) and "src.npy" not in _cached_files(root)


@pytest.mark.parametrize("save", [np.savez_compressed, np.savez])
def test_fortran_order_other_dtypes_and_small_blocks(tmp_path: Path, monkeypatch, save) -> None:
    a = _fixture_arrays(seed=2)
    b = dict(a)
    b["edge_index"] = np.asfortranarray(a["edge_index"].astype(">i4"))  # interleaved pairs
    b["node_feat"] = np.asfortranarray(a["node_feat"].astype(np.float64))
    b["node_label"] = a["node_label"].astype(np.float64)
    # 3000 bytes: 2 float64 feature rows a block; an edge row (2400 int32) split into blocks.
    monkeypatch.setattr(npzmember, "BLOCK_BYTES", 3000)
    root = _write_papers(tmp_path / "papers", b, save=save, label_save=save)
    g = load_ogb(str(root))
    _check_graph(g, a)
    assert "edges: edge_index is stored in Fortran order; read from the cache" in g.notes or (
        "edges: edge_index is stored compressed; read from the cache" in g.notes
    )
    assert not [p for p in root.rglob(".spill-*")]


def test_integer_labels_and_unwritable_directory(tmp_path: Path, monkeypatch) -> None:
    a = _fixture_arrays()
    b = dict(a)
    y = a["node_label"][:, 0]
    b["node_label"] = np.where(np.isnan(y), UNLABELED, y).astype(np.int64)  # 1-D, -1 = none
    root = _write_papers(tmp_path / "papers", b)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(ogb_cache.tempfile, "mkdtemp", refuse)
    g = load_ogb(str(root))
    _check_graph(g, a)
    assert any("cache not written" in n and "converted into memory instead" in n for n in g.notes)
    assert not (root / CACHE_DIRNAME).exists()


def test_interrupted_conversion_leaves_no_cache(tmp_path: Path, monkeypatch) -> None:
    root = _write_papers(tmp_path / "papers", _fixture_arrays())

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(ogb_npz, "_stream_features", crash)
    with pytest.raises(RuntimeError):
        load_ogb(str(root))
    assert not (root / CACHE_DIRNAME).exists()
    assert not [p for p in root.iterdir() if p.name.startswith(CACHE_TMP_PREFIX)]


def test_partition_cli_end_to_end(tmp_path: Path, capsys) -> None:
    a = _fixture_arrays()
    root = _write_papers(tmp_path / "ogbn_papers100M", a)
    out = tmp_path / "parts"
    argv = ["--dataset", f"ogb:{root}", "--parts", "2", "--out", str(out), "--threads", "1"]
    assert partition_main(argv) == 0
    assert f"partition written to {out}" in capsys.readouterr().out
    g = load_ogb(str(root))
    parts = [PartitionStore(out, k, verify=True) for k in range(2)]
    meta = parts[0].meta
    assert (meta["graph_sha256"], meta["num_nodes"], meta["num_edges"]) == (
        g.identity()["sha256"], N, g.num_edges,
    )  # fmt: skip
    solid = [p.orig_ids[: p.n_solid] for p in parts]
    np.testing.assert_array_equal(np.sort(np.concatenate(solid)), np.arange(N))
    for p, vids in zip(parts, solid, strict=True):  # the written rows are the fixture's
        np.testing.assert_array_equal(p.features, a["node_feat"][vids])
        np.testing.assert_array_equal(p.labels, g.labels[vids])
    train = np.sort(np.concatenate([p.orig_ids[p.train_idx] for p in parts]))
    np.testing.assert_array_equal(train, np.sort(a["train"]))


# --------------------------------------------------------------------------------------------
# Bad input: one line naming the file (and array) and what was expected
# --------------------------------------------------------------------------------------------


def _without(a: dict, key: str) -> dict:
    return {k: v for k, v in a.items() if k != key}


def _with(a: dict, **changes) -> dict:
    return {**a, **changes}


_A = _fixture_arrays()
_Y = _A["node_label"].copy()
_Y[_A["train"][0], 0] = 2.5
_E_OUT = _A["edge_index"].copy()
_E_OUT[1, 5] = N
_FEAT_NAN = _A["node_feat"].copy()
_FEAT_NAN[7, 3] = np.nan


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        (_without(_A, "node_feat"), r"raw/data\.npz: no array 'node_feat' \(expected raw/data"),
        (_without(_A, "num_edges_list"), r"data\.npz: no array 'num_edges_list'"),
        (
            _with(_A, edge_index=np.zeros((3, E), np.int64)),
            r"data\.npz: array 'edge_index': expected int\[2, E\].*got <i8\[3, 2400\]",
        ),
        (
            _with(_A, edge_index=_A["edge_index"].astype(np.float32)),
            r"array 'edge_index': expected int\[2, E\]",
        ),
        (
            _with(_A, num_edges_list=np.array([E + 1])),
            r"array 'edge_index': 2400 edges but num_edges_list declares 2401",
        ),
        (
            _with(_A, node_feat=_A["node_feat"][:-1]),
            r"array 'node_feat': 299 rows but num_nodes_list declares 300 vertices",
        ),
        (_with(_A, node_feat=_A["node_feat"][0]), r"array 'node_feat': expected real numbers"),
        (_with(_A, num_nodes_list=np.array([N, 5])), r"'num_nodes_list': 2 graphs"),
        (
            _with(_A, node_label=np.zeros((N, 2), np.float32)),
            r"node-label\.npz: array 'node_label': expected one class per vertex.*\[300, 2\]",
        ),
        (
            _with(_A, node_label=_Y),
            rf"node-label\.npz: node_label of vertex {_A['train'][0]}: label 2\.5 is not a class",
        ),
        (
            _with(_A, edge_index=_E_OUT),
            r"data\.npz: array 'edge_index': edge 5 has target 300, outside the 300 vertices",
        ),
        (
            _with(_A, node_feat=_FEAT_NAN),
            r"data\.npz: array 'node_feat': vertex 7: feature value is NaN or Inf",
        ),
        (
            _with(_A, train=np.append(_A["train"], np.flatnonzero(np.isnan(_Y[:, 0]))[0])),
            r"split/time/train\.csv\.gz: vertex \d+ has no label \(nan in node-label\.npz\)",
        ),
        (
            _with(_A, node_feat=np.array([[object()]] * N)),
            r"array 'node_feat': holds Python objects, which need pickle; not read",
        ),
    ],
)
def test_bad_arrays(tmp_path: Path, arrays: dict, message: str) -> None:
    root = _write_papers(tmp_path / "papers", arrays, save=_save_allowing_objects)
    with pytest.raises(InputError, match=message):
        load_ogb(str(root))
    assert not (root / CACHE_DIRNAME).exists()
    assert not [p for p in root.iterdir() if p.name.startswith(CACHE_TMP_PREFIX)]


def _save_allowing_objects(path: Path, **arrays: np.ndarray) -> None:
    """np.savez_compressed, except that an object array is pickled (as an attacker might)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for key, arr in arrays.items():
            buf = io.BytesIO()
            np.save(buf, arr, allow_pickle=True)
            zf.writestr(f"{key}.npy", buf.getvalue())


def test_out_of_range_edge_in_a_mapped_archive_names_data_npz(tmp_path: Path) -> None:
    root = _write_papers(tmp_path / "papers", _with(_A, edge_index=_E_OUT), save=_savez_aligned)
    with pytest.raises(InputError, match=r"raw/data\.npz: edge 5 \(\d+ -> 300\) has an endpoint"):
        load_ogb(str(root))


def test_missing_and_corrupt_files(tmp_path: Path) -> None:
    root = _write_papers(tmp_path / "papers", _A)
    data = root / "raw" / "data.npz"
    labels = root / "raw" / "node-label.npz"

    labels.rename(tmp_path / "labels.bak")
    with pytest.raises(InputError, match=r"raw/node-label\.npz: no such file \(expected raw/"):
        load_ogb(str(root))
    (tmp_path / "labels.bak").rename(labels)

    test_split = root / "split" / "time" / "test.csv.gz"
    test_split.rename(tmp_path / "test.bak")
    (root / "split" / "time" / "split_dict.pt").write_bytes(b"\x80\x04not read")
    with pytest.raises(InputError, match=r"test\.csv\.gz: no such file.*split_dict\.pt there"):
        load_ogb(str(root))
    (tmp_path / "test.bak").rename(test_split)

    whole = data.read_bytes()
    data.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match=r"raw/data\.npz: not a readable \.npz archive"):
        load_ogb(str(root))

    # Flip a byte inside the compressed edge data: decompression or the CRC check fails.
    with zipfile.ZipFile(io.BytesIO(whole)) as zf:
        info = zf.getinfo("edge_index.npy")
    corrupt = bytearray(whole)
    corrupt[info.header_offset + 200] ^= 0xFF
    data.write_bytes(bytes(corrupt))
    with pytest.raises(InputError, match=r"data\.npz: array 'edge_index': (corrupt|not a read)"):
        load_ogb(str(root))
    assert not (root / CACHE_DIRNAME).exists()


def test_stored_member_is_mapped_and_a_forged_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.npz"
    _savez_aligned(path, big=np.arange(1000, dtype=np.int64))
    member = npzmember.read_members(path)["big"]
    assert not member.compressed and member.data_offset % 64 == 0
    np.testing.assert_array_equal(npzmember.memmap(member), np.arange(1000))
    # Forge a member whose header and zip sizes claim 9000 values while the file holds 1000:
    # mapping it would fault on the missing pages, so it must be refused up front.
    whole = bytearray(path.read_bytes())
    whole[whole.index(b"(1000,)") : whole.index(b"(1000,)") + 7] = b"(9000,)"
    for signature, size_at in ((b"PK\x03\x04", 18), (b"PK\x01\x02", 20)):
        at = whole.index(signature) + size_at
        for field in (at, at + 4):  # compressed and uncompressed size
            (size,) = struct.unpack_from("<I", whole, field)
            struct.pack_into("<I", whole, field, size + 8000 * 8)
    path.write_bytes(bytes(whole))
    with pytest.raises(InputError, match=r"a\.npz: array 'big': truncated \(the file ends"):
        npzmember.read_members(path)
