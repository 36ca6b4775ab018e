"""The one-launch layer kernel (:mod:`distmb.pipeline.sample.choose_triton`) under Triton's
interpreter, against a numpy reference of the same algorithm and random words.

The reference (:func:`reference_layer`) is written from the algorithm, not from the kernel:
numpy ``uint64`` splitmix64 words (``finalize64(state_0 + (q + 1) * GOLDEN)``, the kernel
adds ``GOLDEN`` step by step), Floyd per row with a Python set, ``sorted`` picks. The kernel
must give exactly its slots, row sizes and valid masks on hand-built graphs (hubs, isolated
vertices, degree == fan-out, fan-out 1, non-power-of-two fan-outs, int32 / int64 indices,
more rows than one program, rows past a device-scalar valid count), and the device
sampler's Triton path must give exactly its neighbours for ``(seed, epoch, iteration,
layer)``. A chi-square test of whole subsets
checks uniformity (biased draws fail it); a census counts a layer's launches on each
path, and the kernel is compiled for sm_90.
"""

from __future__ import annotations

import math
from collections import Counter
from itertools import combinations

import numpy as np
import pytest
import torch
from conftest import compile_triton_in_subprocess
from test_sampler import P_MIN
from test_sampler_contract import LocalGraph, block_neighbours, check_blocks, from_rows
from torch.utils._python_dispatch import TorchDispatchMode

from distmb.core.rng import to_signed
from distmb.pipeline.sample import choose_triton, device_batch, idmap_triton, relabel_triton
from distmb.pipeline.sample.choose_triton import choose_layer, layer_key
from distmb.pipeline.sample.device import DeviceNeighborSampler, batch_seed

pytestmark = pytest.mark.skipif(
    not idmap_triton.usable(torch.device("cpu"))[0], reason="needs Triton's interpreter"
)

# -- the reference -------------------------------------------------------------------------
U64 = np.uint64
GOLDEN = U64(0x9E3779B97F4A7C15)
MIX1, MIX2 = U64(0xBF58476D1CE4E5B9), U64(0x94D049BB133111EB)


def finalize(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser of a uint64 array (numpy array products wrap silently)."""
    x = np.asarray(x, dtype=U64)
    x = (x ^ (x >> U64(30))) * MIX1
    x = (x ^ (x >> U64(27))) * MIX2
    return x ^ (x >> U64(31))


def reference_layer_key(batch: int, layer: int) -> int:
    """``hash_chain(batch, layer) = mix64(batch ^ mix64(layer))``, ``mix64(x) =
    finalize(x + GOLDEN)``."""
    inner = finalize(np.array([layer], dtype=U64) + GOLDEN)
    return int(finalize((np.array([batch], dtype=U64) ^ inner) + GOLDEN)[0])


def reference_words(key: int, n: int, fanout: int) -> np.ndarray:
    """uint64[n, fanout]: row i's step q word, ``finalize(state_i + (q + 1) * GOLDEN)`` with
    ``state_i = finalize(key ^ finalize(i + GOLDEN))``."""
    state = finalize(U64(key) ^ finalize(np.arange(n, dtype=U64) + GOLDEN))
    steps = np.arange(1, fanout + 1, dtype=U64) * GOLDEN
    return finalize(state[:, None] + steps[None, :])


#: Deliberately biased variants of the draw (the uniformity test's foils): ``t`` in
#: ``[0, j)`` instead of ``[0, j]``; a 4-bit word modulo ``j + 1`` (modulo bias).
FOILS = ("off_by_one", "short_words")
#: Bits of a "short_words" word.
SHORT_WORD_BITS = 4


def floyd(words: np.ndarray, deg: int, fanout: int, foil: str | None = None) -> list[int]:
    """Floyd's ``fanout``-subset of ``[0, deg)`` from one row's words, ascending (``foil``:
    one of :data:`FOILS`, or None for the algorithm)."""
    chosen: set[int] = set()
    for q, j in enumerate(range(deg - fanout, deg)):
        word, bound = words[q], j + 1
        if foil == "off_by_one":
            bound = max(j, 1)
        elif foil == "short_words":
            word = word >> U64(64 - SHORT_WORD_BITS)
        t = int(word % U64(bound))
        chosen.add(j if t in chosen else t)
    return sorted(chosen)


def reference_layer(
    indptr: np.ndarray,
    indices: np.ndarray,
    rows: np.ndarray,
    dst: np.ndarray,
    fanout: int,
    key: int,
    foil: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(slots int64[n, fanout], count int64[n], valid bool[n, fanout]) of one layer."""
    n = len(rows)
    words = reference_words(key, n, fanout)
    slots = np.full((n, fanout), dst[0] if n else 0, dtype=np.int64)
    count = np.zeros(n, dtype=np.int64)
    for i, v in enumerate(rows.tolist()):
        start, deg = int(indptr[v]), int(indptr[v + 1] - indptr[v])
        if deg > fanout:
            positions = floyd(words[i], deg, fanout, foil)
        else:
            positions = list(range(deg))
        count[i] = len(positions)
        slots[i, : len(positions)] = indices[start + np.asarray(positions, dtype=np.int64)]
    valid = np.arange(fanout)[None, :] < count[:, None]
    return slots, count, valid


def run_kernel(
    g: LocalGraph,
    rows: np.ndarray,
    dst: np.ndarray,
    fanout: int,
    key: int,
    device: str = "cpu",
    key_on_device: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel's (slots, count, valid) as the reference gives them; checks the keys'
    ``dst`` prefix. ``key_on_device``: the key passed as a one-element int64 tensor (its
    signed word), which the kernel reads."""
    if key_on_device:
        key = torch.tensor([to_signed(key)], dtype=torch.int64, device=device)  # type: ignore[assignment]
    out = choose_layer(
        torch.as_tensor(g.indptr, device=device),
        torch.as_tensor(g.indices, device=device),
        torch.as_tensor(rows, dtype=torch.int64, device=device),
        torch.as_tensor(dst, dtype=torch.int64, device=device),
        fanout,
        key,
    )
    n = len(rows)
    keys = out.keys.cpu().numpy()
    np.testing.assert_array_equal(keys[:n], dst)
    assert out.valid is not None and out.count.dtype == torch.int64
    slots = keys[n:].reshape(n, fanout)
    return slots, out.count.cpu().numpy(), out.valid.cpu().numpy().reshape(n, fanout)


def assert_matches_reference(
    g: LocalGraph, rows: np.ndarray, dst: np.ndarray, fanout: int, key: int,
    device: str = "cpu", key_on_device: bool = False,
) -> None:  # fmt: skip
    """:func:`run_kernel` (its arguments) against the numpy reference."""
    got = run_kernel(g, rows, dst, fanout, key, device, key_on_device)
    want = reference_layer(g.indptr, g.indices, rows, dst, fanout, key)
    for name, a, b in zip(("slots", "count", "valid"), got, want, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=f"{name}, fanout {fanout}, key {key}")


# -- graphs --------------------------------------------------------------------------------
def mixed_graph(dtype: type = np.int64) -> LocalGraph:
    """Degrees 0 (isolated: 3, 7), 1, 3, 4, 5, 8, 17 and a hub of 100; neighbour ids are
    ``1000 + 10 * CSR position`` plus the row, so a slot names its row and position."""
    degrees = [3, 1, 4, 0, 5, 8, 17, 0, 100]
    rows = {v: [1000 + 10 * k + v for k in range(d)] for v, d in enumerate(degrees)}
    g = from_rows(rows, 3000)
    return LocalGraph(g.indptr, g.indices.astype(dtype), g.n_solid, g.n_local)


KEYS = [0, 1, 2**63 - 1, 2**63, 2**64 - 1, 0x0123456789ABCDEF]


# -- exact picks ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("fanout", [1, 3, 4, 5, 16])
def test_kernel_equals_the_reference(dtype: type, fanout: int) -> None:
    g = mixed_graph(dtype)
    rows = np.array([8, 0, 3, 2, 6, 1, 5, 7, 4, 8])  # the hub twice: different words
    dst = rows + 500  # the keys' prefix and padding come from dst, not rows
    for key in KEYS:
        assert_matches_reference(g, rows, dst, fanout, key)


@pytest.mark.parametrize("fanout", [3, 16])
def test_key_read_from_the_device(fanout: int) -> None:
    """A key passed as a device tensor (what a captured sampler graph reads) draws the
    reference's words for that key, the full uint64 range included."""
    g = mixed_graph()
    rows = np.array([8, 0, 3, 2, 6, 1, 5, 7, 4, 8])
    for key in KEYS:
        assert_matches_reference(g, rows, rows + 500, fanout, key, key_on_device=True)


@pytest.mark.parametrize(("fanout", "n_rows"), [(3, 1100), (16, 150)])
def test_many_programs(fanout: int, n_rows: int) -> None:
    """More rows than one program (``1024 // SLOTS`` rows each): 5 and 3 programs, the
    last one part full; rows index the words, so repeats of a vertex differ."""
    assert n_rows > choose_triton.rows_per_program(fanout)
    g = mixed_graph()
    rows = np.random.default_rng(0).integers(0, g.n_solid, n_rows)
    assert_matches_reference(g, rows, np.arange(n_rows), fanout, 77)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize(("fanout", "n_rows"), [(3, 300), (16, 150)])
def test_rows_past_the_valid_count_are_unused(dtype: type, fanout: int, n_rows: int) -> None:
    """With ``n_valid`` (an int64 device scalar): the rows below it exactly the
    reference's (their words keyed by their index), the rows at or past it of size 0,
    every slot and their own key ``dst[0]``, none valid, whatever their ids hold (out of
    range here, so a read of them would show). Counts at program boundaries."""
    g = mixed_graph(dtype)
    rng = np.random.default_rng(1)
    per_program = choose_triton.rows_per_program(fanout)
    for n_valid in (1, per_program, per_program + 1, n_rows):
        rows = rng.integers(0, g.n_solid, n_rows)
        dst = rows + 500
        rows[n_valid:], dst[n_valid:] = -(10**12), -3  # unused: never read
        out = choose_layer(torch.as_tensor(g.indptr), torch.as_tensor(g.indices),
                           torch.as_tensor(rows), torch.as_tensor(dst), fanout, 99,
                           n_valid=torch.tensor(n_valid))  # fmt: skip
        assert out.valid is not None
        keys = out.keys.numpy()
        slots = keys[n_rows:].reshape(n_rows, fanout)
        valid = out.valid.numpy().reshape(n_rows, fanout)
        want = reference_layer(g.indptr, g.indices, rows[:n_valid], dst[:n_valid], fanout, 99)
        np.testing.assert_array_equal(keys[:n_valid], dst[:n_valid])
        np.testing.assert_array_equal(slots[:n_valid], want[0])
        np.testing.assert_array_equal(out.count.numpy()[:n_valid], want[1])
        np.testing.assert_array_equal(valid[:n_valid], want[2])
        assert np.all(keys[n_valid:n_rows] == dst[0]) and np.all(slots[n_valid:] == dst[0])
        assert np.all(out.count.numpy()[n_valid:] == 0) and not valid[n_valid:].any()


def test_out_of_range_rows_are_clamped() -> None:
    """A row id outside ``[0, n_rows)`` (a bad seed, reported by the caller) reads the
    nearest row instead of memory outside ``indptr``; its key stays its own id."""
    g = mixed_graph()
    rows = np.array([-5, 10**9, 3, g.n_solid])
    slots, count, valid = run_kernel(g, rows, rows, 4, 5)
    clamped = np.clip(rows, 0, g.n_solid - 1)
    want = reference_layer(g.indptr, g.indices, clamped, rows, 4, 5)
    for got, expected in zip((slots, count, valid), want, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_sampler_draws_the_reference_words() -> None:
    """The device sampler's Triton path: layer ``l`` of batch ``(seed, epoch, iteration)``
    takes the reference's neighbours under ``layer_key(batch_seed(...), l)``."""
    g = mixed_graph(np.int32)
    fanouts = [2, 3]
    sampler = DeviceNeighborSampler(g.indptr, g.indices, g.n_solid, g.n_local, fanouts, 5,
                                    choose="triton")  # fmt: skip
    assert sampler.choose == "triton"
    seeds = np.array([8, 6, 3, 5])
    blocks = sampler.sample(seeds, 2, 9)
    check_blocks(g, seeds, fanouts, blocks)
    batch = batch_seed(5, 2, 9)
    for layer, (block, fanout) in enumerate(zip(blocks, fanouts, strict=True)):
        dst = block.src_ids[: block.n_dst].numpy()
        key = reference_layer_key(batch, layer)
        assert key == layer_key(batch, layer)
        slots, count, _ = reference_layer(g.indptr, g.indices, dst, dst, fanout, key)
        for got, want, c in zip(block_neighbours(block), slots, count, strict=True):
            np.testing.assert_array_equal(got, want[:c])


def test_same_triple_same_picks_and_different_triples_differ() -> None:
    g = from_rows({v: list(range(10, 40)) for v in range(8)}, 40)  # 8 rows of degree 30
    sampler = DeviceNeighborSampler(g.indptr, g.indices, g.n_solid, g.n_local, [4], 1,
                                    choose="triton")  # fmt: skip
    seeds = np.arange(8)

    def picks(s: DeviceNeighborSampler, epoch: int, iteration: int) -> list[list[int]]:
        return [n.tolist() for n in block_neighbours(s.sample(seeds, epoch, iteration)[0])]

    one = picks(sampler, 3, 7)
    assert picks(sampler, 3, 7) == one
    again = DeviceNeighborSampler(g.indptr, g.indices, g.n_solid, g.n_local, [4], 1,
                                  choose="triton")  # fmt: skip
    assert picks(again, 3, 7) == one
    other_seed = DeviceNeighborSampler(g.indptr, g.indices, g.n_solid, g.n_local, [4], 2,
                                       choose="triton")  # fmt: skip
    for other in (picks(sampler, 3, 8), picks(sampler, 4, 7), picks(other_seed, 3, 7)):
        assert other != one
    assert len({tuple(p) for p in one}) > 1, "rows of one layer must draw different words"


# -- uniformity ----------------------------------------------------------------------------
def subset_pvalue(slots: np.ndarray, degree: int, fanout: int) -> float:
    """Chi-square p-value of the rows' subsets against all ``C(degree, fanout)`` equally
    likely (``slots``: positions, one row per draw)."""
    from scipy import stats

    counts = Counter(map(tuple, slots.tolist()))
    subsets = list(combinations(range(degree), fanout))
    assert set(counts) <= set(subsets) and len(subsets) == math.comb(degree, fanout)
    return float(stats.chisquare(np.array([counts[s] for s in subsets])).pvalue)


def test_subsets_are_uniform_and_biased_draws_are_not() -> None:
    """One row of degree 6 drawn 6000 times (the row index keys the words): all 20
    3-subsets equally likely. The same words through a biased draw (:data:`FOILS`: an
    off-by-one Floyd; 4-bit words, whose modulo bias is 3/16 against 2/16 at ``j = 5``)
    fail the same test."""
    degree, fanout, draws, key = 6, 3, 6000, 2024
    g = from_rows({0: list(range(degree))}, degree)  # neighbour id = position
    rows = np.zeros(draws, dtype=np.int64)
    slots, count, _ = run_kernel(g, rows, np.arange(draws), fanout, key)
    assert np.all(count == fanout)
    p = subset_pvalue(slots, degree, fanout)
    assert p > P_MIN, f"C({degree},{fanout}) subsets not uniform: p = {p:.2e}"
    for foil in FOILS:
        biased, _, _ = reference_layer(g.indptr, g.indices, rows, rows, fanout, key, foil)
        assert subset_pvalue(biased, degree, fanout) < P_MIN, foil


# -- arguments, resolution -----------------------------------------------------------------
def test_bad_arguments() -> None:
    g = mixed_graph()
    indptr, indices = torch.as_tensor(g.indptr), torch.as_tensor(g.indices)
    rows = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="fanout must be >= 1"):
        choose_layer(indptr, indices, rows, rows, 0, 1)
    with pytest.raises(ValueError, match=r"key must be in \[0, 2\^64\)"):
        choose_layer(indptr, indices, rows, rows, 2, 2**64)
    with pytest.raises(ValueError, match="rows must be a 1-D int64"):
        choose_layer(indptr, indices, rows.int(), rows, 2, 1)
    with pytest.raises(ValueError, match="indices must be a 1-D int32 or int64"):
        choose_layer(indptr, indices.float(), rows, rows, 2, 1)
    with pytest.raises(ValueError, match="one shape"):
        choose_layer(indptr, indices, rows, rows[:1], 2, 1)
    with pytest.raises(ValueError, match="n_valid must be an int64 tensor of one element"):
        choose_layer(indptr, indices, rows, rows, 2, 1, n_valid=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="at least one row"):
        choose_layer(indptr[:1], indices, rows, rows, 2, 1)
    for key in (torch.tensor([1, 2]), torch.tensor([1], dtype=torch.int32)):
        with pytest.raises(ValueError, match="a key tensor must be int64 of one element"):
            choose_layer(indptr, indices, rows, rows, 2, key)
    empty = choose_layer(indptr, indices, rows[:0], rows[:0], 3, 1)  # no launch
    assert empty.keys.shape == (0,) and empty.count.shape == (0,)
    with pytest.raises(ValueError, match="layer back end 'bogus'"):
        DeviceNeighborSampler(g.indptr, g.indices, g.n_solid, g.n_local, [2], 0, choose="bogus")  # type: ignore[arg-type]


def test_choice_of_layer_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    g = mixed_graph()

    def make(**kwargs) -> DeviceNeighborSampler:
        return DeviceNeighborSampler(g.indptr, g.indices, g.n_solid, g.n_local, [2], 0, **kwargs)

    assert make(backend="torch").choose == "torch"  # follows the Fused-Map back end
    assert make(backend="auto").choose == "triton"  # the interpreter is on
    assert make(backend="torch", choose="auto").choose == "triton"
    assert make(backend="triton", choose="torch").choose == "torch"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert make(backend="auto").choose == "torch"
    with pytest.raises(ValueError, match="layer back end 'triton' cannot run on cpu"):
        make(backend="torch", choose="triton")


# -- launches ------------------------------------------------------------------------------
class _Census(TorchDispatchMode):
    """While entered: ATen ops that are not views, and Triton launches of the kernels made
    by :meth:`launcher` (their interpreter's own ops not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.non_view_ops = self.triton_launches = 0
        self.counting = self.in_kernel = False

    def __enter__(self) -> _Census:
        self.counting = True
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        self.counting = False
        super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if not self.in_kernel and not func.is_view:
            self.non_view_ops += 1
        return func(*args, **(kwargs or {}))

    def launcher(self, kernel):  # noqa: ANN001, ANN201
        """``kernel`` counted: ``launcher(kernel)[grid](...)`` runs ``kernel[grid](...)``."""
        census = self

        class _Counted:
            def __getitem__(self, grid):  # noqa: ANN001, ANN204
                def launch(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                    census.triton_launches += census.counting
                    census.in_kernel = True
                    try:
                        return kernel[grid](*args, **kwargs)
                    finally:
                        census.in_kernel = False

                return launch

        return _Counted()


def layer_launches(
    choose: str, fanout: int, monkeypatch: pytest.MonkeyPatch, one_read: bool = False
) -> int:
    """Non-view ATen ops + Triton launches of one layer below the top (Triton Fused-Map),
    on the per-layer path or (``one_read``, the Triton kernel only) on a one-read batch."""
    g = mixed_graph()
    sampler = DeviceNeighborSampler(g.indptr, g.indices, g.n_solid, g.n_local, [fanout, 1], 3,
                                    backend="triton", choose=choose)  # fmt: skip
    census = _Census()
    kernels = (
        (choose_triton, "_choose_kernel"), (idmap_triton, "_insert_kernel"),
        (relabel_triton, "_count_kernel"), (relabel_triton, "_scan_kernel"),
        (relabel_triton, "_relabel_kernel"),
    )  # fmt: skip
    for module, name in kernels:
        monkeypatch.setattr(module, name, census.launcher(getattr(module, name)))
    seeds = np.array([8, 6, 0, 4])
    if one_read:
        assert sampler.reads_once(sampler.fanouts, len(seeds))
        counted_bounded = device_batch.sample_layer_bounded

        def bounded(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if not isinstance(args[3], torch.Tensor):  # the top layer (a host n_dst)
                return counted_bounded(*args, **kwargs)
            with census:
                return counted_bounded(*args, **kwargs)

        monkeypatch.setattr(device_batch, "sample_layer_bounded", bounded)
        sampler.sample(seeds, 0, 0)
        return census.non_view_ops + census.triton_launches
    counted = sampler._layer

    def layer(dst, fanout, draws, check_seeds):  # noqa: ANN001, ANN202
        if check_seeds:  # the top layer: not counted
            return counted(dst, fanout, draws, check_seeds)
        with census:
            return counted(dst, fanout, draws, check_seeds)

    monkeypatch.setattr(sampler, "_layer", layer)
    sampler._run(seeds, sampler.fanouts, 0, 0, one_read=False)
    return census.non_view_ops + census.triton_launches


def test_layer_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch path takes 3 ops per Floyd step; the Triton path the same launches
    whatever the fan-out, fewer than the torch path at fan-out 2, on one-read batches and
    read per layer (numbers in :mod:`distmb.pipeline.sample.device`)."""
    torch_path = {k: layer_launches("torch", k, monkeypatch) for k in (2, 5)}
    triton_path = {k: layer_launches("triton", k, monkeypatch) for k in (1, 16)}
    one_read = {k: layer_launches("triton", k, monkeypatch, one_read=True) for k in (1, 16)}
    assert torch_path[5] - torch_path[2] == 3 * 3
    assert triton_path[1] == triton_path[16] < torch_path[2]
    assert one_read[1] == one_read[16] < torch_path[2]
    assert one_read[1] > 2, "the census must have seen the one-read layer"
    assert one_read[1] <= 14, one_read  # 5 launches and 9 allocations (no launch on a GPU)
    print(f"launches: torch {torch_path}, triton {triton_path}, one-read {one_read}")


# -- the compiler --------------------------------------------------------------------------
def test_kernel_compiles_for_hopper() -> None:
    """The interpreter accepts code the compiler rejects: compile the kernel (both index
    dtypes, with and without a valid count and the key read from the device) to a cubin for
    sm_90, no GPU needed."""
    code = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from distmb.pipeline.sample.choose_triton import _choose_kernel
names = ("indptr_ptr", "rows_ptr", "dst_ptr", "keys_ptr", "count_ptr", "n_valid_ptr", "key_ptr")
for indices, valid_count in (("*i32", False), ("*i64", True)):
    sig = {n: "*i64" for n in names}
    sig.update(indices_ptr=indices, valid_ptr="*i1", n_dst="i64", n_rows="i64", fanout="i64",
               key="i64", ROWS="constexpr", SLOTS="constexpr", WRITE_VALID="constexpr",
               VALID_COUNT="constexpr", KEY_ON_DEVICE="constexpr")
    constexprs = {"ROWS": 64, "SLOTS": 16, "WRITE_VALID": True, "VALID_COUNT": valid_count,
                  "KEY_ON_DEVICE": valid_count}
    src = ASTSource(_choose_kernel, sig, constexprs=constexprs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    assert len(kernel.asm["cubin"]) > 0
    assert "rem.u64" in kernel.asm["ptx"], "the draw must reduce an unsigned word"
"""
    compile_triton_in_subprocess(code)
