"""Built-in synthetic dataset: power-law, class-homophilous graphs with class-correlated features.

``--dataset synthetic[:KEY=VALUE,...]`` builds a graph with :func:`generate` from a
:class:`SyntheticConfig`. The model is a degree-corrected stochastic block model in Chung-Lu
form:

1. **Labels**: the ``nodes`` vertices are split into ``classes`` classes of equal size (up to
   one vertex), assigned in random order.
2. **Expected degrees**: every vertex gets a weight drawn from a Pareto law with density
   ``~ w^-power_law_exponent``, scaled so that the mean is ``avg_degree`` and capped at
   ``hub_cap * sqrt(nodes * avg_degree)`` (by default ``hub_cap = 1``: hubs stay plausible;
   the scale is re-fitted after capping). ``hub_cap = 0`` lifts the cap (up to ``nodes - 1``,
   the largest possible degree): the tail then holds real hubs (at the default exponent 2.5
   the largest expected degree grows as ``~nodes^(2/3)`` instead of ``sqrt(nodes)``). The
   weights are independent of the labels.
3. **Edges**: exactly ``M = round(nodes * avg_degree / 2)`` distinct undirected edges, of which
   exactly ``round(homophily * M)`` join two vertices of the same class. A same-class edge
   draws ``u`` with probability proportional to its weight and ``v`` proportionally to the
   weight among ``u``'s class; a cross-class edge draws ``v`` among the other classes.
   Self-loops and repeats are discarded and re-drawn (in rounds) until both counts are met, so
   the measured homophily (fraction of edges whose endpoints share a class) and the average
   degree are exact. Weighted draws use a table in which vertex ``i`` fills ``~w_i`` slots,
   laid out class by class, so a draw restricted to a class is a uniform draw in a range.
4. **Features**: ``x_v = (mu[y_v] + noise) / sqrt(feat_dim)`` with ``noise ~ N(0, I)`` and
   ``mu[c]`` a random direction of Euclidean norm ``feature_signal``: a row has an expected
   Euclidean norm of about 1 (a pure-noise row exactly 1 in mean square), the scale of the
   L2-row-normalised features of real datasets, whatever ``feat_dim`` is (see
   :func:`_features` for why).
5. **Splits**: stratified by class (:func:`~distmb.data.split.stratified_split`).

Everything derives from ``seed`` through independent :class:`numpy.random.SeedSequence`
children (structure, features and splits do not perturb one another), is generated in
fixed-size chunks and is byte-identical for the same config. Memory stays bounded for
graphs of hundreds of millions of edges: the sampling table holds int32 ids (~128 bytes per
vertex); each kind of edge is kept as sorted int64 keys grown, sorted and de-duplicated in
one buffer (8 bytes per undirected edge plus one round's draws); the in-edge CSR (int32
indices up to 2**31 - 1 vertices) is built from chunks of the keys by
:func:`~distmb.data.csr.build_csr`, and the features are generated only once the keys are
freed. Peak: about 8 bytes per directed edge plus the sampling table, or the CSR plus the
features, whichever is larger.

The options, their ranges and the named shapes (``synthetic:shape=products`` presets several
options at once; options given beside ``shape`` override its values) are those of
:class:`~distmb.data.datasets.synthetic_config.SyntheticConfig`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from distmb.data.csr import EDGE_CHUNK, EdgeChunks, build_csr
from distmb.data.datasets.synthetic_config import WHERE, SyntheticConfig
from distmb.data.graph import Graph
from distmb.data.split import stratified_split

#: Mean number of sampling-table slots per vertex (the table holds ``~32 * nodes`` int32).
#: Weights are rounded to whole slots; 32 keeps the rounding error of the lightest vertices
#: (weight ~ mean / 3 at exponent 2.5) below ~5 %.
_SLOTS_PER_VERTEX = 32

#: Edges drawn per vectorised chunk (bounds the temporaries to ~100 MiB).
_EDGE_CHUNK = 1 << 22

#: Feature rows generated per chunk.
_FEATURE_CHUNK_ROWS = 1 << 16

#: Rounds of re-drawing rejected (self-loop or repeated) edges before giving up on exactness;
#: only nearly complete graphs need more than a few.
_MAX_ROUNDS = 32

#: A round draws at most this many times the missing edges (bounds a round of a dense graph).
_MAX_OVERDRAW = 64

#: Safety factor on the measured share of new distinct edges per draw: later draws collide
#: more often than earlier ones, so a round over-draws a little (the excess is trimmed).
_KEEP_RATE_MARGIN = 0.98

#: Fixed-point iterations that re-fit the weight scale after capping the hubs.
_CAP_ITERATIONS = 50

#: Independent random streams derived from the seed (see :func:`generate`).
_STREAMS = ("labels", "weights", "same_class_edges", "cross_class_edges", "features", "split")


def generate(config: SyntheticConfig | None = None) -> Graph:
    """Generate the synthetic graph described by ``config`` (the default config if ``None``).

    Returns:
        A validated :class:`Graph` named ``"synthetic"``: ``2 * M`` in-edges for the
        ``M = sum(config.edge_counts())`` undirected edges (fewer only for nearly complete
        graphs, as ``notes`` then says), float32 ``[nodes, feat_dim]`` features, int64 labels
        and stratified splits. ``notes`` starts with the config as a spec string.
    """
    config = config if config is not None else SyntheticConfig()
    rngs = dict(zip(_STREAMS, _spawn_rngs(config.seed, len(_STREAMS)), strict=True))
    n = config.nodes
    labels = balanced_labels(rngs["labels"], n, config.classes)
    notes = [f"synthetic:{config.to_spec()}"]

    same_target, cross_target = config.edge_counts()
    same_keys = cross_keys = np.zeros(0, dtype=np.int64)
    if same_target + cross_target > 0:
        sampler = _EdgeSampler.build(rngs["weights"], labels, config)
        same_keys, same_note = _draw_edges(rngs["same_class_edges"], sampler, same_target, True)
        cross_keys, cross_note = _draw_edges(
            rngs["cross_class_edges"], sampler, cross_target, False
        )
        del sampler
        notes += [note for note in (same_note, cross_note) if note]
    build = build_csr(_key_chunks(n, same_keys, cross_keys), n, symmetrize=True, source=WHERE)
    del same_keys, cross_keys  # the CSR holds the edges now; features come after, not beside

    features = _features(rngs["features"], labels, config)
    split_seed = int(rngs["split"].integers(0, 2**63 - 1))
    train_idx, val_idx, test_idx = stratified_split(
        labels,
        config.classes,
        config.train_fraction,
        config.val_fraction,
        config.test_fraction,
        split_seed,
    )
    return Graph.from_csr_build(
        "synthetic",
        build,
        features,
        labels,
        train_idx,
        val_idx,
        test_idx,
        config.classes,
        symmetric=True,
        source=WHERE,
        notes=notes,
    )


def _key_chunks(n: int, *key_arrays: np.ndarray) -> EdgeChunks:
    """The edges ``lo -> hi`` of edge keys ``lo * n + hi`` as a chunk source, decoded one
    chunk of :data:`~distmb.data.csr.EDGE_CHUNK` keys at a time."""

    def chunks() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for keys in key_arrays:
            for lo in range(0, keys.shape[0], EDGE_CHUNK):
                block = keys[lo : lo + EDGE_CHUNK]
                src = block // n
                yield src, block - src * n

    return chunks


@dataclass
class _EdgeSampler:
    """Weighted vertex sampling, optionally restricted to one class or to its complement.

    Attributes:
        table: int32[num_slots], vertex ids; vertex ``i`` fills ``weight_i`` consecutive
            slots and the vertices are laid out class by class.
        class_start: int64[classes], first slot of every class.
        class_slots: int64[classes], number of slots of every class.
        labels: int64[nodes], class of every vertex.
    """

    table: np.ndarray
    class_start: np.ndarray
    class_slots: np.ndarray
    labels: np.ndarray

    @property
    def num_slots(self) -> int:
        return int(self.table.shape[0])

    @classmethod
    def build(
        cls, rng: np.random.Generator, labels: np.ndarray, config: SyntheticConfig
    ) -> _EdgeSampler:
        """Draw the expected degrees (see the module docstring) and lay out the table."""
        degrees = _expected_degrees(rng, config)
        slots = np.rint(degrees * (_SLOTS_PER_VERTEX / degrees.mean())).astype(np.int64)
        np.maximum(slots, 1, out=slots)
        order = np.argsort(labels, kind="stable").astype(np.int32)
        class_slots = np.bincount(labels, weights=slots, minlength=config.classes)
        class_slots = class_slots.astype(np.int64)
        class_start = np.concatenate([[0], np.cumsum(class_slots)[:-1]]).astype(np.int64)
        table = np.repeat(order, slots[order])
        return cls(table=table, class_start=class_start, class_slots=class_slots, labels=labels)

    def sample(self, rng: np.random.Generator, count: int, same_class: bool) -> np.ndarray:
        """int64[<= count] sorted distinct edge keys ``lo * nodes + hi`` (``lo < hi``) of
        ``count`` weighted draws ``(u, v)``; self-loops are dropped."""
        n = self.labels.shape[0]
        u = self.table[rng.integers(0, self.num_slots, size=count)]
        cls = self.labels[u]
        if same_class:
            span = self.class_slots[cls]
            slot = self._scaled(rng.random(count), span)
            slot += self.class_start[cls]
        else:
            span = self.num_slots - self.class_slots[cls]
            slot = self._scaled(rng.random(count), span)
            slot += np.where(slot >= self.class_start[cls], self.class_slots[cls], 0)
        del span, cls
        v = self.table[slot]
        del slot
        lo = np.minimum(u, v).astype(np.int64)
        hi = np.maximum(u, v).astype(np.int64)
        keep = lo != hi
        keys = lo[keep]
        keys *= n
        keys += hi[keep]
        return _sorted_unique(keys)

    @staticmethod
    def _scaled(r: np.ndarray, span: np.ndarray) -> np.ndarray:
        """int64 ``floor(r * span)`` clamped to ``span - 1`` (float rounding near 1)."""
        slot = (r * span).astype(np.int64)
        np.minimum(slot, span - 1, out=slot)
        return slot


def _draw_edges(
    rng: np.random.Generator, sampler: _EdgeSampler, target: int, same_class: bool
) -> tuple[np.ndarray, str]:
    """Exactly ``target`` distinct edges of one kind (same- or cross-class) as sorted int64
    keys, drawn in rounds until the count is met; plus a note if it could not be met.

    A round appends its draws to the keys in one growing buffer, sorts it and removes repeats
    in place, so the peak is the keys plus one round's draws (8 bytes each)."""
    keys = np.zeros(0, dtype=np.int64)
    keep_rate = 1.0  # distinct new edges per draw, measured on the previous round
    for _ in range(_MAX_ROUNDS):
        missing = target - keys.shape[0]
        if missing <= 0:
            break
        draws = math.ceil(missing / max(keep_rate, 1.0 / _MAX_OVERDRAW))
        before = filled = keys.shape[0]
        keys.resize(before + draws, refcheck=False)  # realloc: grows without a second copy
        for lo in range(0, draws, _EDGE_CHUNK):
            new = sampler.sample(rng, min(_EDGE_CHUNK, draws - lo), same_class)
            keys[filled : filled + new.shape[0]] = new
            filled += new.shape[0]
            del new
        keys[:filled].sort()
        _shrink(keys, _compact(keys, filled, _distinct_in_sorted))
        keep_rate = max((keys.shape[0] - before) / draws, 0.0) * _KEEP_RATE_MARGIN
    excess = keys.shape[0] - target
    if excess > 0:
        dropped = np.zeros(keys.shape[0], dtype=bool)
        dropped[rng.choice(keys.shape[0], size=excess, replace=False)] = True

        def kept(block: np.ndarray, lo: int, previous: int | None) -> np.ndarray:
            return ~dropped[lo : lo + block.shape[0]]

        _shrink(keys, _compact(keys, keys.shape[0], kept))
        del dropped
    kind = "same-class" if same_class else "cross-class"
    note = (
        ""
        if keys.shape[0] == target
        else (
            f"only {keys.shape[0]} of {target} {kind} edges drawn after {_MAX_ROUNDS} rounds "
            "(graph nearly complete)"
        )
    )
    return keys, note


def _distinct_in_sorted(block: np.ndarray, lo: int, previous: int | None) -> np.ndarray:
    """bool mask of the entries of a sorted block that differ from their predecessor
    (``previous``: the entry before the block, None at the start)."""
    keep = np.empty(block.shape[0], dtype=bool)
    if block.shape[0]:
        keep[0] = previous is None or block[0] != previous
        np.not_equal(block[1:], block[:-1], out=keep[1:])
    return keep


def _compact(
    values: np.ndarray, count: int, keep: Callable[[np.ndarray, int, int | None], np.ndarray]
) -> int:
    """Move the kept entries of ``values[:count]`` to its front, in order and in place, one
    block of :data:`_EDGE_CHUNK` at a time; returns how many were kept.

    ``keep(block, lo, previous)`` returns the bool mask of the block ``values[lo:...]``;
    ``previous`` is the entry before the block as it was before any move (None for the first).
    """
    written = 0
    previous: int | None = None
    for lo in range(0, count, _EDGE_CHUNK):
        block = values[lo : min(lo + _EDGE_CHUNK, count)]
        mask = keep(block, lo, previous)
        previous = int(block[-1])
        chosen = block[mask]  # a copy: the write below may overlap the block
        values[written : written + chosen.shape[0]] = chosen
        written += chosen.shape[0]
    return written


def _shrink(values: np.ndarray, size: int) -> None:
    """Truncate an array that owns its buffer to ``size`` entries (realloc, no copy)."""
    values.resize(size, refcheck=False)


def _expected_degrees(rng: np.random.Generator, config: SyntheticConfig) -> np.ndarray:
    """float64[nodes] Pareto(``power_law_exponent``) weights with mean ``avg_degree`` and
    maximum :meth:`SyntheticConfig.degree_cap`; the scale is re-fitted after every capping."""
    raw = rng.pareto(config.power_law_exponent - 1, config.nodes) + 1.0
    cap = config.degree_cap()
    degrees = raw * (config.avg_degree / raw.mean())
    for _ in range(_CAP_ITERATIONS):
        np.minimum(degrees, cap, out=degrees)
        mean = degrees.mean()
        if mean >= config.avg_degree * (1 - 1e-6):
            break
        degrees *= config.avg_degree / mean
    np.minimum(degrees, cap, out=degrees)
    return degrees


def _features(rng: np.random.Generator, labels: np.ndarray, config: SyntheticConfig) -> np.ndarray:
    """float32[nodes, feat_dim]: (class centroid of norm ``feature_signal`` plus N(0, 1))
    divided by ``sqrt(feat_dim)``, so that a row has a norm of ~1 whatever ``feat_dim`` is.

    Why the division (added later; the random draws are unchanged):
    with unit-variance coordinates a row has norm ``~sqrt(feat_dim)`` (10 at the default
    ``feat_dim=100``), far above real inputs (Cora's binary rows ~4, row-normalised ones
    <= 1). GraphSAGE with zero biases is positively homogeneous in its input, so the initial
    logits scale linearly with the feature scale, and the DGL-style initialisation (Xavier with
    ReLU's gain, a self and a neighbour branch per layer, dropout's ``1 / (1 - p)``) raises
    the second moment ~2-5x per layer: the untrained default model gave training-mode logits
    of RMS ~4 and a first-epoch loss of ~6 instead of ``ln 10 = 2.3``. With 3 iterations per
    epoch on the default graph, Adam then spent ~10 epochs getting out of that state (33 %
    test accuracy after 10 epochs, 83.6 % after 40). The initialisation is the one DGL users
    expect and suits realistically scaled inputs, so the fix is here, where the unrealistic
    scale was produced. Dividing all features by one constant changes neither the
    signal-to-noise ratio nor what a model can learn (``feature_signal`` stays in units of the
    noise's per-coordinate standard deviation); only the feature bytes change.
    """
    centroids = rng.standard_normal((config.classes, config.feat_dim))
    centroids *= config.feature_signal / np.linalg.norm(centroids, axis=1, keepdims=True)
    centroids = centroids.astype(np.float32)
    scale = np.float32(1.0 / math.sqrt(config.feat_dim))
    features = np.empty((config.nodes, config.feat_dim), dtype=np.float32)
    for lo in range(0, config.nodes, _FEATURE_CHUNK_ROWS):
        block = features[lo : lo + _FEATURE_CHUNK_ROWS]
        rng.standard_normal(dtype=np.float32, out=block)
        block += centroids[labels[lo : lo + _FEATURE_CHUNK_ROWS]]
        block *= scale
    return features


def balanced_labels(rng: np.random.Generator, nodes: int, classes: int) -> np.ndarray:
    """int64[nodes]: classes of sizes ``nodes // classes`` or one more, in random order."""
    return rng.permutation(np.arange(nodes, dtype=np.int64) % classes)


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    """Sort ``keys`` in place and return its distinct values (a new array)."""
    keys.sort()
    if keys.shape[0] < 2:
        return keys
    distinct = np.empty(keys.shape[0], dtype=bool)
    distinct[0] = True
    np.not_equal(keys[1:], keys[:-1], out=distinct[1:])
    return keys[distinct]


def _spawn_rngs(seed: int, count: int) -> list[np.random.Generator]:
    """``count`` independent generators derived from ``seed``."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(count)]
