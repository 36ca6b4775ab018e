"""The :class:`~distmb.pipeline.features.FeatureSource` contract, one parametrised set for
every source: rows by id equal numpy's fancy indexing of the same table, whatever the ids'
order, repeats, count (none included), type (numpy or tensor, any integer dtype); float32
rows of ``dim`` columns; ids out of range or malformed refused with a clear error; the
loader's gather (:meth:`~distmb.pipeline.features.FeatureSource.gather_batch_rows`) on the
source's device; planned gathers (``inspect`` first) as exact as unplanned ones.

Sources: in-memory and memory-mapped tables, tables stored in two bytes a value
(``--feature-dtype``: rows equal the rounded table's), stacked sources, a part's rows with its halo
rows, the out-of-core cache under every policy (and its lookup-only view), normalised rows,
the device cache on CPU tensors under every policy (on CUDA with ``pytest -m cuda``), the
out-of-core host cache behind the device cache (``--features ooc`` on the device path) under
every host policy, and the exact baseline's remote rows on one rank (``SingleProcess``: its
all-to-all hands the rows back, no MPI).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_graph

from distmb.comm import SingleProcess
from distmb.data.owners import VertexOwners
from distmb.data.store.rowfile import RowFile, write_row_file
from distmb.data.store.store import PartitionStore
from distmb.halo.exact.remote import RemoteFeatures
from distmb.partition import partition_graph
from distmb.pipeline.features import (
    ArrayFeatures,
    CachedFeatures,
    ConcatFeatures,
    FeatureNormalization,
    FeatureSource,
    NormalizedFeatures,
    PartFeatures,
)
from distmb.pipeline.features.cached import CACHE_POLICIES, STATIC_POLICIES
from distmb.pipeline.features.device import DEVICE_CACHE_POLICIES, DeviceFeatures
from distmb.pipeline.features.presample import hot_rows
from distmb.pipeline.features.storage import STORAGE_DTYPES, stored_table
from distmb.pipeline.features.tiered import build_tiered_features

NUM_ROWS, DIM = 60, 5
#: Rows of the caches that hold part of the table.
CAPACITY = 17


@dataclass
class Case:
    """A source and the float32 table its rows must equal (``expected[ids]``)."""

    source: FeatureSource
    expected: np.ndarray


def base_table(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((NUM_ROWS, DIM)).astype(np.float32)


def hot_ids() -> np.ndarray:
    """A static cache's rows by priority (random scores: not the first ids)."""
    return hot_rows(np.random.default_rng(1).random(NUM_ROWS))


def row_file(table: np.ndarray, tmp_path: Path) -> RowFile:
    info = write_row_file(tmp_path / "rows.bin", table)
    return RowFile(tmp_path / "rows.bin", NUM_ROWS, DIM, info["row_stride"], align=info["align"])


def remote_case(tmp_path: Path) -> Case:
    graph = random_graph(n=NUM_ROWS, m=300, feat_dim=DIM, seed=5)
    partition_graph(graph, 1, tmp_path / "p1", seed=0)
    store = PartitionStore(tmp_path / "p1", 0)
    local = PartFeatures(np.asarray(store.features))
    remote = RemoteFeatures(SingleProcess(), VertexOwners(store), local, graph.num_nodes)
    return Case(remote, np.asarray(graph.features, dtype=np.float32))


def cached_case(policy: str, capacity: int, tmp_path: Path) -> Case:
    table = base_table()
    hot = hot_ids() if policy in STATIC_POLICIES else None
    return Case(CachedFeatures(row_file(table, tmp_path), policy, capacity, hot_ids=hot), table)


def cached_stored_case(policy: str, tmp_path: Path, normalise: bool = False) -> Case:
    """The out-of-core cache holding its rows as bfloat16 (``--feature-dtype``): every row,
    hit or miss, is the file's row (normalised first) rounded once."""
    table = base_table()
    hot = hot_ids() if policy in STATIC_POLICIES else None
    transform, expected = None, table
    if normalise:
        transform = FeatureNormalization("row").apply_
        expected = transform(torch.from_numpy(table.copy())).numpy()
    source = CachedFeatures(row_file(table, tmp_path), policy, CAPACITY, hot_ids=hot,
                            dtype=torch.bfloat16, transform=transform)  # fmt: skip
    return Case(source, rounded(expected, torch.bfloat16))


def lookup_view_case(tmp_path: Path) -> Case:
    """The out-of-core cache read without changing it, after a few gathers filled it."""
    table = base_table()
    cache = CachedFeatures(row_file(table, tmp_path), "lru", CAPACITY)
    cache.gather(np.arange(0, NUM_ROWS, 2))
    return Case(cache.lookup_only(), table)


def device_case(policy: str, dtype: type, reuse: bool, device: str) -> Case:
    table = base_table().astype(dtype)
    capacity = 0 if policy == "none" else CAPACITY
    hot = hot_ids() if capacity else None
    source = DeviceFeatures(
        table, device, capacity, hot_ids=hot, policy=policy, reuse_previous=reuse
    )
    return Case(source, table.astype(np.float32))


def tiered_case(
    host_policy: str,
    device_policy: str,
    reuse: bool,
    device: str,
    tmp_path: Path,
    stored: bool = False,
) -> Case:
    """The out-of-core host cache (``host_policy``; ``stored``: holding bfloat16 rows,
    normalised first, which the device cache then takes in two bytes) behind a device cache
    of fewer rows."""
    if stored:
        host = cached_stored_case(host_policy, tmp_path, normalise=True)
    else:
        host = cached_case(host_policy, CAPACITY, tmp_path)
    assert isinstance(host.source, CachedFeatures)
    source = build_tiered_features(
        host.source,
        device,
        cache_mb=8 * DIM * 4 / 2**20,  # 8 rows
        policy=device_policy,
        degree=np.random.default_rng(2).integers(0, 9, NUM_ROWS),
        make_sampler=None,  # the degree and none policies pre-sample nothing
        train_idx=np.zeros(0, dtype=np.int64),
        batch_size=1,
        presample_epochs=1,
        seed=0,
        reuse_previous=reuse,
    )
    return Case(source, host.expected)


def normalized_case() -> Case:
    table = base_table()
    mean, std = table[:40].mean(axis=0), table[:40].std(axis=0)
    std[2] = 0.0  # a constant column: divided by 1
    norm = FeatureNormalization("standard", torch.from_numpy(mean), torch.from_numpy(std))
    divisor = np.where(std > 0, std, np.float32(1.0))
    return Case(NormalizedFeatures(ArrayFeatures(table), norm), (table - mean) / divisor)


def memmap_case(tmp_path: Path) -> Case:
    table = base_table()
    np.save(tmp_path / "table.npy", table)
    return Case(ArrayFeatures(np.load(tmp_path / "table.npy", mmap_mode="r")), table)


def rounded(table: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """The reference of a stored table: torch's cast of the whole table, back in float32."""
    return torch.from_numpy(table).to(dtype).float().numpy()


def stored_case(name: str) -> Case:
    dtype = STORAGE_DTYPES[name]
    return Case(ArrayFeatures(stored_table(base_table(), dtype)), rounded(base_table(), dtype))


#: name -> (tmp_path -> Case).
CASES: dict[str, Callable[[Path], Case]] = {
    "array": lambda _: Case(ArrayFeatures(base_table()), base_table()),
    "array-float64": lambda _: Case(ArrayFeatures(base_table().astype(np.float64)), base_table()),
    "array-tensor": lambda _: Case(ArrayFeatures(torch.from_numpy(base_table())), base_table()),
    "array-memmap": memmap_case,
    # --feature-dtype on the CPU path: the table stored in two bytes, rows gathered as float32.
    **{
        f"array-stored-{name}": (lambda _, n=name: stored_case(n))
        for name in ("float16", "bfloat16")
    },
    "part-stored-with-halo": lambda _: Case(
        PartFeatures(
            stored_table(base_table()[:45], torch.bfloat16),
            stored_table(base_table()[45:], torch.bfloat16),
        ),
        rounded(base_table(), torch.bfloat16),
    ),
    "concat": lambda _: Case(
        ConcatFeatures(ArrayFeatures(base_table()[:25]), ArrayFeatures(base_table()[25:])),
        base_table(),
    ),
    "part-with-halo": lambda _: Case(
        PartFeatures(base_table()[:45], base_table()[45:]), base_table()
    ),
    "part-one-table": lambda _: Case(
        PartFeatures(ArrayFeatures(base_table()), n_solid=45), base_table()
    ),
    # The device path's source of a part with replicated halo rows (after its solid rows).
    "part-device": lambda _: Case(
        DeviceFeatures(base_table(), "cpu", CAPACITY, hot_ids=hot_ids(), n_solid=45),
        base_table(),
    ),
    "normalized": lambda _: normalized_case(),
    **{
        f"cached-{policy}-{capacity}": (lambda tmp, p=policy, c=capacity: cached_case(p, c, tmp))
        for policy in CACHE_POLICIES
        for capacity in (CAPACITY, NUM_ROWS)
    },
    "cached-lookup-view": lookup_view_case,
    **{
        f"cached-{policy}-bfloat16": (lambda tmp, p=policy: cached_stored_case(p, tmp))
        for policy in CACHE_POLICIES
    },
    "cached-lru-bfloat16-normalised": lambda tmp: cached_stored_case("lru", tmp, normalise=True),
    **{
        f"device-{policy}-{np.dtype(dtype).name}{'-reuse' if reuse else ''}": (
            lambda _, p=policy, d=dtype, r=reuse: device_case(p, d, r, "cpu")
        )
        for policy in DEVICE_CACHE_POLICIES
        for dtype in (np.float32, np.float16)
        for reuse in (False, True)
    },
    **{
        f"tiered-{policy}-{device_policy}{'-reuse' if reuse else ''}": (
            lambda tmp, p=policy, d=device_policy, r=reuse: tiered_case(p, d, r, "cpu", tmp)
        )
        for policy in CACHE_POLICIES
        for device_policy, reuse in (("degree", True), ("none", False))
    },
    "tiered-lru-degree-reuse-bfloat16": lambda tmp: tiered_case(
        "lru", "degree", True, "cpu", tmp, stored=True
    ),
    "remote-one-rank": remote_case,
}
CUDA_CASES: dict[str, Callable[[Path], Case]] = {
    f"device-{policy}-cuda": (lambda _, p=policy: device_case(p, np.float32, True, "cuda"))
    for policy in DEVICE_CACHE_POLICIES
}
CUDA_CASES["tiered-belady-degree-reuse-cuda"] = lambda tmp: tiered_case(
    "belady", "degree", True, "cuda", tmp
)
CUDA_CASES["tiered-belady-degree-reuse-bfloat16-cuda"] = lambda tmp: tiered_case(
    "belady", "degree", True, "cuda", tmp, stored=True
)


@pytest.fixture(
    params=[
        *CASES,
        *[pytest.param(name, marks=pytest.mark.cuda) for name in CUDA_CASES],
    ]
)
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Case:
    return {**CASES, **CUDA_CASES}[request.param](tmp_path)


def requests(num_rows: int) -> list[np.ndarray]:
    """Ids in every shape a reader sends: random with repeats, a reversed permutation, none,
    one, the ends repeated, a sorted subset."""
    rng = np.random.default_rng(7)
    return [
        rng.integers(0, num_rows, 3 * num_rows),
        np.arange(num_rows)[::-1].copy(),
        np.zeros(0, dtype=np.int64),
        np.array([num_rows // 2]),
        np.array([num_rows - 1, 0, num_rows - 1, 0]),
        np.sort(rng.choice(num_rows, num_rows // 3, replace=False)),
    ]


def check_rows(got: torch.Tensor, want: np.ndarray, device: torch.device) -> None:
    assert got.dtype == torch.float32 and got.device == device
    assert tuple(got.shape) == want.shape
    np.testing.assert_array_equal(got.cpu().numpy(), want)


# -- the declared members --------------------------------------------------------------------
def test_declared_members(case: Case, request: pytest.FixtureRequest) -> None:
    source, name = case.source, request.node.callspec.params["case"]
    assert (source.num_rows, source.dim) == case.expected.shape
    assert source.has_halo == name.startswith("part-")
    assert source.wants_trace == name.startswith(("cached-belady", "tiered-belady"))
    assert source.uses_collectives == name.startswith("remote")
    where = "cuda" if name.endswith("-cuda") else "cpu"  # a device source's own device
    assert isinstance(source.device, torch.device) and source.device.type == where


# -- rows ------------------------------------------------------------------------------------
def test_rows_equal_numpy_indexing(case: Case) -> None:
    source, table = case.source, case.expected
    cpu = torch.device("cpu")
    for ids in requests(source.num_rows):
        served = source.rows_served
        check_rows(source.gather(ids), table[ids], cpu)
        assert source.rows_served == served + ids.size
        check_rows(source.gather(torch.from_numpy(ids)), table[ids], cpu)
        check_rows(source.gather(ids.astype(np.int32)), table[ids], cpu)
        out = torch.full((ids.size, source.dim), np.nan, dtype=torch.float32)
        assert source.gather_into(ids, out) is out
        check_rows(out, table[ids], cpu)
    source.reset_counters()
    assert source.rows_served == 0


def test_the_loader_gather_lands_on_the_source_device(case: Case) -> None:
    source, table = case.source, case.expected
    taken: list[torch.Tensor] = []

    def take_buffer(numel: int) -> torch.Tensor:
        taken.append(torch.empty(numel + 3, dtype=torch.float32))  # larger, as recycled
        return taken[-1]

    for ids in requests(source.num_rows):
        taken.clear()
        rows, buffer = source.gather_batch_rows(torch.from_numpy(ids), take_buffer)
        check_rows(rows, table[ids], source.device)
        if buffer is None:  # rows in memory of their own
            assert not taken
        else:  # rows are a view of the buffer the loader handed over
            assert taken == [buffer] and rows.untyped_storage().data_ptr() == (
                buffer.untyped_storage().data_ptr()
            )


def test_planned_gathers_are_exact(case: Case) -> None:
    """A superbatch's gathers announced first (``inspect``, as the loader does for a source
    that wants a trace; the others ignore it), then made in that order."""
    source, table = case.source, case.expected
    rng = np.random.default_rng(11)
    for _ in range(3):
        traces = [rng.permutation(source.num_rows)[: rng.integers(1, 30)] for _ in range(4)]
        source.inspect(traces)
        for ids in traces:
            check_rows(source.gather(ids), table[ids], torch.device("cpu"))


# -- refusals --------------------------------------------------------------------------------
def test_bad_ids_are_refused(case: Case) -> None:
    source, n = case.source, case.source.num_rows
    name = type(source).__name__
    for bad in (np.array([0, n]), np.array([-1, 3]), torch.tensor([n + 5])):
        with pytest.raises(IndexError, match=rf"{name}: ids must be in \[0, {n}\)"):
            source.gather(bad)
    for bad in (np.array([[0, 1]]), np.array([0.5]), torch.tensor([1.0])):
        with pytest.raises(ValueError, match=rf"{name}: ids must be a 1-D integer array"):
            source.gather(bad)
    with pytest.raises(ValueError, match=rf"{name}.gather_into: out must be a contiguous"):
        source.gather_into(np.array([0, 1]), torch.empty((3, source.dim)))
    with pytest.raises(ValueError, match="out must be a contiguous float32"):
        source.gather_into(np.array([0, 1]), torch.empty((2, source.dim), dtype=torch.float64))
    # A refused request changes nothing: the next gather is exact.
    check_rows(source.gather(np.array([n - 1, 0])), case.expected[[n - 1, 0]],
               torch.device("cpu"))  # fmt: skip
