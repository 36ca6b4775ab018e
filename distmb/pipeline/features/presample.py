"""Which feature rows to cache statically: pre-sampling counts (FGNN/GNNLab's PreSC#1) or
in-degree.

Pre-sampling runs the training sampler's algorithm for a few epochs *with its own random
stream* (:func:`presample_seed`, never the training run's: that would be knowing the
future) and counts how often each input row was requested; the most requested rows are the
hot set.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from distmb.pipeline.sample.host import NeighborSampler

#: Mixed with the run's seed to give pre-sampling its own stream.
PRESAMPLE_STREAM = 0x5052_4553_43  # "PRESC"


def presample_seed(seed: int) -> int:
    """The sampler and shuffle seed of pre-sampling for a run seeded ``seed``: derived by a
    hash, different from ``seed`` itself."""
    derived = int(np.random.SeedSequence([seed, PRESAMPLE_STREAM]).generate_state(1, np.uint64)[0])
    derived >>= 1  # the samplers take seeds below 2**63
    return derived if derived != seed else derived ^ 1


def presample_counts(
    sampler: NeighborSampler,
    train_idx: np.ndarray,
    batch_size: int,
    epochs: int,
    num_rows: int,
    seed: int,
) -> np.ndarray:
    """int64[num_rows]: how often each row ``< num_rows`` of block 0's sources was requested
    over ``epochs`` pre-sampled epochs (batches of ``batch_size`` shuffled training vertices).

    Args:
        sampler: a sampler over the same graph and fan-outs as training, seeded with
            :func:`presample_seed` (the caller builds it).
        num_rows: rows of the feature table (halo rows count only when the table holds them).
        seed: shuffle seed (:func:`presample_seed` of the run's).
    """
    if epochs < 1:
        raise ValueError(f"presample epochs must be >= 1, got {epochs}")
    counts = np.zeros(num_rows, dtype=np.int64)
    train_idx = np.asarray(train_idx, dtype=np.int64)
    if not train_idx.size:
        return counts
    num_batches = -(-train_idx.size // batch_size)
    for epoch in range(epochs):
        order = train_idx[np.random.default_rng([seed, epoch]).permutation(train_idx.size)]
        for iteration, seeds in enumerate(np.array_split(order, num_batches)):
            src = sampler.sample(seeds, epoch, iteration)[0].src_ids.numpy()
            counts[src[src < num_rows]] += 1  # a block's sources are unique
    return counts


def hot_rows(scores: np.ndarray, tie_break: np.ndarray | None = None) -> np.ndarray:
    """int64[n]: row ids by decreasing ``scores`` (ties: decreasing ``tie_break``, then
    increasing id)."""
    scores = np.asarray(scores)
    keys = [np.arange(scores.size)]
    if tie_break is not None:
        keys.append(-np.asarray(tie_break, dtype=np.float64))
    keys.append(-scores.astype(np.float64))
    return np.lexsort(keys).astype(np.int64)


def static_hot_ids(
    policy: str,
    degree: np.ndarray,
    make_sampler: Callable[[int], NeighborSampler],
    train_idx: np.ndarray,
    batch_size: int,
    epochs: int,
    seed: int,
) -> np.ndarray:
    """int64[len(degree)]: a static cache's rows by decreasing priority, the one ranking of
    every static feature cache (host ``--cache-policy``, device ``--device-cache-policy``).

    Args:
        policy: ``presc`` (pre-sampling counts, ties by in-degree) or ``degree``.
        degree: in-degree of every row of the table (its length is the table's rows).
        make_sampler: builds a sampler over the training graph and fan-outs for a seed; called
            once, with :func:`presample_seed` of ``seed`` (``presc`` only).
        train_idx, batch_size: the training seeds and batch size pre-sampling batches.
        epochs: pre-sampled epochs (``--presample-epochs``).
        seed: the run's seed (pre-sampling derives its own stream from it).
    """
    degree = np.asarray(degree)
    if policy == "degree":
        return hot_rows(degree)
    if policy != "presc":
        raise ValueError(f"static cache policy must be presc or degree, got {policy!r}")
    stream = presample_seed(seed)
    counts = presample_counts(
        make_sampler(stream), train_idx, batch_size, epochs, degree.size, stream
    )
    return hot_rows(counts, tie_break=degree)
