"""The one-read layer's Fused-Map and CSR kernels (distmb.pipeline.sample.relabel_triton)
against a numpy reference of the numbering (destinations, then new solid sources in order of
first appearance, then new halo sources) and of the block's CSR; under Triton's interpreter
on CPU, and on a GPU node with ``pytest -m cuda``, where the programs really run at once.

The block size and the scan's pass are lowered in most tests so that a few dozen keys span
several programs (some keys' first occurrence in another program) and several passes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import compile_triton_in_subprocess

from distmb.core.host_reads import HOST_READS
from distmb.pipeline.sample import idmap_triton, relabel_triton
from distmb.pipeline.sample.relabel_triton import STATS, empty_tables, relabel_layer

pytestmark = pytest.mark.skipif(
    not idmap_triton.usable(torch.device("cpu"))[0], reason="needs Triton's interpreter"
)

#: Devices every test runs on: CPU here, CUDA under ``pytest -m cuda`` on a GPU node.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
#: Keys per program and partial sums per scan pass of the small configurations.
SMALL_BLOCK, SMALL_CHUNK = 8, 2


def reference_layer(
    keys: np.ndarray,
    count: np.ndarray,
    fanout: int,
    n_dst: int,
    n_solid: int,
    next_bound: int | None = None,
) -> dict:
    """Python loops: ``first`` (bool[m]); the sources ``src``; every key's position
    ``local`` in them (destinations at their own position); the CSR ``indptr`` and
    ``indices`` (row ``r``'s first ``count[r]`` slots); and the :data:`STATS` by name."""
    keys = keys.tolist()
    d = len(count)
    first_at: dict[int, int] = {}
    first = []
    for i, k in enumerate(keys):
        first.append(k not in first_at)
        first_at.setdefault(k, i)
    solid = [k for i, k in enumerate(keys) if first[i] and i >= n_dst and k < n_solid]
    halo = [k for i, k in enumerate(keys) if first[i] and i >= n_dst and k >= n_solid]
    src = keys[:n_dst] + solid + halo
    position = {k: n_dst + at for at, k in enumerate(solid + halo)}
    position.update({k: i for i, k in enumerate(keys[:n_dst]) if first[i]})
    local = [position[k] for k in keys]
    indptr = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    indices = [local[d + r * fanout + s] for r in range(d) for s in range(count[r])]
    stats = {
        "new_solid": len(solid),
        "new_halo": len(halo),
        "repeated": sum(not f for f in first[:n_dst]),
        "negative": sum(k < 0 for k in keys),
        "n_computed": n_dst + len(solid),
        "edges": int(indptr[-1]),
        "bad_dst": sum(not 0 <= k < n_solid for k in keys[:n_dst]),
        "n_next": min(n_dst + len(solid), len(keys) if next_bound is None else next_bound),
    }
    return dict(first=first, src=src, local=local, indptr=indptr, indices=indices, stats=stats)


def run(
    keys: list[int] | np.ndarray,
    count: list[int] | np.ndarray,
    fanout: int,
    n_dst: int,
    n_solid: int,
    device: str = "cpu",
    on_device: bool = False,
    small: bool = True,
    next_bound: int | None = None,
) -> tuple[relabel_triton.RelabeledLayer, dict]:
    """The kernels' layer (``n_dst`` as a device scalar when ``on_device``; the small
    block and scan pass when ``small``) and the reference's, with no host read between."""
    keys_t = torch.as_tensor(np.asarray(keys, dtype=np.int64), device=device)
    count_t = torch.as_tensor(np.asarray(count, dtype=np.int64), device=device)
    n = torch.tensor(n_dst, device=device) if on_device else n_dst
    size = dict(block=SMALL_BLOCK, scan_chunk=SMALL_CHUNK) if small else {}
    before, _ = HOST_READS.snapshot()
    got = relabel_layer(keys_t, count_t, fanout, n, n_solid, **size, next_bound=next_bound)
    assert HOST_READS.snapshot()[0] == before
    want = reference_layer(np.asarray(keys), np.asarray(count), fanout, n_dst, n_solid, next_bound)
    return got, want


def assert_layer(got: relabel_triton.RelabeledLayer, want: dict, numbering: bool = True) -> None:
    """The counts and first flags always; the sources and the CSR when ``numbering`` (not
    specified where destinations repeat or keys are negative)."""
    stats = dict(zip(STATS, got.stats.cpu().tolist(), strict=True))
    assert stats == want["stats"]
    assert got.first.cpu().tolist() == want["first"]
    if not numbering:
        return
    n_src, nnz = len(want["src"]), want["stats"]["edges"]
    assert got.src_ids.shape[0] == len(want["first"]) + 1
    assert got.src_ids[:n_src].cpu().tolist() == want["src"]
    assert got.indptr.cpu().tolist() == want["indptr"].tolist()
    assert got.indices[:nnz].cpu().tolist() == want["indices"]


def full_rows(d: int, fanout: int) -> np.ndarray:
    """Every slot valid: the indices are every slot's position, in order."""
    return np.full(d, fanout, dtype=np.int64)


# -- the numbering -------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_dst", [0, 1])
def test_one_key(device: str, n_dst: int) -> None:
    """One row, no slot: a destination, or a new source (solid, then halo)."""
    for n_solid in (10, 3):
        got, want = run([7], [0], 0, n_dst, n_solid, device)
        assert_layer(got, want)
        assert got.src_ids[:1].cpu().tolist() == [7] and got.indptr.cpu().tolist() == [0, 0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_dst", [0, 1])
def test_all_keys_equal(device: str, n_dst: int) -> None:
    """Every slot repeats the one row's key: one source, every edge to position 0; across
    several programs (first occurrence in program 0 only)."""
    fanout = 3 * SMALL_BLOCK + 5
    got, want = run([4] * (1 + fanout), [fanout], fanout, n_dst, 10, device)
    assert_layer(got, want)
    assert got.indices[:fanout].cpu().tolist() == [0] * fanout
    assert want["stats"]["new_solid"] == 1 - n_dst


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("on_device", [False, True])
def test_halo_sources_come_after_the_solid_ones(device: str, on_device: bool) -> None:
    """Halo ids (>= n_solid) interleaved with solid ones, some repeated: the solid ones in
    order of first appearance, then the halo ones; repeats point at the first."""
    dst = [3, 1]
    slots = [20, 5, 21, 5, 20, 6, 1, 22]  # 2 rows of 4 slots, the last one not valid
    got, want = run(dst + slots, [4, 3], 4, 2, 10, device, on_device)
    assert_layer(got, want)
    assert want["src"] == [3, 1, 5, 6, 20, 21, 22]
    assert want["indices"] == [4, 2, 5, 2, 4, 3, 1]


@pytest.mark.parametrize("device", DEVICES)
def test_device_n_dst_below_the_rows(device: str) -> None:
    """A bounded layer: 6 rows, 3 destinations (a device scalar), the unused rows repeat
    ``dst[0]`` with no valid slot, their slots all ``dst[0]``; two layouts of programs."""
    fanout, d = 3, 6
    dst = [9, 2, 14]
    rows = dst + [dst[0]] * 3
    slots = [2, 11, 9, 30, 11, 9, 5, 9, 9] + [dst[0]] * 9
    count = [3, 2, 1, 0, 0, 0]
    for small in (True, False):
        got, want = run(rows + slots, count, fanout, 3, 20, device, True, small)
        assert_layer(got, want)
        assert want["src"] == [9, 2, 14, 11, 5, 30]
        assert got.indptr.cpu().tolist() == [0, 3, 5, 6, 6, 6, 6]
        assert want["stats"]["n_computed"] == 5 and len(slots) == d * fanout
    # Room for fewer rows below than the layer computes: n_next is capped, nothing else
    # changes; room for more: n_next is n_computed.
    for next_bound, n_next in ((4, 4), (5, 5), (6, 5)):
        got, want = run(rows + slots, count, fanout, 3, 20, device, True, next_bound=next_bound)
        assert_layer(got, want)
        assert want["stats"]["n_next"] == n_next


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("on_device", [False, True])
@pytest.mark.parametrize(("d", "fanout"), [(23, 4), (41, 1), (9, 13)])
def test_several_programs_and_scan_passes(device: str, on_device: bool, d: int, fanout: int):
    """Random keys, solid and halo, many repeats; ``m`` not a multiple of the block, more
    programs than one scan pass; destinations fewer than the rows, and the rows past them
    new keys too (a plain Fused-Map's view of the rows)."""
    rng = np.random.default_rng(d * 100 + fanout)
    n_dst = d // 2
    dst = rng.choice(60, n_dst, replace=False)
    keys = np.concatenate([dst, rng.integers(0, 80, d - n_dst + d * fanout)])
    count = rng.integers(0, fanout + 1, d)
    m = d * (1 + fanout)
    assert m % SMALL_BLOCK and m // SMALL_BLOCK > 2 * SMALL_CHUNK
    got, want = run(keys, count, fanout, n_dst, 50, device, on_device)
    assert_layer(got, want)
    assert want["stats"]["new_solid"] and want["stats"]["new_halo"]
    # Every slot valid: the indices are every slot's source position.
    got, want = run(keys, full_rows(d, fanout), fanout, n_dst, 50, device, on_device)
    assert_layer(got, want)
    assert want["indices"] == want["local"][d:]


@pytest.mark.parametrize("device", DEVICES)
def test_default_block_across_programs(device: str) -> None:
    """The default block (1024 keys) on 1500 keys: two programs, the second partial."""
    rng = np.random.default_rng(7)
    d, fanout = 300, 4
    dst = rng.choice(900, d, replace=False)
    keys = np.concatenate([dst, rng.integers(0, 1000, d * fanout)])
    count = rng.integers(0, fanout + 1, d)
    assert relabel_triton.BLOCK < len(keys) < 2 * relabel_triton.BLOCK
    got, want = run(keys, count, fanout, d, 800, device, True, small=False)
    assert_layer(got, want)


# -- the counts of the errors --------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("on_device", [False, True])
def test_repeated_destinations_and_negative_keys_are_counted(device: str, on_device: bool):
    """Counted, not raised (the caller raises after its read): two repeated destinations
    (one of them in another program), negative keys among the slots, a halo destination
    and a negative one (bad destinations)."""
    dst = [5, 8, 5, 3, 60, 8, 2, -4, 7, 1]
    d, fanout = len(dst), 2
    slots = [1, -2, 9, 9, -3, 4] + [0] * (d * fanout - 6)
    got, want = run(dst + slots, [2] * d, fanout, d, 50, device, on_device)
    assert_layer(got, want, numbering=False)
    assert [want["stats"][k] for k in ("repeated", "negative", "bad_dst")] == [2, 3, 2]
    # A valid layer of the same shape counts none of them.
    got, want = run(list(range(d)) + [0] * d * fanout, [2] * d, fanout, d, 50, device)
    assert_layer(got, want)
    assert [want["stats"][k] for k in ("repeated", "negative", "bad_dst")] == [0, 0, 0]


# -- tables, arguments, the compiler -------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_empty_tables(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One buffer, cut into a table a layer of its default capacity, every slot empty;
    several fill programs; a layer mapped into its table leaves the next one empty."""
    monkeypatch.setattr(relabel_triton, "BLOCK", SMALL_BLOCK)
    tables = empty_tables([5, 1, 30], torch.device(device))
    assert [t[0].shape[0] for t in tables] == [16, 2, 64]
    for table_keys, table_pos in tables:
        assert set(table_keys.cpu().tolist()) == {idmap_triton.EMPTY}
        assert set(table_pos.cpu().tolist()) == {idmap_triton.NO_POSITION}
    keys, count = torch.tensor([3, 1, 3, 3, 0], device=device), torch.tensor([4], device=device)
    got = relabel_layer(keys, count, 4, 1, 10, tables[0])
    assert got.src_ids[:3].cpu().tolist() == [3, 1, 0]
    assert set(tables[1][0].cpu().tolist()) == {idmap_triton.EMPTY}
    assert set(tables[2][1].cpu().tolist()) == {idmap_triton.NO_POSITION}


def test_bad_arguments() -> None:
    keys, count = torch.arange(6), torch.tensor([1, 2])
    with pytest.raises(ValueError, match="6 keys are not 2 rows of 1 \\+ fanout=3"):
        relabel_layer(keys, count, 3, 2, 10)
    with pytest.raises(ValueError, match="n_dst=3 is outside"):
        relabel_layer(keys, count, 2, 3, 10)
    with pytest.raises(ValueError, match="one int64 value"):
        relabel_layer(keys, count, 2, torch.tensor([1, 1]), 10)
    with pytest.raises(ValueError, match="keys must be a 1-D int64"):
        relabel_layer(keys.int(), count, 2, 2, 10)
    table = (torch.empty(4, dtype=torch.int64), torch.empty(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="power of two >= the 6 keys"):
        relabel_layer(keys, count, 2, 2, 10, table)
    table = (torch.empty(8, dtype=torch.int64), torch.empty(16, dtype=torch.int64)[::2])
    with pytest.raises(ValueError, match="table_pos must be a contiguous int64 tensor"):
        relabel_layer(keys, count, 2, 2, 10, table)


def test_kernels_compile_for_hopper() -> None:
    """The interpreter accepts code the compiler rejects: compile the layer's kernels with
    the destination count on the device and 64-bit sizes (Triton passes Python ints of 2**31
    and more as such; no CPU run reaches them) to a cubin for sm_90, no GPU needed. The
    32-bit sizes a run launches them with, and the tables' fill, are compiled by
    ``tests/test_triton_compiles.py``."""
    code = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from distmb.pipeline.sample import relabel_triton as r

target = GPUTarget("cuda", 90, 32)

def compile(kernel, pointers, ints, constexprs, bools=(), int_type="i64"):
    sig = {n: "*i64" for n in pointers}
    sig.update({n: "*i1" for n in bools})
    sig.update({n: int_type for n in ints})
    sig.update({n: "constexpr" for n in constexprs})
    src = ASTSource(kernel, sig, constexprs=constexprs)
    assert len(triton.compile(src, target=target).asm["cubin"]) > 0

compile(r._count_kernel,
        ["keys_ptr", "slot_of_ptr", "table_pos_ptr", "code_ptr", "count_ptr", "row_end_ptr",
         "partials_ptr", "n_dst_ptr"],
        ["n_dst", "m", "d", "n_solid"], {"BLOCK": r.BLOCK, "DST_ON_DEVICE": True},
        ["first_ptr"])
compile(r._scan_kernel, ["partials_ptr", "stats_ptr", "indptr_ptr", "n_dst_ptr"],
        ["n_dst", "n_programs", "next_bound"], {"CHUNK": r.SCAN_CHUNK, "DST_ON_DEVICE": True})
compile(r._relabel_kernel,
        ["keys_ptr", "slot_of_ptr", "code_ptr", "count_ptr", "row_end_ptr", "offsets_ptr",
         "stats_ptr", "src_ids_ptr", "indptr_ptr", "indices_ptr", "n_dst_ptr"],
        ["n_dst", "m", "d", "fanout"], {"BLOCK": r.BLOCK, "DST_ON_DEVICE": True},
        ["first_ptr"])
"""
    compile_triton_in_subprocess(code)


# -- a GPU only ----------------------------------------------------------------------------
@pytest.mark.cuda
def test_many_programs_at_once_on_a_gpu() -> None:
    """On a GPU the programs of each kernel run at once (the interpreter runs them one after
    another): the insert's atomics race, the count kernel reads every first position the
    insert wrote, the relabel reads codes other programs wrote. A million keys, thousands of
    programs at the default block, against the reference; and twice the same result."""
    rng = np.random.default_rng(11)
    d, fanout = 100_000, 9
    dst = rng.choice(400_000, d, replace=False)
    keys = np.concatenate([dst, rng.integers(0, 500_000, d * fanout)])
    count = rng.integers(0, fanout + 1, d)
    got, want = run(keys, count, fanout, d - 1000, 450_000, "cuda", True, small=False)
    assert_layer(got, want)
    again, _ = run(keys, count, fanout, d - 1000, 450_000, "cuda", True, small=False)
    n_src, nnz = len(want["src"]), want["stats"]["edges"]
    assert torch.equal(again.src_ids[:n_src], got.src_ids[:n_src])
    assert torch.equal(again.indices[:nnz], got.indices[:nnz])
