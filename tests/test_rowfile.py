"""Row files (distmb.data.store.rowfile): the layout, and reads by id against the in-memory numpy
table they were written from (direct and buffered, coalescing, fallback, errors)."""

from __future__ import annotations

import hashlib
import math
import os
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from distmb import _C
from distmb.core.errors import PartitionError
from distmb.data.store import rowfile as rowfile_module
from distmb.data.store.rowfile import (
    COALESCE_GAP,
    DIRECT_IO_ALIGN,
    RowFile,
    coalesce_gap,
    evict_page_cache,
    row_file_size,
    row_stride,
    set_coalesce_gap,
    write_row_file,
)

#: Row widths whose strides lie below (4, 16, 512 bytes), at (4096) and above (8192) the
#: alignment; 128 has a row exactly a power of two.
DIMS = [1, 3, 100, 128, 1024, 1500]


def make_table(n: int, dim: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def written(tmp_path: Path, table: np.ndarray, name: str = "x.rows", **kw) -> tuple[Path, dict]:
    path = tmp_path / name
    meta = write_row_file(path, table, **kw)
    return path, meta


def open_rows(path: Path, meta: dict, **kw) -> RowFile:
    n, dim = meta["shape"]
    return RowFile(path, n, dim, meta["row_stride"], align=meta["align"], **kw)


def expected_blocks(ids: np.ndarray, row_bytes: int, stride: int, align: int) -> set[int]:
    """Aligned blocks holding the rows of ``ids``, from the layout alone."""
    blocks: set[int] = set()
    for i in np.unique(ids):
        start = int(i) * stride
        blocks.update(range(start // align, -(-(start + row_bytes) // align)))
    return blocks


def expected_requests(
    ids: np.ndarray, row_bytes: int, stride: int, align: int, max_request: int
) -> list[tuple[int, int]]:
    """(offset, length) of the read requests the documented rule makes: distinct rows in file
    order, each widened to ``align``; a row joins the open request when it lies inside it, or
    starts within coalesce_gap() bytes of its end and the request stays within ``max_request``."""
    requests: list[list[int]] = []
    for i in np.unique(ids):
        start = int(i) * stride
        lo, hi = start // align * align, -(-(start + row_bytes) // align) * align
        if requests:
            offset, length = requests[-1]
            end = offset + length
            if hi <= end or (lo <= end + coalesce_gap() and hi - offset <= max_request):
                requests[-1][1] = max(end, hi) - offset
                continue
        requests.append([lo, hi - lo])
    return [(o, n) for o, n in requests]


# -- layout -----------------------------------------------------------------------------------
def test_row_stride_formula():
    assert [row_stride(b) for b in (1, 4, 12, 400, 512, 4096, 4097, 6000, 8192)] == [
        1, 4, 16, 512, 512, 4096, 8192, 8192, 8192
    ]  # fmt: skip
    assert row_stride(12, align=8) == 16 and row_stride(100, align=64) == 128
    for b in range(1, 3 * DIRECT_IO_ALIGN, 97):
        s = row_stride(b)
        assert s >= b
        if b <= DIRECT_IO_ALIGN:
            assert s & (s - 1) == 0 and s < 2 * b  # smallest power of two >= b
        else:
            assert s % DIRECT_IO_ALIGN == 0 and s - b < DIRECT_IO_ALIGN
    with pytest.raises(ValueError, match="power of two"):
        row_stride(8, align=3000)
    assert row_file_size(3, 16) == DIRECT_IO_ALIGN and row_file_size(0, 16) == 0


@pytest.mark.parametrize("dim", DIMS)
def test_layout_and_metadata(tmp_path, dim):
    n = 37
    table = make_table(n, dim)
    path, meta = written(tmp_path, table)
    stride = row_stride(dim * 4)
    assert meta == {
        "dtype": "float32",
        "shape": [n, dim],
        "row_stride": stride,
        "align": DIRECT_IO_ALIGN,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }
    raw = np.fromfile(path, dtype=np.uint8)
    assert raw.size == math.ceil(n * stride / DIRECT_IO_ALIGN) * DIRECT_IO_ALIGN
    body = raw[: n * stride].reshape(n, stride)
    assert np.array_equal(body[:, : dim * 4].view(np.float32), table)
    assert not body[:, dim * 4 :].any() and not raw[n * stride :].any()  # zero padding
    with open_rows(path, meta) as rf:
        view = rf.as_array()
        assert view.shape == (n, dim) and view.dtype == np.float32
        assert not view.flags.writeable
        assert np.array_equal(view, table)


def test_write_streams_chunks_and_memmaps(tmp_path):
    table = make_table(50, 100)
    _, whole = written(tmp_path, table, "a.rows")
    src = tmp_path / "src.npy"
    np.save(src, table)
    mapped = np.load(src, mmap_mode="r")  # read-only memory map
    path, chunked = written(tmp_path, mapped, "b.rows", chunk_rows=7, atomic=False)
    assert chunked == whole
    strided = np.asfortranarray(table)  # non-contiguous rows are fine
    assert written(tmp_path, strided, "c.rows", chunk_rows=3)[1] == whole
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # atomic left no temp
    with open_rows(path, chunked) as rf:
        assert np.array_equal(rf.read(np.arange(50)), table)


def test_write_rejects_bad_tables(tmp_path):
    with pytest.raises(ValueError, match="2-D float32"):
        write_row_file(tmp_path / "a.rows", np.zeros((4, 3), dtype=np.float64))
    with pytest.raises(ValueError, match="2-D float32"):
        write_row_file(tmp_path / "a.rows", np.zeros(12, dtype=np.float32))
    with pytest.raises(ValueError, match="2-D float32"):
        write_row_file(tmp_path / "a.rows", np.zeros((4, 3), dtype=">f4"))
    with pytest.raises(ValueError, match="chunk_rows"):
        write_row_file(tmp_path / "a.rows", np.zeros((4, 3), dtype=np.float32), chunk_rows=0)
    assert not (tmp_path / "a.rows").exists()


def test_empty_table(tmp_path):
    path, meta = written(tmp_path, np.zeros((0, 5), dtype=np.float32))
    assert path.stat().st_size == 0
    with open_rows(path, meta) as rf:
        assert rf.read(np.zeros(0, dtype=np.int64)).shape == (0, 5)
        assert rf.as_array().shape == (0, 5)


# -- reads ------------------------------------------------------------------------------------
@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("dim", DIMS)
def test_read_matches_table(tmp_path, dim, direct):
    n = 300
    table = make_table(n, dim, seed=dim)
    path, meta = written(tmp_path, table)
    rng = np.random.default_rng(1)
    with open_rows(path, meta, direct=direct) as rf:
        cases = {
            "random": rng.integers(0, n, 64),
            "sorted": np.sort(rng.choice(n, 40, replace=False)),
            "unsorted": rng.permutation(n)[:90],
            "duplicates": np.array([5, 5, 299, 0, 5, 299, 1, 0]),
            "all": np.arange(n),
            "all reversed": np.arange(n)[::-1],
            "single": np.array([123]),
            "last": np.array([n - 1]),
            "empty": np.zeros(0, dtype=np.int64),
        }
        for name, ids in cases.items():
            got = rf.read(ids)
            assert got.shape == (ids.size, dim), name
            assert np.array_equal(got, table[ids]), name
        assert rf.rows_read == sum(ids.size for ids in cases.values())
        # Tensors in and out, int32 ids.
        out = torch.full((3, dim), float("nan"))
        rf.read_into(torch.tensor([7, 2, 7], dtype=torch.int32), out)
        assert torch.equal(out, torch.from_numpy(table[[7, 2, 7]]))


def test_direct_flag_and_reason(tmp_path):
    # direct=True on the test directory's filesystem either works or states why not.
    table = make_table(10, 8)
    path, meta = written(tmp_path, table)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rf = open_rows(path, meta)
    assert rf.direct or rf.fallback_reason
    assert open_rows(path, meta, direct=False).direct is False
    assert open_rows(path, meta, direct=False).fallback_reason == ""


@pytest.fixture(params=[COALESCE_GAP, 0, 65536])
def gap(request):
    """Each coalescing test under the default, no and a large read-through gap."""
    set_coalesce_gap(request.param)
    yield request.param
    set_coalesce_gap(COALESCE_GAP)


@pytest.mark.parametrize("dim", [100, 1024, 1500])
def test_coalescing(tmp_path, dim, gap):
    n = 2000 if dim == 100 else 600
    table = make_table(n, dim)
    path, meta = written(tmp_path, table)
    stride, align, row_bytes = meta["row_stride"], meta["align"], dim * 4
    size = path.stat().st_size
    with open_rows(path, meta) as rf:
        assert rf.read_requests == rf.bytes_read == rf.rows_read == 0
        perm = np.random.default_rng(0).permutation(n)
        assert np.array_equal(rf.read(perm), table[perm])
        every = expected_requests(np.arange(n), row_bytes, stride, rf.read_align, rf.max_request)
        assert rf.read_requests == len(every)
        assert rf.bytes_read == sum(length for _, length in every)
        if gap >= stride:  # rows and their padding are read through: few 1 MiB requests
            assert rf.read_requests <= math.ceil(size / rf.max_request) + 1 < n
        assert rf.rows_read == n
        assert rf.read_align <= align and align % rf.read_align == 0
        assert rf.read_seconds > 0

        # Sparse ids with duplicates: the requests of the documented rule, at the reader's
        # alignment (every distinct block once, small gaps read through).
        rf.reset_counters()
        assert rf.counters() == {
            "bytes_read": 0, "read_requests": 0, "rows_read": 0, "read_seconds": 0.0
        }  # fmt: skip
        ids = np.random.default_rng(2).integers(0, n, 300)
        ids = np.concatenate([ids, ids[:50]])
        assert np.array_equal(rf.read(ids), table[ids])
        expected = expected_requests(ids, row_bytes, stride, rf.read_align, rf.max_request)
        assert rf.bytes_read == sum(length for _, length in expected)
        assert rf.read_requests == len(expected)
        blocks = expected_blocks(ids, row_bytes, stride, rf.read_align)
        assert rf.bytes_read >= len(blocks) * rf.read_align
        assert rf.rows_read == ids.size


def test_thread_counts_agree(tmp_path):
    n, dim = 3000, 100
    table = make_table(n, dim)
    path, meta = written(tmp_path, table)
    ids = np.random.default_rng(3).integers(0, n, 5000)
    before = _C.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            _C.set_num_threads(threads)
            with open_rows(path, meta) as rf:
                results.append((rf.read(ids), rf.bytes_read, rf.read_requests))
    finally:
        _C.set_num_threads(before)
    assert np.array_equal(results[0][0], table[ids])
    assert np.array_equal(results[0][0], results[1][0])
    assert results[0][1:] == results[1][1:]


def test_page_cache_eviction(tmp_path):
    table = make_table(100, 16)
    path, meta = written(tmp_path, table)
    evict_page_cache(path)
    with open_rows(path, meta) as rf:
        rf.evict_page_cache()
        assert np.array_equal(rf.as_array(), table)  # still readable after eviction
    with pytest.raises(OSError, match="missing.rows"):
        evict_page_cache(tmp_path / "missing.rows")


# -- O_DIRECT refused -------------------------------------------------------------------------
def _fresh_warnings(monkeypatch) -> None:
    monkeypatch.setattr(rowfile_module, "_warned_fallbacks", set())


def _check_fallback(path: Path, meta: dict, table: np.ndarray) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        files = [open_rows(path, meta) for _ in range(3)]
    assert all(not rf.direct and rf.fallback_reason for rf in files)
    fallback = [w for w in caught if "O_DIRECT was refused" in str(w.message)]
    assert len(fallback) == 1, [str(w.message) for w in caught]
    assert str(path) in str(fallback[0].message)
    ids = np.random.default_rng(4).integers(0, table.shape[0], 200)
    for rf in files:
        assert np.array_equal(rf.read(ids), table[ids])
        rf.close()


def test_fallback_on_tmpfs(monkeypatch):
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("/dev/shm is absent or not writeable")
    _fresh_warnings(monkeypatch)
    table = make_table(500, 100)
    path = shm / f"distmb-test-{uuid.uuid4().hex}.rows"
    try:
        meta = write_row_file(path, table)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            probe = open_rows(path, meta)
        if probe.direct:
            pytest.skip("this kernel's tmpfs accepts O_DIRECT (Linux >= 6.6)")
        _fresh_warnings(monkeypatch)
        _check_fallback(path, meta, table)
    finally:
        path.unlink(missing_ok=True)


def test_fallback_on_refused_alignment(tmp_path, monkeypatch):
    # A packed layout (align=1) has rows at unaligned offsets: filesystems with direct I/O
    # refuse such reads with EINVAL, so the probe read triggers the buffered fallback.
    _fresh_warnings(monkeypatch)
    table = make_table(400, 3)
    path, meta = written(tmp_path, table, align=1)
    assert meta["row_stride"] == 12 and path.stat().st_size == 400 * 12
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        probe = open_rows(path, meta)
    if probe.direct:
        pytest.skip(f"the filesystem of {tmp_path} accepts unaligned O_DIRECT reads")
    assert "O_DIRECT" in probe.fallback_reason
    _fresh_warnings(monkeypatch)
    _check_fallback(path, meta, table)


# -- errors -----------------------------------------------------------------------------------
def test_missing_truncated_and_inconsistent_files(tmp_path):
    table = make_table(100, 100)
    path, meta = written(tmp_path, table)
    with pytest.raises(PartitionError, match="nope.rows is missing"):
        open_rows(tmp_path / "nope.rows", meta)
    with pytest.raises(PartitionError, match="not a regular file"):
        RowFile(tmp_path, 1, 1, 4)

    short = tmp_path / "short.rows"
    short.write_bytes(path.read_bytes()[: 99 * 512])
    with pytest.raises(PartitionError, match=r"short\.rows is truncated: 50688 bytes, expected "
                       r"at least 53248"):  # fmt: skip
        open_rows(short, meta)

    for stride, what in [(256, "inconsistent"), (768, "inconsistent"), (6000, "inconsistent")]:
        with pytest.raises(PartitionError, match=f"x.rows: row_stride {stride} is {what}"):
            RowFile(path, 100, 100, stride)
    with pytest.raises(PartitionError, match="align must be a power of two"):
        RowFile(path, 100, 100, 512, align=3000)


def test_file_truncated_after_open(tmp_path):
    table = make_table(100, 100)
    path, meta = written(tmp_path, table)
    with open_rows(path, meta) as rf:
        os.truncate(path, 4096)
        assert np.array_equal(rf.read(np.arange(8)), table[:8])  # the first block is intact
        with pytest.raises(PartitionError, match=r"x\.rows: read of bytes .* stopped at offset "
                           r"\d+ \(end of file: the file has 4096 bytes"):  # fmt: skip
            rf.read(np.array([3, 99]))
        os.truncate(path, 5000)  # unaligned end: O_DIRECT reads there fail with EINVAL
        with pytest.raises(PartitionError, match=r"stopped at offset 5000 \(end of file"):
            rf.read(np.array([3, 12]))  # one request [0, 8192)


def test_bad_ids_and_outputs(tmp_path):
    table = make_table(20, 6)
    path, meta = written(tmp_path, table)
    with open_rows(path, meta) as rf:
        with pytest.raises(IndexError, match=r"id 20 .* outside \[0, 20\)"):
            rf.read(np.array([1, 20]))
        with pytest.raises(IndexError, match=r"id -1 .* outside \[0, 20\)"):
            rf.read(np.array([-1]))
        with pytest.raises(ValueError, match="1-D integer"):
            rf.read(np.array([1.0, 2.0]))
        with pytest.raises(ValueError, match="1-D integer"):
            rf.read(np.zeros((2, 2), dtype=np.int64))
        ids = np.array([1, 2])
        bad_outs = [
            np.empty((3, 6), np.float32),
            np.empty((2, 5), np.float32),
            np.empty((2, 6), np.float64),
            np.empty((6, 2), np.float32).T,
            torch.empty(2, 6, dtype=torch.float64),
            torch.empty(6, 2).t(),
            [[0.0] * 6] * 2,
        ]
        for out in bad_outs:
            with pytest.raises(ValueError, match=r"float32\[2, 6\]|numpy array"):
                rf.read_into(ids, out)
        frozen = np.empty((2, 6), np.float32)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="writeable"):
            rf.read_into(ids, frozen)
    assert rf.closed
    with pytest.raises(ValueError, match="is closed"):
        rf.read(ids)


def test_scattered_reads_land_in_place(tmp_path):
    n, dim = 400, 100
    table = make_table(n, dim)
    path, meta = written(tmp_path, table)
    rng = np.random.default_rng(4)
    ids = rng.integers(0, n, 60)
    positions = rng.permutation(90)[:60]
    out = np.zeros((90, dim), dtype=np.float32)
    with open_rows(path, meta) as rf:
        rf.read_into(ids, out, positions=positions)
        assert np.array_equal(out[positions], table[ids])
        untouched = np.setdiff1d(np.arange(90), positions)
        assert not out[untouched].any()
        with pytest.raises(IndexError, match="positions"):
            rf.read_into(ids[:2], out, positions=np.array([0, 90]))
        with pytest.raises(ValueError, match="positions"):
            rf.read_into(ids[:2], out, positions=np.array([0]))


def test_io_depth_changes_no_row(tmp_path):
    from distmb.data.store.rowfile import DEFAULT_IO_DEPTH, io_depth, set_io_depth

    n, dim = 3000, 128
    table = make_table(n, dim)
    path, meta = written(tmp_path, table)
    ids = np.random.default_rng(5).integers(0, n, 4000)
    assert io_depth() == DEFAULT_IO_DEPTH >= 8
    try:
        for depth in (1, 3, 32):
            set_io_depth(depth)
            with open_rows(path, meta) as rf:
                assert np.array_equal(rf.read(ids), table[ids])
        with pytest.raises(ValueError, match="io depth"):
            set_io_depth(0)
    finally:
        set_io_depth(DEFAULT_IO_DEPTH)
