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

Named shapes (:data:`SHAPES`, ``synthetic:shape=products``) preset several options at once;
options given beside ``shape`` override its values.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from distmb.core.errors import InputError
from distmb.data.csr import EDGE_CHUNK, EdgeChunks, build_csr
from distmb.data.graph import Graph
from distmb.data.split import stratified_split

#: Prefix of every error message about a synthetic spec or config.
_WHERE = "--dataset synthetic"

#: Largest supported vertex count: vertex ids are stored as int32 in the sampling table and
#: an undirected edge is encoded as ``lo * nodes + hi`` in an int64.
MAX_NODES = (1 << 31) - 1

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

#: Tolerance of the sum-of-fractions check (fractions are typed as decimals).
_FRACTION_SUM_TOL = 1e-9

#: ``hub_cap`` that lifts the cap on the expected degrees (only ``nodes - 1`` remains).
NO_HUB_CAP = 0.0

#: The spec key that selects a named shape (:data:`SHAPES`); not a config field.
SHAPE_KEY = "shape"

#: Named shapes: options preset by ``synthetic:shape=NAME`` (other options override them).
#: ``products``: a 200k-vertex stand-in for ogbn-products that an epoch on 2 cores can run
#: (products itself: 2.45M vertices, 123.7M in-edges, i.e. average degree ~50, 100
#: features, 47 classes; a strongly homophilous co-purchase graph): its feature and class
#: counts, average degree 30, uncapped power-law degrees (real hubs), and a quarter of the
#: vertices in the training split (50 batches of 1000 per epoch).
SHAPES: dict[str, dict[str, int | float]] = {
    "products": dict(
        nodes=200_000,
        avg_degree=30.0,
        classes=47,
        feat_dim=100,
        homophily=0.8,
        train_fraction=0.25,
        val_fraction=0.05,
        test_fraction=0.7,
        hub_cap=NO_HUB_CAP,
    ),
}

#: Independent random streams derived from the seed (see :func:`generate`).
_STREAMS = ("labels", "weights", "same_class_edges", "cross_class_edges", "features", "split")


@dataclass(frozen=True)
class SyntheticConfig:
    """Parameters of the synthetic graph; validated on construction.

    Attributes:
        nodes: number of vertices, in ``[2, 2**31 - 1]``.
        avg_degree: average number of neighbours of a vertex (undirected degree); the graph
            has exactly ``round(nodes * avg_degree / 2)`` undirected edges, i.e. about
            ``nodes * avg_degree`` in-edges after symmetrisation. In ``[0, nodes - 1]``.
        classes: number of classes (>= 2, <= nodes); classes are balanced.
        feat_dim: feature dimension (>= 1).
        homophily: fraction of edges whose two endpoints share a class, in ``[0, 1]``
            (exact; ``1 / classes`` is chance level).
        feature_signal: Euclidean norm of every class centroid in feature space, in units of
            the per-dimension noise standard deviation (``1 / sqrt(feat_dim)``: the stored
            centroid norm is ``feature_signal / sqrt(feat_dim)``); 0 makes features pure
            noise.
        train_fraction: fraction of every class in the training split, in ``[0, 1]``.
        val_fraction: fraction of every class in the validation split, in ``[0, 1]``.
        test_fraction: fraction of every class in the test split, in ``[0, 1]``; the three
            fractions sum to at most 1.
        power_law_exponent: exponent ``gamma > 2`` of the expected-degree distribution
            ``p(w) ~ w^-gamma`` (the degree tail follows it up to the hub cap).
        hub_cap: cap on the expected degrees, in units of ``sqrt(nodes * avg_degree)``;
            :data:`NO_HUB_CAP` (0) lifts it (the largest possible degree, ``nodes - 1``,
            remains). A positive cap may not put the largest expected degree below
            ``avg_degree`` (the mean must stay reachable).
        seed: non-negative random seed; the same config gives byte-identical arrays.
    """

    nodes: int = 30_000
    avg_degree: float = 16.0
    classes: int = 10
    feat_dim: int = 100
    homophily: float = 0.45
    feature_signal: float = 1.75
    train_fraction: float = 0.1
    val_fraction: float = 0.1
    test_fraction: float = 0.8
    power_law_exponent: float = 2.5
    hub_cap: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The ``KEY``s :meth:`from_spec` accepts, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_spec(cls, spec: str) -> SyntheticConfig:
        """Parse ``"nodes=100000,avg_degree=50,feat_dim=100"`` (the text after ``synthetic:``).

        Options not given keep their defaults; an empty spec gives the default config.
        ``shape=NAME`` starts from the named shape's options (:data:`SHAPES`) instead of the
        defaults, wherever it stands in the spec; the other options override them. Integer
        options accept whole numbers in float notation (``nodes=2.5e6``).

        Raises:
            InputError: unknown or repeated option, unknown shape, malformed item, bad or
                out-of-range value.
        """
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        values: dict[str, int | float] = {}
        shape: str | None = None
        for item in spec.split(","):
            item = item.strip()
            if not item:
                continue
            key, sep, text = item.partition("=")
            key = key.strip().lower()
            if not sep:
                raise InputError(f"{_WHERE}: option {item!r} is not KEY=VALUE")
            if key not in types and key != SHAPE_KEY:
                raise InputError(
                    f"{_WHERE}: unknown option {key!r}; expected one of "
                    + ", ".join((*cls.option_names(), SHAPE_KEY))
                )
            if key in values or (key == SHAPE_KEY and shape is not None):
                raise InputError(f"{_WHERE}: option {key!r} given twice")
            if key == SHAPE_KEY:
                shape = text.strip().lower()
                if shape not in SHAPES:
                    raise InputError(
                        f"{_WHERE}: unknown shape {text.strip()!r}; expected one of "
                        + ", ".join(SHAPES)
                    )
                continue
            values[key] = _parse_number(key, text.strip(), integer=types[key] == "int")
        preset = SHAPES[shape] if shape is not None else {}
        return cls(**{**preset, **values})  # type: ignore[arg-type]

    def to_spec(self) -> str:
        """The ``KEY=VALUE,...`` spec of this config (``from_spec(to_spec())`` round-trips)."""
        return ",".join(
            f"{f.name}={_format_value(getattr(self, f.name), f.type == 'int')}"
            for f in dataclasses.fields(self)
        )

    def validate(self) -> None:
        """Raise :class:`InputError` naming the first option that is mistyped or out of range."""
        for f in dataclasses.fields(self):
            _require_type(f.name, getattr(self, f.name), integer=f.type == "int")
        _require(self, "nodes", 2 <= self.nodes <= MAX_NODES, f"in [2, {MAX_NODES}]")
        _require(self, "classes", 2 <= self.classes <= self.nodes, "in [2, nodes]")
        _require(self, "feat_dim", self.feat_dim >= 1, ">= 1")
        _require(self, "seed", self.seed >= 0, ">= 0")
        _require(self, "avg_degree", 0 <= self.avg_degree <= self.nodes - 1, "in [0, nodes - 1]")
        _require(self, "homophily", 0 <= self.homophily <= 1, "in [0, 1]")
        _require(self, "feature_signal", self.feature_signal >= 0, ">= 0")
        _require(self, "power_law_exponent", self.power_law_exponent > 2, "> 2")
        _require(self, "hub_cap", self.hub_cap >= 0, f">= 0 ({NO_HUB_CAP:g} = no cap)")
        if self.hub_cap != NO_HUB_CAP and self.degree_cap() < self.avg_degree:
            raise InputError(
                f"{_WHERE}: hub_cap={self.hub_cap:g} caps the expected degrees at "
                f"{self.degree_cap():g}, below avg_degree={self.avg_degree:g}; expected "
                f"hub_cap >= {math.sqrt(self.avg_degree / self.nodes):.4g} or "
                f"{NO_HUB_CAP:g} (no cap)"
            )
        for name in ("train_fraction", "val_fraction", "test_fraction"):
            _require(self, name, 0 <= getattr(self, name) <= 1, "in [0, 1]")
        total = self.train_fraction + self.val_fraction + self.test_fraction
        if total > 1 + _FRACTION_SUM_TOL:
            raise InputError(
                f"{_WHERE}: train_fraction + val_fraction + test_fraction = {total:g}; "
                "expected at most 1"
            )
        same, cross = self.edge_counts()
        same_pairs, cross_pairs = _pair_counts(_class_sizes(self.nodes, self.classes))
        if same > same_pairs or cross > cross_pairs:
            raise InputError(
                f"{_WHERE}: avg_degree={self.avg_degree:g} with homophily={self.homophily:g} "
                f"needs {same} same-class and {cross} cross-class edges; expected at most "
                f"{same_pairs} and {cross_pairs} ({self.classes} classes over {self.nodes} nodes)"
            )

    def degree_cap(self) -> float:
        """Largest expected degree: ``hub_cap * sqrt(nodes * avg_degree)``, or ``nodes - 1``
        with :data:`NO_HUB_CAP`."""
        if self.hub_cap == NO_HUB_CAP:
            return float(self.nodes - 1)
        return self.hub_cap * math.sqrt(self.nodes * self.avg_degree)

    def edge_counts(self) -> tuple[int, int]:
        """(same-class, cross-class) numbers of undirected edges the graph will have."""
        total = round(self.nodes * self.avg_degree / 2)
        same = round(self.homophily * total)
        return same, total - same


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
    labels = _balanced_labels(rngs["labels"], n, config.classes)
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
    build = build_csr(_key_chunks(n, same_keys, cross_keys), n, symmetrize=True, source=_WHERE)
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
        source=_WHERE,
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

    Why the division (added by the fix of issue item 8; the random draws are unchanged):
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


def _balanced_labels(rng: np.random.Generator, nodes: int, classes: int) -> np.ndarray:
    """int64[nodes]: classes of sizes ``nodes // classes`` or one more, in random order."""
    return rng.permutation(np.arange(nodes, dtype=np.int64) % classes)


def _class_sizes(nodes: int, classes: int) -> np.ndarray:
    """int64[classes]: the sizes :func:`_balanced_labels` gives."""
    return np.array(
        [nodes // classes + (c < nodes % classes) for c in range(classes)], dtype=np.int64
    )


def _pair_counts(sizes: np.ndarray) -> tuple[int, int]:
    """(same-class, cross-class) numbers of distinct vertex pairs for these class sizes."""
    n = int(sizes.sum())
    same = sum(int(s) * (int(s) - 1) // 2 for s in sizes)
    return same, n * (n - 1) // 2 - same


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


def _parse_number(key: str, text: str, *, integer: bool) -> int | float:
    """``text`` as an int (whole numbers such as ``1e5`` accepted) or a finite float."""
    kind = "an integer" if integer else "a number"
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{_WHERE}: {key}={text!r} is not {kind}") from None
    if not math.isfinite(value):
        raise InputError(f"{_WHERE}: {key}={text!r} is not a finite number")
    if not integer:
        return value
    try:
        return int(text)  # exact for long integers
    except ValueError:
        pass
    if not value.is_integer():
        raise InputError(f"{_WHERE}: {key}={text!r} is not a whole number")
    return int(value)


def _format_value(value: float, integer: bool) -> str:
    """``value`` as :func:`_parse_number` reads it back exactly (numpy scalars included)."""
    return str(int(value)) if integer else repr(float(value))


def _require_type(name: str, value: object, *, integer: bool) -> None:
    """Raise unless ``value`` is an int (``integer``) or a finite real number."""
    if integer:
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    else:
        ok = (
            isinstance(value, (int, float, np.integer, np.floating))
            and not isinstance(value, bool)
            and math.isfinite(value)
        )
    if not ok:
        kind = "an integer" if integer else "a finite number"
        raise InputError(f"{_WHERE}: {name}={value!r} is not {kind}")


def _require(config: SyntheticConfig, name: str, ok: bool, expected: str) -> None:
    """Raise naming option ``name`` and the expected range unless ``ok``."""
    if not ok:
        raise InputError(
            f"{_WHERE}: {name}={getattr(config, name)} is out of range; expected {expected}"
        )
