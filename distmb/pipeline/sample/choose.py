"""Uniform sampling without replacement for many rows at once (vectorised Floyd).

Robert Floyd's algorithm draws a uniform ``k``-subset of ``[0, d)`` with ``k`` draws: for
``j = d-k .. d-1`` draw ``t`` uniform in ``[0, j]`` and take ``t``, or ``j`` when ``t`` was
taken already. Here step ``q`` of the algorithm runs for every row at once (the ``k`` steps'
random words drawn in one call, then three tensor ops a step, no loop over rows), so the cost
is ``O(rows * k^2)`` element operations whatever the degrees: hubs cost no more than other
rows.
"""

from __future__ import annotations

import torch

#: Random words are drawn below this bound and reduced modulo ``j + 1``; the modulo bias is
#: below ``(j + 1) / 2^62``, under ``2^-31`` for any degree below ``2^31``.
RANDOM_BOUND = 1 << 62


def choose_positions(deg: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """``k`` distinct positions of ``[0, deg[i])`` per row, ascending, uniform over subsets.

    Args:
        deg: int64[n] row degrees.
        k: positions per row, ``k >= 1``.
        generator: random source on ``deg``'s device.

    Returns:
        int64[n, k]. Rows with ``deg[i] <= k`` get ``[0, k)`` (the caller keeps their first
        ``deg[i]`` positions, i.e. the whole row).
    """
    n = deg.shape[0]
    # Step q's j for every row: rows with deg <= k run Floyd on [0, k). All k draws at once
    # (row q of ``draws`` is step q's; on the CPU the same numbers as k draws of n words).
    steps = torch.arange(k, dtype=torch.int64, device=deg.device).unsqueeze(1)
    j = (torch.clamp(deg, min=k) - k).unsqueeze(0) + steps  # int64[k, n]
    draws = torch.randint(0, RANDOM_BOUND, (k, n), generator=generator, device=deg.device)
    t = torch.remainder(draws, j + 1)
    picks = torch.empty((k, n), dtype=torch.int64, device=deg.device)  # step-major
    picks[0] = t[0]
    for q in range(1, k):  # three ops a step: compare, reduce, select
        taken = (picks[:q] == t[q]).any(dim=0)
        torch.where(taken, j[q], t[q], out=picks[q])
    return torch.sort(picks.t(), dim=1).values
