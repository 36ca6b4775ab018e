"""Partitioning in bounded memory: the compact int32/int64 graph, the chunked CSR build, the
streamed feature and send-list writing, and the peak-memory record of ``partition.json``.
References are brute force (Python sets, ``np.unique``, ``np.save`` of the gathered rows)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import random_graph

from distmb.core.errors import InputError
from distmb.data import Graph, load_dataset
from distmb.data import csr as csr_module
from distmb.data.csr import array_chunks, build_csr, csr_edge_chunks
from distmb.data.datasets.edgelist import load_edgelist
from distmb.data.datasets.synthetic_config import MAX_NODES
from distmb.data.store.format import INT32_LIMIT, index_dtype
from distmb.data.store.rowfile import RowTake, write_row_file
from distmb.partition import assign as assign_module
from distmb.partition import partition_graph
from distmb.partition import writer as writer_module
from distmb.partition.writer import NpyWriter, save_npy, save_rows

REPO = Path(__file__).resolve().parents[1]
#: Linux counts RSS per thread and folds it in lazily: two readings may disagree by this much.
RSS_SLACK = 4 << 20


def brute_force_csr(src, dst, n, symmetrize, drop_self_loops=True):
    """(indptr, indices) from Python sets: the distinct sources of every target, sorted."""
    rows: list[set[int]] = [set() for _ in range(n)]
    for s, d in zip(np.asarray(src).tolist(), np.asarray(dst).tolist(), strict=True):
        if s == d and drop_self_loops:
            continue
        rows[d].add(s)
        if symmetrize:
            rows[s].add(d)
    indptr = np.zeros(n + 1, dtype=np.int64)
    indptr[1:] = np.cumsum([len(r) for r in rows])
    indices = np.array([u for r in rows for u in sorted(r)], dtype=np.int64)
    return indptr, indices


def partition_files(directory: Path, ignore_budget: bool = False) -> dict[str, bytes]:
    """Every file of a partition (``partition.json`` without its measured peak, and without
    the memory budget with ``ignore_budget``)."""
    out = {}
    for path in sorted(directory.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(directory).as_posix()
        if path.name == "partition.json":
            meta = json.loads(path.read_text())
            meta.pop("peak_memory")
            if ignore_budget:
                meta["partitioner"].pop("memory_budget_gib")
            out[rel] = json.dumps(meta).encode()
        else:
            out[rel] = path.read_bytes()
    return out


# ---- int32 / int64 ids --------------------------------------------------------------------


def test_index_dtype_boundary():
    assert INT32_LIMIT == 2**31 - 1
    assert index_dtype(0) == np.int32
    assert index_dtype(2**31 - 1) == np.int32  # ids 0 .. 2**31 - 2 fit
    assert index_dtype(2**31) == np.int64
    assert index_dtype(2**40) == np.int64
    assert index_dtype(MAX_NODES) == np.int32  # every synthetic graph has int32 indices


def test_build_csr_refuses_int32_beyond_the_limit_before_allocating():
    def never() -> list:
        raise AssertionError("no chunk may be read")

    with pytest.raises(ValueError, match="do not fit int32"):
        build_csr(never, 2**31, symmetrize=True, dtype=np.int32)
    with pytest.raises(ValueError, match="int32 or int64"):
        build_csr(never, 10, symmetrize=True, dtype=np.int16)


def test_loaders_build_int32_and_int64_graphs_partition_identically(tmp_path):
    graph = random_graph(n=700, m=4000, seed=3)
    assert graph.indices.dtype == np.int32
    wide = Graph(**{**graph.__dict__, "indices": graph.indices.astype(np.int64)})
    wide.validate()
    assert wide.identity() == graph.identity()  # indices hashed as int64 either way
    for name, g in (("narrow", graph), ("wide", wide)):
        partition_graph(g, 3, tmp_path / name, seed=4, replicate_halo_features=True)
    assert partition_files(tmp_path / "narrow") == partition_files(tmp_path / "wide")
    # METIS on an edge sample reads either id type alike.
    for name, g in (("narrow-s", graph), ("wide-s", wide)):
        budget = assign_module.metis_memory_bytes(g, 0.5, 3) / 2**30  # the same share for both
        meta = partition_graph(g, 3, tmp_path / name, seed=4, memory_budget_gib=budget)
        assert meta["partitioner"]["metis_edge_fraction"] == pytest.approx(0.5, abs=1e-3)
    assert partition_files(tmp_path / "narrow-s", ignore_budget=True) == partition_files(
        tmp_path / "wide-s", ignore_budget=True
    )


def test_sparsify_reads_int32_and_int64_alike():
    from distmb import _C

    graph = random_graph(n=500, m=5000, seed=1)
    a = _C.sparsify_symmetric(graph.indptr, graph.indices, 0.3, 5)
    b = _C.sparsify_symmetric(graph.indptr, graph.indices.astype(np.int64), 0.3, 5)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == np.int64
        np.testing.assert_array_equal(x, y)


def test_directed_graph_symmetrised_for_the_engines_in_chunks(monkeypatch):
    graph = random_graph(n=300, m=2000, seed=2, symmetrize=False)
    monkeypatch.setattr(csr_module, "EDGE_CHUNK", 17)
    dst = np.repeat(np.arange(300), np.diff(graph.indptr))
    ref = brute_force_csr(graph.indices, dst, 300, symmetrize=True)
    for chunk in (1, 17, 10**6):
        build = build_csr(csr_edge_chunks(graph.indptr, graph.indices, chunk), 300, symmetrize=True)
        np.testing.assert_array_equal(build.indptr, ref[0])
        np.testing.assert_array_equal(build.indices, ref[1])
    indptr, indices = assign_module.undirected_csr(graph)
    np.testing.assert_array_equal(indptr, ref[0])
    np.testing.assert_array_equal(indices, ref[1])
    assert indices.dtype == graph.indices.dtype


# ---- chunked CSR == brute force -----------------------------------------------------------


@pytest.mark.parametrize("symmetrize", [True, False])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint16])
@pytest.mark.parametrize("chunk", [1, 7, 1000, 10**6])
def test_chunked_csr_equals_brute_force(symmetrize, dtype, chunk):
    rng = np.random.default_rng(chunk)
    n, m = 60, 900  # many duplicates and self-loops
    src = rng.integers(0, n, m).astype(dtype)
    dst = rng.integers(0, n, m).astype(dtype)
    ref_ptr, ref_idx = brute_force_csr(src, dst, n, symmetrize)
    for out_dtype in (None, np.int64):
        build = build_csr(array_chunks(src, dst, chunk), n, symmetrize=symmetrize, dtype=out_dtype)
        assert build.indices.dtype == (np.int32 if out_dtype is None else np.int64)
        np.testing.assert_array_equal(build.indptr, ref_ptr)
        np.testing.assert_array_equal(build.indices, ref_idx)
        assert build.input_edges == m
        assert build.self_loops == int(np.sum(src == dst))
        scattered = (m - build.self_loops) * (2 if symmetrize else 1)
        assert build.duplicates == scattered - ref_idx.size


def test_chunked_csr_keeps_self_loops_when_asked():
    src, dst = np.array([0, 1, 1, 2]), np.array([0, 1, 2, 2])
    build = build_csr(array_chunks(src, dst, 2), 3, symmetrize=False, drop_self_loops=False)
    ref = brute_force_csr(src, dst, 3, False, drop_self_loops=False)
    np.testing.assert_array_equal(build.indptr, ref[0])
    np.testing.assert_array_equal(build.indices, ref[1])


def test_chunked_csr_from_a_memory_map_and_an_empty_graph(tmp_path):
    rng = np.random.default_rng(0)
    edges = rng.integers(0, 40, (300, 2)).astype(np.int32)
    np.save(tmp_path / "e.npy", edges)
    mapped = np.load(tmp_path / "e.npy", mmap_mode="r")
    build = build_csr(array_chunks(mapped[:, 0], mapped[:, 1], 32), 40, symmetrize=True)
    ref = brute_force_csr(edges[:, 0], edges[:, 1], 40, True)
    np.testing.assert_array_equal(build.indices, ref[1])
    empty = build_csr(lambda: iter(()), 5, symmetrize=True)
    assert empty.indptr.tolist() == [0] * 6 and empty.indices.size == 0


def test_chunked_csr_errors_name_the_edge_across_chunks():
    src = np.arange(10) % 5
    dst = src.copy()
    dst[7] = 5  # outside [0, 5)
    with pytest.raises(InputError, match=r"here: edge 7 \(2 -> 5\) has an endpoint outside"):
        build_csr(array_chunks(src, dst, 3), 5, symmetrize=True, source="here")
    with pytest.raises(InputError, match="here: edge sources must be integers"):
        build_csr(lambda: iter([(np.ones(2), np.ones(2))]), 5, symmetrize=True, source="here")
    with pytest.raises(InputError, match="3 edge sources but 2 targets"):
        Graph.from_edges(
            "x", np.zeros(3, int), np.zeros(2, int), 2, np.zeros((2, 1), np.float32),
            np.zeros(2, np.int64), *(np.zeros(0, np.int64),) * 3, 1,
        )  # fmt: skip


@pytest.mark.parametrize("first,second", [(10, 12), (12, 10)])
def test_chunked_csr_detects_chunks_that_change_between_passes(first, second):
    sizes = iter([first, second])

    def chunks():
        m = next(sizes)
        return iter([(np.arange(m) % 4, (np.arange(m) + 1) % 4)])

    with pytest.raises(RuntimeError, match="more edges than were counted|changed between"):
        build_csr(chunks, 4, symmetrize=False)


def test_csr_edge_chunks_by_rows_of_either_role():
    rng = np.random.default_rng(1)
    n = 50
    src, dst = rng.integers(0, n, 400), rng.integers(0, n, 400)
    ptr, idx = brute_force_csr(src, dst, n, symmetrize=False)  # in-edge CSR: rows = targets
    for chunk in (1, 9, 10**6):
        pairs = [
            (s, d) for a, b in csr_edge_chunks(ptr, idx, chunk)() for s, d in zip(a, b, strict=True)
        ]
        expected = [(int(u), v) for v in range(n) for u in idx[ptr[v] : ptr[v + 1]]]
        assert [(int(s), int(d)) for s, d in pairs] == expected
        flipped = [
            (int(s), int(d))
            for a, b in csr_edge_chunks(ptr, idx, chunk, rows_are_targets=False)()
            for s, d in zip(a, b, strict=True)
        ]
        assert flipped == [(d, s) for s, d in expected]


# ---- loaders in chunks ----------------------------------------------------------------------


def _write_edge_dir(d: Path, n: int = 80, m: int = 500, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True)
    edges = rng.integers(0, n, (m, 2))
    np.save(d / "labels.npy", rng.integers(0, 3, n))
    np.save(d / "features.npy", rng.standard_normal((n, 4)).astype(np.float32))
    return edges


def test_edgelist_chunks_equal_whole_file(tmp_path, monkeypatch):
    from distmb.data.datasets import edgelist as edgelist_module

    edges = _write_edge_dir(tmp_path / "c")
    np.save(tmp_path / "c" / "edges.npy", edges)
    reference = load_edgelist(str(tmp_path / "c"))
    ref = brute_force_csr(edges[:, 0], edges[:, 1], 80, True)
    np.testing.assert_array_equal(reference.indices, ref[1])
    assert isinstance(reference.features, np.memmap)  # float32 features stay mapped
    monkeypatch.setattr(edgelist_module, "EDGE_CHUNK", 13)
    monkeypatch.setattr(edgelist_module, "_TEXT_BLOCK_BYTES", 50)  # lines span blocks
    _write_edge_dir(tmp_path / "f")
    np.save(tmp_path / "f" / "edges.npy", np.asfortranarray(edges))  # Fortran order
    _write_edge_dir(tmp_path / "t")
    text = "# header\n" + "".join(f"{u} {v}  # c\n" for u, v in edges)
    (tmp_path / "t" / "edges.txt").write_text(text)
    for name in ("c", "f", "t"):
        g = load_edgelist(str(tmp_path / name))
        np.testing.assert_array_equal(g.indptr, reference.indptr)
        np.testing.assert_array_equal(g.indices, reference.indices)
        assert g.notes[-1] == reference.notes[-1]


def test_edgelist_chunk_errors_name_the_edge_or_line(tmp_path, monkeypatch):
    from distmb.data.datasets import edgelist as edgelist_module

    monkeypatch.setattr(edgelist_module, "EDGE_CHUNK", 4)
    monkeypatch.setattr(edgelist_module, "_TEXT_BLOCK_BYTES", 8)
    edges = _write_edge_dir(tmp_path / "n", n=10, m=20) % 10
    edges[13] = (3, 10)
    np.save(tmp_path / "n" / "edges.npy", edges)
    with pytest.raises(InputError, match=r"edges\.npy: edge 13: 3 -> 10 has a vertex id outside"):
        load_edgelist(str(tmp_path / "n"))
    _write_edge_dir(tmp_path / "t", n=10, m=20)
    lines = [f"{u} {v}" for u, v in edges]
    lines.insert(5, "# a comment")
    (tmp_path / "t" / "edges.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"edges\.txt: line 15: 3 -> 10 has a vertex id"):
        load_edgelist(str(tmp_path / "t"))
    lines[9] = "1 x"
    (tmp_path / "t" / "edges.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"edges\.txt: line 10: expected two integer"):
        load_edgelist(str(tmp_path / "t"))


def test_float64_features_are_converted_in_blocks(tmp_path, monkeypatch):
    from distmb.data.datasets import loader_utils

    monkeypatch.setattr(loader_utils, "_CONVERT_ROWS", 7)
    edges = _write_edge_dir(tmp_path / "d")
    np.save(tmp_path / "d" / "edges.npy", edges)
    wide = np.random.default_rng(2).standard_normal((80, 4))
    np.save(tmp_path / "d" / "features.npy", wide)
    g = load_edgelist(str(tmp_path / "d"))
    assert g.features.dtype == np.float32 and not isinstance(g.features, np.memmap)
    np.testing.assert_array_equal(g.features, wide.astype(np.float32))


# ---- streamed writing -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "array",
    [
        np.arange(10, dtype=np.int32),
        np.arange(12, dtype=np.int64).reshape(4, 3),
        np.zeros((0, 5), dtype=np.float32),
        np.random.default_rng(0).standard_normal((33, 7)).astype(np.float32),
    ],
)
def test_npy_writer_bytes_equal_np_save(tmp_path, array):
    np.save(tmp_path / "ref.npy", array)
    out = NpyWriter(tmp_path / "a.npy", array.dtype, array.shape)
    for lo in range(0, max(array.shape[0], 1), 5):
        out.write(array[lo : lo + 5])
    out.close()
    assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "ref.npy").read_bytes()
    assert save_npy(tmp_path / "b.npy", array) == out.out.sha.hexdigest()


def test_npy_writer_refuses_wrong_rows(tmp_path):
    out = NpyWriter(tmp_path / "a.npy", np.float32, (4, 2))
    with pytest.raises(ValueError, match="does not continue"):
        out.write(np.zeros((1, 3), np.float32))
    out.write(np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="more rows"):
        out.write(np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="bytes short"):
        out.close()


def test_streamed_feature_rows_equal_the_gathered_table(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "FEATURE_CHUNK_BYTES", 3 * 4 * 6)  # 3 rows a chunk
    table = np.random.default_rng(1).standard_normal((50, 6)).astype(np.float32)
    ids = np.sort(np.random.default_rng(2).choice(50, 20, replace=False))
    save_rows(tmp_path / "s.npy", RowTake(table, ids))
    np.save(tmp_path / "ref.npy", table[ids])
    assert (tmp_path / "s.npy").read_bytes() == (tmp_path / "ref.npy").read_bytes()
    streamed = write_row_file(tmp_path / "s.bin", RowTake(table, ids), chunk_rows=3)
    whole = write_row_file(tmp_path / "w.bin", table[ids])
    assert streamed == whole
    assert (tmp_path / "s.bin").read_bytes() == (tmp_path / "w.bin").read_bytes()


@pytest.mark.parametrize("layout", ["npy", "ooc"])
def test_partition_from_memory_mapped_features_equals_in_memory(tmp_path, monkeypatch, layout):
    monkeypatch.setattr(writer_module, "FEATURE_CHUNK_BYTES", 5 * 4 * 5)
    graph = random_graph(n=400, m=2500, seed=6)
    np.save(tmp_path / "f.npy", graph.features)
    mapped = Graph(**{**graph.__dict__, "features": np.load(tmp_path / "f.npy", mmap_mode="r")})
    for name, g in (("mem", graph), ("map", mapped)):
        partition_graph(
            g, 4, tmp_path / name, seed=2, replicate_halo_features=True, features_layout=layout
        )
    assert partition_files(tmp_path / "mem") == partition_files(tmp_path / "map")
    from test_partition import check_partition

    if layout == "npy":
        check_partition(graph, tmp_path / "map", 4, halo_features=True)


def test_send_lists_from_scratch_files_and_nothing_left_behind(tmp_path):
    graph = random_graph(n=500, m=3000, seed=9)
    partition_graph(graph, 5, tmp_path / "p", seed=1)
    from test_partition import check_partition  # send lists == brute force halo owners

    check_partition(graph, tmp_path / "p", 5)
    assert not (tmp_path / "p" / ".scratch").exists()
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_rebalance_neighbour_counts_in_blocks_equal_brute_force(monkeypatch):
    graph = random_graph(n=300, m=3000, seed=4)
    part_of = np.random.default_rng(0).integers(0, 4, 300).astype(np.int32)
    vertices = np.sort(np.random.default_rng(1).choice(300, 120, replace=False))
    expected = np.zeros((120, 4), dtype=np.int64)
    for i, v in enumerate(vertices):
        for u in graph.indices[graph.indptr[v] : graph.indptr[v + 1]]:
            expected[i, part_of[u]] += 1
    for chunk in (1, 5, 1 << 23):
        monkeypatch.setattr(assign_module, "NEIGHBOUR_COUNT_CHUNK", chunk)
        got = assign_module.neighbour_part_counts(graph.indptr, graph.indices, part_of, vertices, 4)
        np.testing.assert_array_equal(got, expected)


def test_synthetic_rounds_compact_in_place_across_blocks(monkeypatch):
    from distmb.data.datasets import synthetic

    rng = np.random.default_rng(3)
    values = np.sort(rng.integers(0, 40, 200))
    buf = values.copy()
    monkeypatch.setattr(synthetic, "_EDGE_CHUNK", 7)
    kept = synthetic._compact(buf, buf.shape[0], synthetic._distinct_in_sorted)
    synthetic._shrink(buf, kept)
    np.testing.assert_array_equal(buf, np.unique(values))
    drop = np.zeros(200, dtype=bool)
    drop[rng.choice(200, 50, replace=False)] = True
    buf = values.copy()
    kept = synthetic._compact(buf, 200, lambda block, lo, prev: ~drop[lo : lo + block.size])
    np.testing.assert_array_equal(buf[:kept], values[~drop])


# ---- peak memory in partition.json ------------------------------------------------------


def test_peak_memory_recorded_and_sane(tmp_path):
    out = tmp_path / "p"
    script = (
        "import sys\n"
        "from distmb.cli.partition import main\n"
        "from distmb.core.progress import peak_rss_bytes\n"
        "main(sys.argv[1:])\n"
        "print('FINAL_PEAK', peak_rss_bytes())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", script, "--dataset", "synthetic:nodes=20000,avg_degree=10",
         "--parts", "3", "--out", str(out), "--threads", "1"],
        capture_output=True, text=True, env=env, check=True, cwd=REPO,
    )  # fmt: skip
    final = int(proc.stdout.split("FINAL_PEAK")[1])
    meta = json.loads((out / "partition.json").read_text())
    peak = meta["peak_memory"]
    assert set(peak) == {
        "peak_rss_bytes",
        "feature_bytes",
        "bytes_per_edge",
        "bytes_per_edge_beyond_features",
    }
    graph = load_dataset("synthetic:nodes=20000,avg_degree=10")
    edges = graph.num_edges
    assert meta["num_edges"] == edges == 200_000
    assert peak["feature_bytes"] == graph.features.nbytes == 20000 * 100 * 4
    # The record is this process' own high-water mark: at least its graph, at most the peak
    # the process reached by its end (it only printed afterwards), give or take the kernel's
    # per-thread RSS counting slack.
    assert graph.nbytes < peak["peak_rss_bytes"] <= final + RSS_SLACK
    assert peak["bytes_per_edge"] == round(peak["peak_rss_bytes"] / edges, 2)
    assert peak["bytes_per_edge_beyond_features"] == round(
        (peak["peak_rss_bytes"] - peak["feature_bytes"]) / edges, 2
    )
    assert "bytes per directed edge" in proc.stderr and "beyond the" in proc.stderr


def test_peak_memory_is_this_process_not_its_parent():
    """A child started from a large parent reports its own peak (VmHWM), not the parent's
    (``ru_maxrss`` carries the parent's resident set over exec)."""
    ballast = np.ones(300 << 17)  # 300 MiB resident in this (parent) process
    code = "from distmb.core.progress import peak_rss_bytes; print(peak_rss_bytes())"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = int(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        ).stdout
    )
    assert ballast.sum() > 0
    assert child < 250 << 20


# ---- the engine phase without the graph's big arrays in memory ----------------------------


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="spilling needs /proc/self/fd")
def test_spilled_arrays_leave_memory_and_come_back_equal(tmp_path, monkeypatch):
    from distmb.partition import spill

    graph = random_graph(n=1000, m=5000, seed=1)
    big = np.random.default_rng(0).standard_normal((1000, 32768), dtype=np.float32)  # 125 MiB
    graph.features = big.copy()
    indices = graph.indices.copy()
    monkeypatch.setattr(spill, "SPILL_MIN_BYTES", 1)
    before = _rss()
    with spill.spilled(graph, directory=tmp_path) as names:
        assert names == ["indices", "features"]
        assert all(spill.is_file_backed(getattr(graph, n)) for n in names)
        assert list(tmp_path.iterdir()) == []  # unlinked at once
        dropped = before - _rss()
        assert dropped > 100 << 20, dropped  # the anonymous copy is gone
        np.testing.assert_array_equal(graph.features, big)  # read back through the map
        read = _rss() - (before - dropped)
        assert read > 100 << 20, read  # ... which made its pages resident
        old = graph.features
        spill.release_pages(graph)
        assert graph.features is not old
        del old
        assert before - _rss() > 100 << 20  # a fresh map holds no resident page
        np.testing.assert_array_equal(graph.indices, indices)
        assert spill.resident_nbytes(graph) == graph.nbytes - big.nbytes - indices.nbytes
    np.testing.assert_array_equal(graph.features, big)  # still readable after the block
    with pytest.raises(ValueError, match="read-only"):
        graph.features[0, 0] = 1.0


def test_spill_is_skipped_when_small_or_already_mapped(tmp_path):
    from distmb.partition import spill

    graph = random_graph(n=200, m=800, seed=2)
    np.save(tmp_path / "f.npy", graph.features)
    graph.features = np.load(tmp_path / "f.npy", mmap_mode="r")
    with spill.spilled(graph, directory=tmp_path / "..") as names:
        assert names == []  # indices are small; features are a map already (reopened)
        assert spill.is_file_backed(graph.features)
        assert not spill.is_file_backed(graph.indices)


def test_partition_identical_with_and_without_spilling(tmp_path, monkeypatch):
    from distmb.partition import spill

    graph = random_graph(n=600, m=4000, seed=5)
    reference = Graph(**graph.__dict__)
    monkeypatch.setattr(spill, "SPILL_MIN_BYTES", 1 << 62)
    partition_graph(reference, 3, tmp_path / "kept", seed=3, replicate_halo_features=True)
    monkeypatch.setattr(spill, "SPILL_MIN_BYTES", 1)
    partition_graph(graph, 3, tmp_path / "spilled", seed=3, replicate_halo_features=True)
    assert spill.is_file_backed(graph.indices) and spill.is_file_backed(graph.features)
    assert partition_files(tmp_path / "kept") == partition_files(tmp_path / "spilled")
