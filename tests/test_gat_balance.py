"""The work-balance counts of benchmarks/gat_balance.py against brute force on tiny rows."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gat_balance  # noqa: E402  (benchmarks/ is not a package)


def _brute_makespan(lengths: list[int], slots: int) -> int:
    """Each program in order on the slot that frees first (lowest slot on ties)."""
    free = [0] * slots
    for length in lengths:
        slot = min(range(slots), key=lambda i: free[i])
        free[slot] += length
    return max(free)


def test_tile_max_and_lane_ratio_match_a_loop_over_tiles() -> None:
    """A hub of 9 among rows of degree 1: its tile of 2 rows runs 18 lane-iterations."""
    deg = np.array([1, 9, 1, 1, 0, 2, 1], dtype=np.int64)
    expected = [max(deg[i : i + 2]) for i in range(0, deg.size, 2)]
    assert gat_balance.tile_max(deg, None, 2).tolist() == expected == [9, 1, 2, 1]
    order = np.array([1, 5, 0, 2, 3, 6, 4])
    assert gat_balance.tile_max(deg, order, 2).tolist() == [9, 1, 1, 0]
    kernel = gat_balance.Kernel("k", "src", 1, 1, 0, 0, rows=2)
    counted = gat_balance.count(kernel, deg, None, False, slots=1, own_edges=0)
    assert counted["edges"] == 15
    assert counted["lane_iterations"] == 2 * (9 + 1 + 2 + 1)
    assert counted["longest"] == 9 and counted["max_degree"] == 9
    # One slot runs every program back to back: each takes its longest row plus overhead.
    assert counted["makespan_steps"] == sum(m + gat_balance.PROGRAM_OVERHEAD for m in expected)


def test_makespan_matches_a_brute_force_schedule() -> None:
    rng = np.random.default_rng(0)
    for slots in (1, 3, 7):
        lengths = rng.integers(1, 40, size=25)
        lengths[rng.integers(0, 25)] = 300  # a hub
        got = gat_balance.makespan(lengths, slots)
        assert got == _brute_makespan(lengths.tolist(), slots)
