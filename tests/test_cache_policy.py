"""Feature-cache replacement policies (distmb.features.policy, csrc/feature_cache.cpp) against
independent references: an exhaustive search of the optimal miss count, a literal Python
simulation of the Belady rule, an OrderedDict LRU, and a replay of every plan the way the
executor applies it (hits read the slots as they are at the start of a gather, then the fills
are written in access order)."""

from __future__ import annotations

import collections
from functools import cache

import numpy as np
import pytest
import torch

from distmb import _C
from distmb.features import NO_SLOT, BeladyPlanner, CachePlan, LruPlanner

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
def brute_force_opt(trace: list[int], capacity: int, initial: frozenset[int] = frozenset()) -> int:
    """Fewest misses over every policy that, on a miss, bypasses, fills a free slot or replaces
    any cached id (memoised over (position, set of cached ids as a bit mask))."""
    n = len(trace)

    @cache
    def best(t: int, cached: int) -> int:
        if t == n:
            return 0
        bit = 1 << trace[t]
        if cached & bit:
            return best(t + 1, cached)
        options = [best(t + 1, cached)]  # bypass
        if capacity > 0:
            if bin(cached).count("1") < capacity:
                options.append(best(t + 1, cached | bit))
            rest = cached
            while rest:
                low = rest & -rest
                options.append(best(t + 1, (cached & ~low) | bit))
                rest &= rest - 1
        return 1 + min(options)

    mask = 0
    for v in initial:
        mask |= 1 << v
    return best(0, mask)


def reference_belady(slots: list[int], trace: np.ndarray) -> tuple[list[int], list[int]]:
    """The documented rule, literally: ``slots`` (id per slot, NO_SLOT when free) is updated in
    place; returns (hit_slot, fill_slot)."""
    trace_list = trace.tolist()
    n = len(trace_list)
    next_use = [INF] * n
    first: dict[int, float] = {}
    for t in range(n - 1, -1, -1):
        next_use[t] = first.get(trace_list[t], INF)
        first[trace_list[t]] = t
    slot_next = [first.get(v, INF) if v != NO_SLOT else INF for v in slots]
    hits, fills = [], []
    for t, v in enumerate(trace_list):
        if v in slots:
            s = slots.index(v)
            hits.append(s)
            fills.append(NO_SLOT)
            slot_next[s] = next_use[t]
            continue
        hits.append(NO_SLOT)
        s = NO_SLOT
        if NO_SLOT in slots:
            s = slots.index(NO_SLOT)
        elif slots:
            farthest = max(slot_next)
            if next_use[t] < farthest:
                s = slot_next.index(farthest)  # lowest slot among equal (never-used) ones
        fills.append(s)
        if s != NO_SLOT:
            slots[s] = v
            slot_next[s] = next_use[t]
    return hits, fills


def replay(model: list[int], segments: list[list[int]], plan: CachePlan) -> None:
    """Apply ``plan`` to ``model`` (id per slot) the way the executor does, checking it: a hit
    names a slot holding the id at the start of its gather; a hit is exactly an id cached at
    that point of the sequential simulation; fills go to the lowest free slot or replace."""
    capacity = len(model)
    hits, fills = plan.hit_slot.tolist(), plan.fill_slot.tolist()
    assert len(hits) == len(fills) == sum(len(seg) for seg in segments)
    t = 0
    for b, seg in enumerate(segments):
        start = list(model)  # what the executor's reads see
        for v in seg:
            h, f = hits[t], fills[t]
            assert (h == NO_SLOT) == (v not in model), (b, t, v, h)
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
    cases = 0
    for _ in range(80):
        universe = int(rng.integers(5, 9))
        skew = None if rng.random() < 0.5 else float(rng.uniform(0.8, 1.6))
        segments = random_segments(rng, universe, int(rng.integers(10, 21)), skew)
        trace, ptr = flatten(segments)
        for capacity in range(universe + 1):
            planner = BeladyPlanner(capacity, universe)
            plan = planner.plan(trace, ptr)
            assert plan.misses == brute_force_opt(trace.tolist(), capacity), (
                segments,
                capacity,
            )
            replay([NO_SLOT] * capacity, segments, plan)
            cases += 1
    assert cases > 500


def test_belady_carry_over_is_optimal_from_the_inherited_directory() -> None:
    rng = np.random.default_rng(7)
    for _ in range(25):
        universe = int(rng.integers(5, 9))
        capacity = int(rng.integers(1, universe))
        planner = BeladyPlanner(capacity, universe)
        model = [NO_SLOT] * capacity
        for _superbatch in range(3):
            segments = random_segments(rng, universe, int(rng.integers(8, 15)), 1.2)
            trace, ptr = flatten(segments)
            initial = frozenset(v for v in planner.slot_ids().tolist() if v != NO_SLOT)
            plan = planner.plan(trace, ptr)
            assert plan.misses == brute_force_opt(trace.tolist(), capacity, initial)
            replay(model, segments, plan)
            assert model == planner.slot_ids().tolist()
            assert planner.cached_count == sum(v != NO_SLOT for v in model)


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
        hits, fills = reference_belady(slots, trace)
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
            replay(model, [seg], plan)
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
