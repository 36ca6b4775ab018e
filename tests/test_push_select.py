"""The push choice (distmb.halo.hec.push_select) and its counter-based keys (distmb.core.rng).

- the tensor hash equals an independent pure-Python splitmix64, published splitmix64
  outputs and the C++ dropout masks built on ``csrc/include/rng.h``'s ``hash_key``;
- on hand-built and random candidate sets: at most ``nc`` per peer, every candidate of a
  peer with at most ``nc``, grouped by peer and ascending, equal to a brute-force choice
  (sort every peer's keys); the host (numpy) and the torch choice equal on CPU tensors (and
  on a GPU under ``pytest -m cuda``), also on a real partition's send lists;
- inclusion frequencies over many iterations follow the exact Efraimidis-Spirakis
  probabilities of a 4-candidate case (deterministic seeds: the test cannot flake).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import SMALL

from distmb import _C
from distmb.core.rng import hash_chain, hash_chain_t, hash_key, hash_key_t, mix64_t, to_unit_open
from distmb.data import load_dataset
from distmb.data.store.store import PartitionStore
from distmb.halo.hec.push_select import (
    PushTables,
    _largest,
    peer_keys,
    push_call_key,
    push_keys,
    rank_candidates_device,
    select_push_device,
    select_push_host,
)
from distmb.halo.hec.scheme import HecSettings, HistoricalEmbeddingScheme, _peers_of_solid
from distmb.partition import partition_graph
from distmb.pipeline.sample import NeighborSampler

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]
M64 = (1 << 64) - 1


# -- an independent pure-Python splitmix64 ------------------------------------------------------
def ref_mix64(x: int) -> int:
    """splitmix64's next() from state x (Steele, Lea & Flood 2014; Vigna's splitmix64.c)."""
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def ref_hash_key(seed: int, a: int, b: int = 0, c: int = 0) -> int:
    return ref_mix64(ref_mix64(ref_mix64(seed ^ ref_mix64(a)) ^ b) ^ c)


def ref_push_uniform(call: int, vid: int, peer: int) -> float:
    """u of candidate (vid, peer): the top 52 bits of mix64(hash_key(call, peer) ^ mix64(vid)),
    plus one half, over 2**52."""
    h = ref_mix64(ref_hash_key(call, peer) ^ ref_mix64(vid))
    return ((h >> 12) + 0.5) * 2.0**-52


def as_u64(t: torch.Tensor) -> list[int]:
    return [v & M64 for v in t.cpu().tolist()]


def signed(values: list[int]) -> torch.Tensor:
    return torch.tensor([v - (1 << 64) if v >> 63 else v for v in values], dtype=torch.int64)


# -- (d) the hash ------------------------------------------------------------------------------
def test_mix64_gives_published_splitmix64_outputs() -> None:
    # splitmix64 from state 0 and from seed 1234567 (Vigna's reference implementation).
    golden = 0x9E3779B97F4A7C15
    states = [0] + [(1234567 + i * golden) & M64 for i in range(5)]
    want = [
        0xE220A8397B1DCDAF,
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
        4593380528125082431,
        16408922859458223821,
    ]
    assert as_u64(mix64_t(signed(states))) == want


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_hash_equals_pure_python_integers(device: str) -> None:
    rng = np.random.default_rng(0)
    edge = [0, 1, 2**31, 2**32 - 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
    a = (
        edge
        + [int(v) for v in rng.integers(0, 2**63, 200)]
        + [2**64 - 1 - int(v) for v in rng.integers(0, 2**40, 50)]
    )
    b = [int(v) for v in rng.integers(0, 2**63, len(a))]
    for seed in (0, 7, 2**64 - 1, 0xDEADBEEFCAFEF00D):
        got = as_u64(hash_key_t(seed, signed(a).to(device), signed(b).to(device), 5))
        assert got == [ref_hash_key(seed, x, y, 5) for x, y in zip(a, b, strict=True)]
        assert as_u64(mix64_t(signed(a).to(device))) == [ref_mix64(x) for x in a]
    # Chains of one to four parts, mixed Python ints and tensors.
    for parts in ([a], [a, 9], [a, b, 3, b]):
        t_parts = [signed(p).to(device) if isinstance(p, list) else p for p in parts]
        got = as_u64(hash_chain_t(11, *t_parts))
        for i in range(len(a)):
            want = 11 ^ ref_mix64(a[i])
            for p in parts[1:]:
                want = ref_mix64(want) ^ (p[i] if isinstance(p, list) else p)
            assert got[i] == ref_mix64(want)
            if i < 3:
                assert (
                    hash_chain(11, *[p[i] if isinstance(p, list) else p for p in parts]) == got[i]
                )
    # A tensor seed broadcast against a scalar key.
    seeds = [int(v) for v in rng.integers(0, 2**63, 30)]
    got = as_u64(hash_key_t(signed(seeds).to(device), torch.tensor(123, device=device), 4))
    assert got == [ref_hash_key(s, 123, 4) for s in seeds]


def test_tensor_hash_reproduces_the_cpp_dropout_masks() -> None:
    """csrc: keep (row, col) iff 32 bits of mix64(hash_key(seed, row) ^ (col // 2)) (low
    half for even col) are below round((1 - p) * 2**32)."""
    n, k, p = 64, 13, 0.3
    for seed in (1, 2**63 + 5):
        want = torch.from_numpy(_C.dropout_keep_mask(seed, n, k, p).reshape(n, k)).bool()
        row_key = hash_key_t(seed, torch.arange(n))
        h = mix64_t(row_key[:, None] ^ (torch.arange(k) // 2))
        half = torch.where(torch.arange(k) % 2 == 1, (h >> 32) & 0xFFFFFFFF, h & 0xFFFFFFFF)
        assert torch.equal(half < round((1 - p) * 2**32), want)


def test_unit_is_open_and_keys_follow_the_formula() -> None:
    extremes = signed([0, 2**64 - 1, 2**63, 2**63 - 1])
    u = to_unit_open(extremes)
    assert bool(((u > 0) & (u < 1)).all())
    assert u[0].item() == 2.0**-53 and u[1].item() == 1 - 2.0**-53
    call = push_call_key(3, 1, 4, 2, 0)
    vid = torch.tensor([10, 11, 12], dtype=torch.int64)
    peer = torch.tensor([1, 1, 2], dtype=torch.int64)
    degree = torch.tensor([0.0, 2.0, 5.0], dtype=torch.float64)
    vid_mix = mix64_t(vid)
    keys = push_keys(peer_keys(call, 3, torch.device("cpu"))[peer], vid_mix, degree).tolist()
    for j in range(3):  # one peer's key as a Python int gives the same keys
        mine = peer == j
        one = push_keys(hash_key(call, j), vid_mix[mine], degree[mine]).tolist()
        assert one == [k for k, m in zip(keys, mine.tolist(), strict=True) if m]
    for v, j, d, key in zip(vid.tolist(), peer.tolist(), degree.tolist(), keys, strict=True):
        want = np.log(ref_push_uniform(call, v, j)) / max(d, 1.0)
        assert key == pytest.approx(want, rel=1e-15)
    # The call key mixes every counter.
    calls = {push_call_key(3, *c) for c in itertools.product(range(2), repeat=4)}
    assert len(calls) == 16


# -- the choice --------------------------------------------------------------------------------
def make_tables(
    peer_lists: list[list[int]], degree: list[float], orig_ids: list[int]
) -> PushTables:
    ptr = np.zeros(len(peer_lists) + 1, np.int64)
    ptr[1:] = np.cumsum([len(p) for p in peer_lists])
    ids = np.array([j for p in peer_lists for j in p], np.int32)
    return PushTables.on_host(ptr, ids, np.array(orig_ids, np.int64), np.array(degree, np.float64))


def brute_force(
    solid: np.ndarray,
    peer_lists: list[list[int]],
    tables: PushTables,
    nc: int,
    num_peers: int,
    call: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Per peer: every (position, key) pair; the nc largest keys (smaller position first
    among equal keys), then ascending positions."""
    chosen, counts = [], []
    for j in range(num_peers):
        cands = [i for i, v in enumerate(solid) if j in peer_lists[v]]
        keys = {
            i: push_keys(
                hash_key(call, j),
                mix64_t(torch.tensor([int(tables.orig_ids[solid[i]])])),
                torch.tensor([float(tables.degree[solid[i]])], dtype=torch.float64),
            ).item()
            for i in cands
        }
        best = sorted(cands, key=lambda i: (-keys[i], i))[:nc]
        chosen += sorted(best)
        counts.append(len(best))
    return np.array(chosen, np.int64), np.array(counts, np.int64)


def random_case(seed: int, n_solid: int, num_peers: int, max_peers: int):
    rng = np.random.default_rng(seed)
    peer_lists = []
    for _ in range(n_solid):
        m = int(rng.integers(0, max_peers + 1))
        peer_lists.append(sorted(rng.choice(num_peers, size=m, replace=False).tolist()))
    degree = rng.integers(0, 40, n_solid).astype(float).tolist()
    orig = rng.permutation(10 * n_solid)[:n_solid].tolist()
    tables = make_tables(peer_lists, degree, orig)
    solid = rng.permutation(n_solid)[: int(rng.integers(1, n_solid + 1))].astype(np.int64)
    return peer_lists, tables, solid


def device_choice(solid, tables, nc, num_peers, call, device):
    dev_tables = tables.to(torch.device(device))
    pos, counts = select_push_device(
        torch.from_numpy(solid).to(device), dev_tables, nc, num_peers, call
    )
    return pos.cpu().numpy(), counts


def test_hand_built_candidates() -> None:
    # 6 solid vertices, 3 peers; peer 1 has 5 candidates, peer 2 has 2, peer 0 none.
    peer_lists = [[1], [1, 2], [], [1], [1, 2], [1]]
    tables = make_tables(peer_lists, [1, 8, 3, 0, 2, 30], [50, 51, 52, 53, 54, 55])
    solid = np.array([5, 4, 3, 2, 1, 0], np.int64)  # positions 0..5 hold vertices 5..0
    call = push_call_key(0, 0, 0, 0, 0)
    # nc at least every group: everything, grouped by peer, positions ascending.
    pos, counts = select_push_host(solid, tables, 5, 3, call)
    assert counts.tolist() == [0, 5, 2]
    assert pos.tolist() == [0, 1, 2, 4, 5, 1, 4]
    # nc = 2: peer 1 keeps 2 of its 5, peer 2 both of its 2.
    pos, counts = select_push_host(solid, tables, 2, 3, call)
    assert counts.tolist() == [0, 2, 2]
    assert set(pos[:2].tolist()) <= {0, 1, 2, 4, 5} and pos[0] < pos[1]
    assert pos[2:].tolist() == [1, 4]
    ref_pos, ref_counts = brute_force(solid, peer_lists, tables, 2, 3, call)
    np.testing.assert_array_equal(pos, ref_pos)
    np.testing.assert_array_equal(counts, ref_counts)
    dev_pos, dev_counts = device_choice(solid, tables, 2, 3, call, "cpu")
    np.testing.assert_array_equal(dev_pos, pos)
    np.testing.assert_array_equal(dev_counts, counts)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(12))
def test_random_candidates_host_device_brute_force(case: int, device: str) -> None:
    num_peers = [2, 3, 5, 8][case % 4]
    peer_lists, tables, solid = random_case(case, 60, num_peers, min(num_peers - 1, 3))
    for nc in (1, 3, 10, 1000):
        call = push_call_key(case, nc, 2, 1, case % num_peers)
        pos, counts = select_push_host(solid, tables, nc, num_peers, call)
        ref_pos, ref_counts = brute_force(solid, peer_lists, tables, nc, num_peers, call)
        np.testing.assert_array_equal(pos, ref_pos)
        np.testing.assert_array_equal(counts, ref_counts)
        assert counts.max() <= nc and counts.sum() == pos.size
        dev_pos, dev_counts = device_choice(solid, tables, nc, num_peers, call, device)
        np.testing.assert_array_equal(dev_pos, pos)
        np.testing.assert_array_equal(dev_counts, counts)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs(device: str) -> None:
    tables = make_tables([[], []], [1, 1], [0, 1])
    for solid in (np.zeros(0, np.int64), np.array([1, 0], np.int64)):
        pos, counts = select_push_host(solid, tables, 2, 2, 0)
        assert pos.size == 0 and counts.tolist() == [0, 0]
        dev_pos, dev_counts = device_choice(solid, tables, 2, 2, 0, device)
        assert dev_pos.size == 0 and dev_counts.tolist() == [0, 0]


def test_largest_breaks_ties_by_smaller_index() -> None:
    keys = np.array([-1.0, -0.5, -0.5, -2.0, -0.5, -0.1])
    assert _largest(keys, 1).tolist() == [5]
    assert _largest(keys, 2).tolist() == [1, 5]
    assert _largest(keys, 3).tolist() == [1, 2, 5]
    assert _largest(keys, 5).tolist() == [0, 1, 2, 4, 5]


@pytest.fixture(scope="module")
def three_parts(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("push") / "p3"
    partition_graph(load_dataset(SMALL), 3, out, seed=0)
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_real_partition_host_equals_device(three_parts: Path, device: str) -> None:
    """The send lists of a 3-part partition: host and device choices agree for batches of
    computed sources, nc below and above the group sizes."""
    rng = np.random.default_rng(1)
    for rank in range(3):
        store = PartitionStore(three_parts, rank)
        ptr, ids = _peers_of_solid(store, 3)
        tables = PushTables.on_host(
            ptr,
            ids,
            np.asarray(store.orig_ids),
            np.asarray(store.in_degree[: store.n_solid], np.float64),
        )
        assert tables.max_peers == 2
        dev_tables = tables.to(torch.device(device))
        for it in range(4):
            solid = rng.permutation(store.n_solid)[:600].astype(np.int64)
            for nc in (5, 40, 100_000):
                call = push_call_key(0, 1, it, it % 3, rank)
                pos, counts = select_push_host(solid, tables, nc, 3, call)
                assert counts[rank] == 0 and counts.max() <= nc
                dev_pos, dev_counts = select_push_device(
                    torch.from_numpy(solid).to(device), dev_tables, nc, 3, call
                )
                np.testing.assert_array_equal(dev_pos.cpu().numpy(), pos)
                np.testing.assert_array_equal(dev_counts, counts)


# -- (c) the sampling distribution -------------------------------------------------------------
def exact_pair_probabilities(w: list[float]) -> dict[tuple[int, int], float]:
    """P(the chosen pair is {i, j}) when 2 of len(w) items are drawn without replacement, each
    draw proportional to weight among the rest (what Efraimidis-Spirakis keys realise)."""
    total = sum(w)
    return {
        (i, j): w[i] / total * w[j] / (total - w[i]) + w[j] / total * w[i] / (total - w[j])
        for i, j in itertools.combinations(range(len(w)), 2)
    }


#: Trials of the distribution test, and the chi-square bound for 5 degrees of freedom at
#: p = 1e-6 (scipy.stats.chi2.isf(1e-6, 5) = 35.9); the trials are deterministic.
TRIALS = 40_000
CHI2_5DOF_P1E6 = 35.9


def test_inclusion_follows_efraimidis_spirakis_probabilities() -> None:
    weights = [1.0, 2.0, 3.0, 4.0]
    tables = make_tables([[1]] * 4, weights, [100, 200, 300, 400])
    solid = np.arange(4, dtype=np.int64)
    # One call key per (epoch, iteration): the keys of all trials in one hash call.
    calls = [push_call_key(42, e, k, 1, 0) for e in range(TRIALS // 1000) for k in range(1000)]
    call_t = torch.tensor([c - (1 << 64) if c >> 63 else c for c in calls], dtype=torch.int64)
    peer_keys = hash_key_t(call_t, torch.ones(TRIALS, dtype=torch.int64))  # peer 1
    u = to_unit_open(hash_chain_t(peer_keys[:, None], torch.tensor([100, 200, 300, 400])))
    keys = torch.log(u) / torch.tensor(weights, dtype=torch.float64)
    chosen = torch.sort(torch.topk(keys, 2, dim=1).indices, dim=1).values.numpy()
    # The same keys as push_keys, and the same choices as select_push_host (a sample).
    for t in range(0, TRIALS, 997):
        pos, counts = select_push_host(solid, tables, 2, 2, calls[t])
        assert counts.tolist() == [0, 2] and pos.tolist() == chosen[t].tolist()
    exact = exact_pair_probabilities(weights)
    observed = {pair: 0 for pair in exact}
    for i, j in chosen.tolist():
        observed[(i, j)] += 1
    chi2 = sum((observed[p] - TRIALS * q) ** 2 / (TRIALS * q) for p, q in exact.items())
    assert chi2 < CHI2_5DOF_P1E6, (chi2, observed)
    # Inclusion probabilities per candidate, each within 5 standard deviations.
    for i in range(4):
        p = sum(q for pair, q in exact.items() if i in pair)
        freq = float(np.mean((chosen == i).any(axis=1)))
        assert abs(freq - p) < 5 * np.sqrt(p * (1 - p) / TRIALS), (i, freq, p)
    # Uniform weights would be rejected: the test can tell the weights apart.
    uniform = {pair: 1 / 6 for pair in exact}
    chi2_uniform = sum((observed[p] - TRIALS * q) ** 2 / (TRIALS * q) for p, q in uniform.items())
    assert chi2_uniform > 100 * CHI2_5DOF_P1E6


# -- the halo scheme's push --------------------------------------------------------------------
class RecordingPush:
    """Stands in for the embedding push: appends what ``start`` was given, on the host, to
    ``calls`` (shared by the layers: in call order)."""

    def __init__(self, calls: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        self.calls = calls

    def start(self, counts, tags, rows) -> None:
        host = [
            t.cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t) for t in (tags, rows)
        ]
        self.calls.append((np.array(counts), *host))


#: Iterations per epoch of the push traces (pushes start while k < M - d).
TRACE_ITERS = 6


def push_trace(part_dir: Path, rank: int, cache_device: str | None, block_device: str, nc: int):
    """HistoricalEmbeddingScheme._push of 3 iterations x 2 layers of real blocks of ``rank``'s part:
    what the pushes were given and what ``record`` saw."""
    store = PartitionStore(part_dir, rank)
    comm = SimpleNamespace(rank=rank, size=3, torch_group=None)  # a RankGroup without torch
    settings = HecSettings(enabled=True, size=1000, nc=nc, lifespan=2, delay=1)
    halo = HistoricalEmbeddingScheme(comm, store, settings, seed=5, cache_device=cache_device)
    halo.setup([4, 4])
    calls: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    halo.pushes = [RecordingPush(calls), RecordingPush(calls)]
    records: list[tuple] = []
    halo.record = lambda *args: records.append(args)
    sampler = NeighborSampler(
        np.asarray(store.indptr), np.asarray(store.indices), store.n_solid, store.n_local, [4, 4], 1
    )
    train = np.asarray(store.train_idx, np.int64)
    for k in range(3):
        blocks = sampler.sample(np.sort(train[k * 40 : (k + 1) * 40]), 0, k)
        for layer, block in enumerate(blocks):
            gen = torch.Generator().manual_seed(100 * k + layer)
            x = torch.randn(block.n_computed, 4, generator=gen)
            halo._push(layer, block.to(block_device), x.to(block_device), k, TRACE_ITERS)
    return calls, records


@pytest.mark.parametrize(
    ("cache_device", "block_device"),
    [
        pytest.param("cpu", "cpu", id="torch-ops-on-cpu"),
        pytest.param("cuda", "cuda", id="cuda", marks=pytest.mark.cuda),
    ],
)
def test_halo_push_on_the_device_equals_the_host_push(three_parts, cache_device, block_device):
    """HistoricalEmbeddingScheme._push with the C++ caches (the host choice) and with a device cache
    (the torch choice on the blocks' device): the same counts, tags and rows go to the push,
    and ``record`` sees them; some peers are capped at nc."""
    for rank in range(3):
        for nc in (7, 10**6):
            want, want_rec = push_trace(three_parts, rank, None, "cpu", nc)
            got, got_rec = push_trace(three_parts, rank, cache_device, block_device, nc)
            assert len(want) == len(got) == 6
            capped = 0
            for (c0, t0, r0), (c1, t1, r1), rec in zip(want, got, got_rec, strict=True):
                np.testing.assert_array_equal(c1, c0)
                np.testing.assert_array_equal(t1, t0)
                np.testing.assert_array_equal(r1, r0)
                assert c0[rank] == 0 and c0.max() <= nc and t0.size == c0.sum() == r0.shape[0]
                capped += int((c0 == nc).sum())
                assert rec[0] == "push"
                np.testing.assert_array_equal(rec[3], t1)
                np.testing.assert_array_equal(rec[4], r1)
                np.testing.assert_array_equal(rec[5], c1)
            assert [r[:3] for r in want_rec] == [r[:3] for r in got_rec]
            assert (capped > 0) == (nc == 7)


@pytest.mark.cuda
def test_device_choice_synchronises_only_for_the_counts(three_parts: Path) -> None:
    """Everything before the per-peer counts' copy queues device work only."""
    store = PartitionStore(three_parts, 0)
    ptr, ids = _peers_of_solid(store, 3)
    degree = np.asarray(store.in_degree[: store.n_solid], np.float64)
    tables = PushTables.on_host(ptr, ids, np.asarray(store.orig_ids), degree)
    cuda = tables.to(torch.device("cuda"))
    solid = torch.arange(store.n_solid, device="cuda")
    call = push_call_key(0, 0, 0, 0, 0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for nc in (5, 10**6):
            ordered, kept = rank_candidates_device(solid, cuda, nc, 3, call)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    pos, counts = select_push_host(solid.cpu().numpy(), tables, 10**6, 3, call)
    np.testing.assert_array_equal(kept.cpu().numpy(), counts)
    np.testing.assert_array_equal((ordered[: counts.sum()] % solid.numel()).cpu().numpy(), pos)
