"""NeighborFile (distmb.data.store.neighborfile): in-neighbour lists read from the indices file on
disk behind a static cache, against the in-memory CSR, and the sampler reading through it
(blocks identical to the in-memory sampler's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from distmb import _C
from distmb.core.errors import PartitionError
from distmb.data import PartitionStore, load_dataset
from distmb.data.store.neighborfile import NeighborFile, cache_priority, npy_data_offset
from distmb.partition import partition_graph
from distmb.pipeline.sample import FANOUT_ALL, NeighborSampler

SMALL = "synthetic:nodes=3000,avg_degree=8,feat_dim=16,classes=4"
DTYPES = [np.int32, np.int64]
#: Cache budgets, as a fraction of the bytes of all lists: none, a few lists, all of them.
BUDGETS = [0.0, 0.05, 2.0]
FANOUTS = [[2], [3, 5], [FANOUT_ALL, 4], [1, FANOUT_ALL, 2], [FANOUT_ALL]]


class Csr:
    """A part-like local CSR: solid rows ``[0, n_solid)``, sources in ``[0, n_local)``, with
    empty rows, unsorted rows and a few hubs."""

    def __init__(self, n_solid: int, n_halo: int, max_degree: int, seed: int, dtype: type):
        rng = np.random.default_rng(seed)
        self.n_solid, self.n_local = n_solid, n_solid + n_halo
        degrees = rng.integers(0, max_degree + 1, n_solid)
        degrees[rng.choice(n_solid, max(1, n_solid // 50), replace=False)] = min(
            self.n_local - 1, 6 * max_degree
        )
        rows = [
            rng.permutation(np.delete(np.arange(self.n_local), v))[:d]
            for v, d in enumerate(degrees)
        ]
        self.indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
        self.indices = np.concatenate(rows).astype(dtype)

    def row(self, v: int) -> np.ndarray:
        return self.indices[self.indptr[v] : self.indptr[v + 1]]

    def save(self, path: Path) -> Path:
        np.save(path, self.indices)
        return path

    def list_bytes(self) -> int:
        return int(self.indices.nbytes)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict:
    out = {}
    base = tmp_path_factory.mktemp("nbr")
    for dtype in DTYPES:
        g = Csr(2000, 300, 12, seed=7, dtype=dtype)
        out[np.dtype(dtype).name] = (g, g.save(base / f"indices_{np.dtype(dtype).name}.npy"))
    return out


def opened(g: Csr, path: Path, budget: float = 0.0, **kw) -> NeighborFile:
    nf = NeighborFile.from_npy(path, g.indptr, g.n_local, **kw)
    if budget:
        nf.fill(cache_priority(g.indptr), int(budget * g.list_bytes()))
    return nf


def same_blocks(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x.n_dst, x.n_src, x.n_halo) == (y.n_dst, y.n_src, y.n_halo)
        assert np.array_equal(x.src_ids.numpy(), y.src_ids.numpy())
        assert np.array_equal(x.indptr.numpy(), y.indptr.numpy())
        assert np.array_equal(x.indices.numpy(), y.indices.numpy())


def with_threads(n: int):
    class Threads:
        def __enter__(self):
            self.before = _C.get_num_threads()
            _C.set_num_threads(n)

        def __exit__(self, *exc):
            _C.set_num_threads(self.before)

    return Threads()


# -- the file and fetch ---------------------------------------------------------------------
def test_npy_data_offset(tmp_path):
    arr = np.arange(10, dtype=np.int32)
    np.save(tmp_path / "a.npy", arr)
    offset, dtype, shape, fortran = npy_data_offset(tmp_path / "a.npy")
    assert offset == np.load(tmp_path / "a.npy", mmap_mode="r").offset
    assert (dtype, shape, fortran) == (np.dtype(np.int32), (10,), False)
    raw = (tmp_path / "a.npy").read_bytes()
    assert np.array_equal(np.frombuffer(raw[offset:], np.int32), arr)
    with pytest.raises(PartitionError, match="missing.npy"):
        npy_data_offset(tmp_path / "missing.npy")


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("direct", [True, False])
def test_fetch_matches_indices(graphs, dtype, budget, direct):
    g, path = graphs[dtype]
    rng = np.random.default_rng(1)
    with opened(g, path, budget, direct=direct) as nf:
        assert nf.dtype == np.dtype(dtype) and nf.num_entries == g.indices.size
        assert nf.direct == direct or nf.fallback_reason
        cases = [
            rng.integers(0, g.n_solid, 500),  # random, with repeats
            np.repeat(rng.integers(0, g.n_solid, 20), 3),  # duplicates adjacent
            rng.permutation(g.n_solid),  # every list, unsorted
            np.arange(g.n_solid)[::-1].copy(),  # descending
            np.zeros(0, dtype=np.int64),  # nothing
            np.flatnonzero(np.diff(g.indptr) == 0)[:5],  # empty lists only
        ]
        requested = 0
        for dst in cases:
            starts, lists = nf.fetch(dst)
            assert starts.dtype == np.int64 and lists.dtype == np.dtype(dtype)
            assert starts.shape == (dst.size + 1,) and starts[0] == 0
            for i, v in enumerate(dst):
                assert np.array_equal(lists[starts[i] : starts[i + 1]], g.row(int(v)))
            requested += dst.size
        c = nf.counters()
        assert c["lists_requested"] == requested
        assert c["cache_hits"] + c["cache_misses"] == requested
        assert c["lists_read"] <= c["cache_misses"]
        if budget == 0:
            assert c["cache_hits"] == 0 and nf.cache_bytes == 0 and nf.cache_vertices == 0
        if budget >= 1:
            # Every list cached: nothing read from disk.
            assert nf.cache_vertices == g.n_solid and nf.cache_entries == g.indices.size
            assert c["cache_hits"] == requested
            assert c["bytes_read"] == c["lists_read"] == c["read_requests"] == 0
        else:
            assert c["bytes_read"] >= c["entries_read"] * g.indices.itemsize > 0
            assert c["read_requests"] >= 1  # bytes_read: short only at the end of the file
            assert c["read_seconds"] > 0
        if 0 < budget < 1:
            assert 0 < c["cache_hits"] < requested
        nf.reset_counters()
        assert nf.counters()["lists_requested"] == nf.counters()["bytes_read"] == 0


def test_fill_takes_a_prefix_within_the_budget(graphs):
    g, path = graphs["int64"]
    deg = np.diff(g.indptr)
    order = cache_priority(g.indptr)
    assert np.all(np.diff(deg[order]) <= 0)  # degree order: descending
    with opened(g, path) as nf:
        budget = int(deg[order[:10]].sum() * 8 + deg[order[10]] * 8 - 1)  # 11th does not fit
        assert nf.fill(order, budget) == 10
        assert nf.cache_entries == deg[order[:10]].sum()
        assert nf.cache_bytes == nf.cache_entries * 8 + g.n_solid * 8  # lists + address table
        c = nf.counters()
        assert c["lists_requested"] == c["bytes_read"] == 0  # fill is not a fetch
        nf.fetch(order[:12])
        assert nf.counters()["cache_hits"] == 10
        # Repeats are skipped, not charged; a refill replaces the cache.
        assert nf.fill(np.repeat(order[:3], 2), int(deg[order[:3]].sum() * 8)) == 3
        assert nf.fill(order, 0) == 0 and nf.cache_bytes == 0
        with pytest.raises(IndexError, match="outside the solid range"):
            nf.fill(np.array([g.n_solid]), 1 << 20)
        with pytest.raises(IndexError, match="outside the solid range"):
            nf.fetch(np.array([0, -1]))


def test_ratio_priority(graphs):
    g, _ = graphs["int32"]
    order = cache_priority(g.indptr, "ratio", indices=g.indices, n_local=g.n_local)
    assert np.array_equal(np.sort(order), np.arange(g.n_solid))
    deg = np.diff(g.indptr)
    out = np.bincount(g.indices, minlength=g.n_local)[: g.n_solid]
    ratio = np.where(deg > 0, out / np.maximum(deg, 1), -1.0)
    assert np.all(np.diff(ratio[order]) <= 1e-12)
    with pytest.raises(ValueError, match="expected one of"):
        cache_priority(g.indptr, "lru")


def test_large_lists_and_partial_overlaps(tmp_path):
    """Lists far above the 1 MiB request cap, and lists sharing aligned blocks."""
    degrees = np.array([3, 700_000, 5, 1, 0, 2000, 400_000, 7])
    n_local = 800_000
    rng = np.random.default_rng(3)
    indices = rng.integers(0, n_local, int(degrees.sum())).astype(np.int64)
    indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64)
    path = tmp_path / "big.npy"
    np.save(path, indices)
    with NeighborFile.from_npy(path, indptr, n_local) as nf:
        dst = np.array([6, 1, 0, 2, 3, 4, 5, 7, 1, 6])
        starts, lists = nf.fetch(dst)
        for i, v in enumerate(dst):
            assert np.array_equal(
                lists[starts[i] : starts[i + 1]], indices[indptr[v] : indptr[v + 1]]
            )


# -- errors ---------------------------------------------------------------------------------
def test_truncated_file(graphs, tmp_path):
    g, path = graphs["int32"]
    short = tmp_path / "short.npy"
    short.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(PartitionError, match=r"short\.npy.*truncated"):
        NeighborFile.from_npy(short, g.indptr, g.n_local)
    # Truncated after opening: the read that reaches the end names the file.
    copy = tmp_path / "copy.npy"
    copy.write_bytes(path.read_bytes())
    nf = NeighborFile.from_npy(copy, g.indptr, g.n_local)
    sampler = NeighborSampler(g.indptr, nf, g.n_solid, g.n_local, [FANOUT_ALL], 0)
    with open(copy, "r+b") as f:
        f.truncate(nf.offset + 40)
    with pytest.raises(PartitionError, match=r"copy\.npy.*end of file"):
        nf.fetch(np.arange(g.n_solid))
    with pytest.raises(PartitionError, match=r"copy\.npy"):
        sampler.sample(np.arange(g.n_solid), 0, 0)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_corrupt_ids(graphs, tmp_path, dtype):
    g, path = graphs[dtype]
    bad = g.indices.copy()
    v = int(np.flatnonzero(np.diff(g.indptr) > 2)[3])
    e = int(g.indptr[v]) + 1
    bad[e] = g.n_local  # one past the last local vertex
    bad_path = tmp_path / "corrupt.npy"
    np.save(bad_path, bad)
    nf = NeighborFile.from_npy(bad_path, g.indptr, g.n_local)
    msg = rf"corrupt\.npy is corrupt: indices\[{e}\] = {g.n_local} .*VID_p {v}.*n_local={g.n_local}"
    with pytest.raises(PartitionError, match=msg):
        nf.fetch(np.array([0, v, 1]))
    others = np.delete(np.arange(g.n_solid), v)
    starts, lists = nf.fetch(others)  # the other lists are intact
    assert np.array_equal(lists[starts[0] : starts[1]], g.row(int(others[0])))
    sampler = NeighborSampler(g.indptr, nf, g.n_solid, g.n_local, [FANOUT_ALL], 0)
    with pytest.raises(PartitionError, match=msg):
        sampler.sample(np.array([v]), 0, 0)
    sampler.sample(others[:50], 0, 0)  # still usable after the error
    with pytest.raises(PartitionError, match=msg):  # a cache fill checks its lists too
        nf.fill(np.array([v]), 1 << 20)
    assert nf.cache_vertices == 0
    negative = g.indices.copy()
    negative[e] = -5
    np.save(bad_path, negative)
    with pytest.raises(PartitionError, match=rf"indices\[{e}\] = -5"):
        NeighborFile.from_npy(bad_path, g.indptr, g.n_local).fetch(np.array([v]))


def test_mismatched_files_are_refused(graphs, tmp_path):
    g, path = graphs["int64"]
    with pytest.raises(PartitionError, match=r"expected a native-order int32 or int64"):
        NeighborFile.from_npy(path, g.indptr[:-1], g.n_local)
    np.save(tmp_path / "f.npy", g.indices.astype(np.float64))
    with pytest.raises(PartitionError, match=r"f\.npy: float64"):
        NeighborFile.from_npy(tmp_path / "f.npy", g.indptr, g.n_local)
    with pytest.raises(PartitionError, match="missing"):
        NeighborFile.from_npy(tmp_path / "none.npy", g.indptr, g.n_local)
    nf = NeighborFile.from_npy(path, g.indptr, g.n_local)
    with pytest.raises(ValueError, match="n_local"):
        NeighborSampler(g.indptr, nf, g.n_solid, g.n_local + 1, [2], 0)
    nf.close()
    assert nf.closed
    with pytest.raises(ValueError, match="closed"):
        nf.fetch(np.array([0]))
    with pytest.raises(ValueError, match="closed"):
        NeighborSampler(g.indptr, nf, g.n_solid, g.n_local, [2], 0)


# -- the sampler through it -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("threads", [1, 2])
def test_blocks_identical_to_in_memory(graphs, dtype, budget, threads):
    g, path = graphs[dtype]
    rng = np.random.default_rng(11)
    with with_threads(threads), opened(g, path, budget) as nf:
        for fanouts in FANOUTS:
            for seed in (0, 5):
                mem = NeighborSampler(g.indptr, g.indices, g.n_solid, g.n_local, fanouts, seed)
                ooc = NeighborSampler(g.indptr, nf, g.n_solid, g.n_local, fanouts, seed)
                assert ooc.neighbor_file is nf and mem.neighbor_file is None
                for it in range(3):
                    seeds = rng.choice(g.n_solid, int(rng.integers(1, 400)), replace=False)
                    same_blocks(mem.sample(seeds, 1, it), ooc.sample(seeds, 1, it))
        dst = rng.permutation(g.n_solid)[:700]
        same_blocks([mem.full_block(dst)], [ooc.full_block(dst)])
        same_blocks([mem.sample_hop(dst, 3, 2, 9)], [ooc.sample_hop(dst, 3, 2, 9)])
        c = nf.counters()
        assert c["cache_hits"] + c["cache_misses"] == c["lists_requested"] > 0
        # Duplicate seeds are still refused (after the fetch), and the sampler stays usable.
        with pytest.raises(ValueError, match="distinct"):
            ooc.sample(np.array([1, 2, 1]), 0, 0)
        same_blocks(mem.sample(np.array([1, 2]), 0, 0), ooc.sample(np.array([1, 2]), 0, 0))


def test_thread_counts_agree_on_a_large_batch(graphs):
    """Enough edges per layer that every pass of the sampler and the reads use 2 threads."""
    g, path = graphs["int32"]
    seeds = np.arange(g.n_solid)
    results = []
    for threads in (1, 2):
        with with_threads(threads), opened(g, path, 0.05) as nf:
            sampler = NeighborSampler(g.indptr, nf, g.n_solid, g.n_local, [FANOUT_ALL, 8], 3)
            results.append(sampler.sample(seeds, 0, 0))
    same_blocks(*results)
    mem = NeighborSampler(g.indptr, g.indices, g.n_solid, g.n_local, [FANOUT_ALL, 8], 3)
    same_blocks(results[0], mem.sample(seeds, 0, 0))


@pytest.mark.parametrize("cache_mb", [0.0, 0.01, 64.0])
def test_partition_store_samples_identically(tmp_path_factory, cache_mb):
    directory = tmp_path_factory.getbasetemp() / "nbr_partition"
    if not (directory / "partition.json").is_file():
        partition_graph(load_dataset(SMALL), 2, directory, seed=0)
    for part in range(2):
        store = PartitionStore(directory, part)
        for priority in ("degree", "ratio"):
            nf = NeighborFile.from_store(store, cache_mb, priority)
            assert nf.dtype == store.indices.dtype and nf.num_entries == store.indices.shape[0]
            if cache_mb >= 64:
                assert nf.cache_vertices == store.n_solid
            elif cache_mb > 0:
                assert 0 < nf.cache_vertices < store.n_solid
                assert nf.cache_bytes - store.n_solid * 8 <= cache_mb * (1 << 20)
            fanouts = [5, 10]
            mem = NeighborSampler(
                store.indptr, store.indices, store.n_solid, store.n_local, fanouts, 1
            )
            ooc = NeighborSampler(store.indptr, nf, store.n_solid, store.n_local, fanouts, 1)
            train = np.asarray(store.train_idx)
            for it in range(4):
                seeds = train[it * 64 : (it + 1) * 64]
                same_blocks(mem.sample(seeds, 2, it), ooc.sample(seeds, 2, it))
            dst = np.arange(min(store.n_solid, 500))
            same_blocks([mem.full_block(dst)], [ooc.full_block(dst)])
            c = nf.counters()
            assert c["cache_hits"] + c["cache_misses"] == c["lists_requested"]
            if cache_mb == 0:
                assert c["cache_hits"] == 0 and c["bytes_read"] > 0
            nf.close()
