"""Feature-cache replacement policies (distmb.pipeline.features.policy,
csrc/kernels/feature_cache.cpp) against
independent references: an exhaustive search of the optimal miss count over gather-level
policies, a literal Python simulation of the gather-level Belady rule (and of the previous,
access-by-access one, which it must never lose to), an OrderedDict LRU, and a replay of every
plan the way the executor applies it (hits read the slots as they are at the start of a gather,
then the fills are written in access order)."""

from __future__ import annotations

import collections
from functools import cache

import numpy as np
import pytest
import torch

from distmb import _C
from distmb.pipeline.features import NO_SLOT, BeladyPlanner, CachePlan, LruPlanner

INF = float("inf")


# -- trace generators ----------------------------------------------------------------------
def random_segments(
    rng: np.random.Generator, universe: int, length: int, skew: float | None = None
) -> list[list[int]]:
    """About ``length`` accesses over ids ``[0, universe)`` split into gathers of 1-4 ids, each
    gather without repeats; ``skew``: Zipf-like weights ``1 / (rank + 1) ** skew``."""
    if skew is None:
        weights = np.full(universe, 1.0 / universe)
    else:
        weights = 1.0 / np.arange(1, universe + 1) ** skew
        weights = weights[rng.permutation(universe)]
        weights /= weights.sum()
    segments: list[list[int]] = []
    total = 0
    while total < length:
        size = int(min(rng.integers(1, 5), universe, length - total))
        segments.append(rng.choice(universe, size=size, replace=False, p=weights).tolist())
        total += size
    return segments


def flatten(segments: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    trace = np.array([v for seg in segments for v in seg], dtype=np.int64)
    ptr = np.zeros(len(segments) + 1, dtype=np.int64)
    np.cumsum([len(seg) for seg in segments], out=ptr[1:])
    return trace, ptr


# -- references ----------------------------------------------------------------------------
def brute_force_opt(
    segments: list[list[int]], capacity: int, initial: frozenset[int] = frozenset()
) -> int:
    """Fewest misses over every gather-level policy: a gather misses exactly its ids not cached
    at its start, after which the cache may become any subset of (cache | gather) of at most
    ``capacity`` ids (memoised over (gather, set of cached ids as a bit mask))."""
    masks = [sum(1 << v for v in seg) for seg in segments]

    @cache
    def best(b: int, cached: int) -> float:
        if b == len(masks):
            return 0
        union = cached | masks[b]
        result = INF
        sub = union
        while True:  # every subset of union, union itself first and 0 last
            if sub.bit_count() <= capacity:
                result = min(result, best(b + 1, sub))
            if sub == 0:
                break
            sub = (sub - 1) & union
        return (masks[b] & ~cached).bit_count() + result

    return int(best(0, sum(1 << v for v in initial)))


def next_uses(trace: list[int], slots: list[int]) -> tuple[list[float], list[float]]:
    """(next position of every access's id, or INF; next use of every slot's id at the start)."""
    after = [INF] * len(trace)
    first: dict[int, float] = {}
    for t in range(len(trace) - 1, -1, -1):
        after[t] = first.get(trace[t], INF)
        first[trace[t]] = t
    return after, [first.get(v, INF) if v != NO_SLOT else INF for v in slots]


def place_miss(slots: list[int], slot_next: list[float], v: int, next_use: float) -> int:
    """The miss rule shared by both references: the lowest free slot; else the slot whose id
    has the farthest next use (the lowest among equal, never-used ones) when ``next_use`` is
    nearer; else NO_SLOT (bypass). Updates ``slots`` and ``slot_next``."""
    s = NO_SLOT
    if NO_SLOT in slots:
        s = slots.index(NO_SLOT)
    elif slots and next_use < max(slot_next):
        s = slot_next.index(max(slot_next))
    if s != NO_SLOT:
        slots[s] = v
        slot_next[s] = next_use
    return s


def reference_belady(slots: list[int], segments: list[list[int]]) -> tuple[list[int], list[int]]:
    """The documented gather-level rule, literally: per gather, every id in ``slots`` at its
    start hits; then its misses are placed in order. ``slots`` (id per slot, NO_SLOT when free)
    is updated in place; returns (hit_slot, fill_slot)."""
    trace = [v for seg in segments for v in seg]
    after, slot_next = next_uses(trace, slots)
    hits, fills = [], []
    lo = 0
    for seg in segments:
        start = list(slots)
        for t, v in enumerate(seg, lo):
            hits.append(start.index(v) if v in start else NO_SLOT)
            fills.append(NO_SLOT)
            if v in start:
                slot_next[start.index(v)] = after[t]
        for t, v in enumerate(seg, lo):
            if hits[t] == NO_SLOT:
                fills[t] = place_miss(slots, slot_next, v, after[t])
        lo += len(seg)
    return hits, fills


def reference_per_access_belady(slots: list[int], segments: list[list[int]]) -> int:
    """Misses of the previous rule (Belady's MIN with bypass decided access by access in trace
    order, an id replaced earlier in its own gather missing), literally."""
    trace = [v for seg in segments for v in seg]
    after, slot_next = next_uses(trace, slots)
    misses = 0
    for t, v in enumerate(trace):
        if v in slots:
            slot_next[slots.index(v)] = after[t]
        else:
            misses += 1
            place_miss(slots, slot_next, v, after[t])
    return misses


def replay(
    model: list[int], segments: list[list[int]], plan: CachePlan, gather_level: bool = True
) -> None:
    """Apply ``plan`` to ``model`` (id per slot) the way the executor does, checking it: a hit
    names a slot holding the id at the start of its gather; a hit is exactly an id cached at the
    start of its gather (``gather_level``) or at its access (LRU); fills go to the lowest free
    slot or replace."""
    capacity = len(model)
    hits, fills = plan.hit_slot.tolist(), plan.fill_slot.tolist()
    assert len(hits) == len(fills) == sum(len(seg) for seg in segments)
    t = 0
    for b, seg in enumerate(segments):
        start = list(model)  # what the executor's reads see
        for v in seg:
            h, f = hits[t], fills[t]
            assert (h == NO_SLOT) == (v not in (start if gather_level else model)), (b, t, v, h)
            if h != NO_SLOT:
                assert 0 <= h < capacity and start[h] == v, (b, t, v, h, start)
                assert f == NO_SLOT, (b, t, v, f)
            elif f != NO_SLOT:
                assert 0 <= f < capacity, (b, t, f)
                if NO_SLOT in model:
                    assert f == model.index(NO_SLOT), (b, t, f, model)  # lowest free slot
                model[f] = v
            t += 1
        held = [v for v in model if v != NO_SLOT]
        assert len(held) == len(set(held)), model
        assert model[: len(held)] == held  # occupied slots are a prefix


def lru_reference(order: collections.OrderedDict, capacity: int, ids: list[int]) -> list[bool]:
    hits = []
    for v in ids:
        if v in order:
            order.move_to_end(v)
            hits.append(True)
            continue
        hits.append(False)
        if capacity == 0:
            continue
        if len(order) == capacity:
            order.popitem(last=False)
        order[v] = True
    return hits


# -- Belady: optimality --------------------------------------------------------------------
def test_belady_matches_brute_force_optimum() -> None:
    rng = np.random.default_rng(20240611)
    cases = below_per_access = 0
    for _ in range(120):
        universe = int(rng.integers(4, 9))
        skew = None if rng.random() < 0.5 else float(rng.uniform(0.8, 1.6))
        segments = random_segments(rng, universe, int(rng.integers(8, 25)), skew)
        trace, ptr = flatten(segments)
        for capacity in range(universe + 1):
            planner = BeladyPlanner(capacity, universe)
            plan = planner.plan(trace, ptr)
            optimum = brute_force_opt(segments, capacity)
            assert plan.misses == optimum, (segments, capacity)
            replay([NO_SLOT] * capacity, segments, plan)
            below_per_access += optimum < reference_per_access_belady(
                [NO_SLOT] * capacity, segments
            )
            cases += 1
    assert cases > 700 and below_per_access > 20  # the cases where gathers matter are covered


def test_belady_carry_over_is_optimal_from_the_inherited_directory() -> None:
    rng = np.random.default_rng(7)
    for _ in range(30):
        universe = int(rng.integers(4, 8))
        capacity = int(rng.integers(1, universe))
        planner = BeladyPlanner(capacity, universe)
        model = [NO_SLOT] * capacity
        for _superbatch in range(3):
            segments = random_segments(rng, universe, int(rng.integers(8, 15)), 1.2)
            trace, ptr = flatten(segments)
            initial = frozenset(v for v in planner.slot_ids().tolist() if v != NO_SLOT)
            plan = planner.plan(trace, ptr)
            assert plan.misses == brute_force_opt(segments, capacity, initial)
            replay(model, segments, plan)
            assert model == planner.slot_ids().tolist()
            assert planner.cached_count == sum(v != NO_SLOT for v in model)


def test_belady_a_miss_takes_the_slot_of_a_row_its_gather_hit() -> None:
    """Capacity 1, ``a`` cached, gathers [b, a] then [b]: ``a`` hits, ``b`` takes its slot (its
    row was already copied) and hits next: 1 miss, where deciding access by access makes 2."""
    a, b = 0, 1
    planner = BeladyPlanner(1, 2)
    planner.plan([a])
    assert planner.slot_ids().tolist() == [a]
    plans = planner.plan_batches([[b, a], [b]])
    assert [p.hit_slot.tolist() for p in plans] == [[NO_SLOT, 0], [0]]
    assert [p.fill_slot.tolist() for p in plans] == [[0, NO_SLOT], [NO_SLOT]]
    assert sum(p.misses for p in plans) == 1 == brute_force_opt([[b, a], [b]], 1, frozenset([a]))
    assert reference_per_access_belady([a], [[b, a], [b]]) == 2
    assert planner.slot_ids().tolist() == [b]
    # a later miss of the same gather may replace an earlier one's fill: the later fill holds
    planner.reset()
    plans = planner.plan_batches([[a, b], [b]])
    assert [p.fill_slot.tolist() for p in plans] == [[0, 0], [NO_SLOT]]
    assert [p.hit_slot.tolist() for p in plans] == [[NO_SLOT, NO_SLOT], [0]]
    model = [NO_SLOT]
    replay(model, [[a, b], [b]], CachePlan(*map(np.concatenate, zip(*plans, strict=True))))
    assert model == planner.slot_ids().tolist() == [b]


def test_belady_never_misses_more_than_deciding_access_by_access() -> None:
    rng = np.random.default_rng(11)
    fewer = 0
    for case in range(60):
        universe = int(rng.integers(6, 60))
        capacity = int(rng.integers(0, universe + 1))
        planner = BeladyPlanner(capacity, universe)
        for superbatch in range(2):
            skew = None if (case + superbatch) % 2 else float(rng.uniform(0.6, 1.5))
            segments = random_segments(rng, universe, int(rng.integers(20, 300)), skew)
            trace, ptr = flatten(segments)
            old = reference_per_access_belady(planner.slot_ids().tolist(), segments)
            misses = planner.plan(trace, ptr).misses
            assert misses <= old, (case, superbatch)
            fewer += misses < old
    assert fewer > 0  # the gather-level plan does find more hits


# -- Belady: the exact rule, consistency, carry-over ----------------------------------------
@pytest.mark.parametrize(
    "universe,capacity,length",
    [(6, 0, 50), (6, 1, 60), (6, 6, 60), (6, 9, 60), (40, 7, 800), (300, 12, 4000)],
)
def test_belady_follows_the_documented_rule(universe: int, capacity: int, length: int) -> None:
    """Decision by decision against a literal Python simulation over several consecutive plans
    (the long traces also make the kernel rebuild its lazily invalidated heap)."""
    rng = np.random.default_rng(universe * 1000 + capacity)
    planner = BeladyPlanner(capacity, universe)
    slots = [NO_SLOT] * capacity
    model = [NO_SLOT] * capacity
    for superbatch in range(3):
        segments = random_segments(rng, universe, length, None if superbatch == 1 else 1.1)
        trace, ptr = flatten(segments)
        plan = planner.plan(trace, ptr)
        hits, fills = reference_belady(slots, segments)
        assert plan.hit_slot.tolist() == hits
        assert plan.fill_slot.tolist() == fills
        replay(model, segments, plan)
        assert model == slots == planner.slot_ids().tolist()
        if capacity == 0:
            assert plan.misses == trace.size and (plan.fill_slot == NO_SLOT).all()
        if capacity >= universe:  # only compulsory misses, and only in the first plan
            assert plan.misses == (len(set(trace.tolist())) if superbatch == 0 else 0)


def test_belady_plan_helpers_and_inputs() -> None:
    planner = BeladyPlanner(2, 10)
    plans = planner.plan_batches([[1, 2, 3], torch.tensor([3, 1, 2]), np.array([1], np.int32)])
    # 3 (next use 3) replaces 2 (next use 5); later 2 (never used again) is bypassed
    assert [p.hit_slot.tolist() for p in plans] == [[NO_SLOT] * 3, [1, 0, NO_SLOT], [0]]
    assert [p.fill_slot.tolist() for p in plans] == [[0, 1, 1], [NO_SLOT] * 3, [NO_SLOT]]
    assert planner.slot_ids().tolist() == [1, 3] and planner.cached_count == 2
    # one gather when batch_ptr is omitted; an empty trace is a no-op
    assert planner.plan([4]).hit_slot.tolist() == [NO_SLOT]
    assert planner.plan(np.zeros(0, np.int64)).hit_slot.size == 0
    assert planner.plan_batches([]) == []
    planner.reset()
    assert planner.cached_count == 0 and planner.slot_ids().tolist() == [NO_SLOT, NO_SLOT]
    assert (planner.capacity, planner.num_rows) == (2, 10)
    assert NO_SLOT == _C.CACHE_NO_SLOT == -1
    assert "capacity=2" in repr(planner)


def test_belady_errors_name_the_problem_and_leave_the_directory() -> None:
    planner = BeladyPlanner(2, 10)
    planner.plan([5, 6])
    before = planner.slot_ids().tolist()
    with pytest.raises(ValueError, match=r"gather 1 .* id 7 more than once"):
        planner.plan([7, 8, 9, 7, 7], [0, 3, 5])
    with pytest.raises(IndexError, match=r"trace\[2\] = 10 is not a row id in \[0, 10\)"):
        planner.plan([1, 2, 10])
    with pytest.raises(IndexError, match=r"-1 is not a row id"):
        planner.plan(torch.tensor([-1]))
    with pytest.raises(ValueError, match="batch_ptr must start at 0 and end at the trace length"):
        planner.plan([1, 2, 3], [0, 2])
    with pytest.raises(ValueError, match="batch_ptr must not decrease"):
        planner.plan([1, 2, 3], [0, 2, 1, 3])
    with pytest.raises(ValueError, match="batch_ptr must hold"):
        planner.plan([1], [])
    with pytest.raises(ValueError, match="trace must hold integers"):
        planner.plan([1.5])
    with pytest.raises(ValueError, match="1-D"):
        planner.plan([[1, 2]])
    assert planner.slot_ids().tolist() == before
    with pytest.raises(ValueError, match="capacity must be >= 0"):
        BeladyPlanner(-1, 10)
    with pytest.raises(ValueError, match="num_rows must be an integer"):
        BeladyPlanner(1, 2.5)  # type: ignore[arg-type]


# -- LRU -----------------------------------------------------------------------------------
@pytest.mark.parametrize("capacity", [0, 1, 3, 7, 12])
def test_lru_matches_ordered_dict(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    universe = 10
    cache = LruPlanner(capacity, universe)
    order: collections.OrderedDict = collections.OrderedDict()
    model = [NO_SLOT] * capacity
    for skew in (None, 1.3, None):
        segments = random_segments(rng, universe, 300, skew)
        for seg in segments:
            plan = cache.access(seg)
            assert (plan.hit_slot != NO_SLOT).tolist() == lru_reference(order, capacity, seg)
            if capacity > 0:
                assert (plan.fill_slot[plan.hit_slot == NO_SLOT] != NO_SLOT).all()
            replay(model, [seg], plan, gather_level=False)
            assert model == cache.slot_ids().tolist()
            assert sorted(v for v in model if v != NO_SLOT) == sorted(order)
            assert cache.cached_count == len(order)
    cache.reset()
    assert cache.cached_count == 0 and (cache.slot_ids() == NO_SLOT).all()
    assert cache.access([1]).fill_slot.tolist() == [0 if capacity else NO_SLOT]


def test_lru_errors() -> None:
    cache = LruPlanner(2, 5)
    cache.access([0, 1])
    with pytest.raises(ValueError, match=r"ids hold 3 more than once"):
        cache.access([3, 4, 3])
    with pytest.raises(IndexError, match=r"ids\[1\] = 5 is not a row id in \[0, 5\)"):
        cache.access([2, 5])
    assert cache.slot_ids().tolist() == [0, 1]
    with pytest.raises(ValueError, match="capacity must be an integer"):
        LruPlanner(True, 5)


# -- scale ---------------------------------------------------------------------------------
def test_scale_smoke_belady_never_worse_than_lru() -> None:
    """About 200k accesses over 50k ids in gathers of 1000 (skewed), one plan: a smoke run of the
    scale with the invariants that hold for any trace."""
    rng = np.random.default_rng(3)
    num_rows, capacity = 50_000, 5_000
    weights = 1.0 / np.arange(1, num_rows + 1) ** 0.9
    raw = rng.choice(num_rows, size=(280, 1000), p=weights / weights.sum())
    segments = []
    for row in raw:
        _, first = np.unique(row, return_index=True)
        segments.append(row[np.sort(first)])
    ptr = np.zeros(len(segments) + 1, dtype=np.int64)
    np.cumsum([s.size for s in segments], out=ptr[1:])
    trace = np.concatenate(segments)
    distinct = np.unique(trace).size
    assert trace.size > 190_000 and distinct > capacity

    belady = BeladyPlanner(capacity, num_rows).plan(trace, ptr).misses
    lru = LruPlanner(capacity, num_rows)
    lru_misses = sum(lru.access(seg).misses for seg in segments)
    assert distinct <= belady <= lru_misses  # compulsory misses <= optimum <= LRU
    big = BeladyPlanner(num_rows, num_rows)
    assert big.plan(trace, ptr).misses == distinct  # everything fits: compulsory misses only
    assert big.cached_count == distinct
