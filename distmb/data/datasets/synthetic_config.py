"""What ``--dataset synthetic[:KEY=VALUE,...]`` generates: :class:`SyntheticConfig`.

The options, their defaults and ranges, the named shapes (:data:`SHAPES`) and the spec text
(:meth:`SyntheticConfig.from_spec`, :meth:`SyntheticConfig.to_spec`). The model itself is
described, and generated, in :mod:`distmb.data.datasets.synthetic`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from distmb.core.errors import InputError

#: Prefix of every error message about a synthetic spec or config.
WHERE = "--dataset synthetic"

#: Largest supported vertex count: vertex ids are stored as int32 in the sampling table and
#: an undirected edge is encoded as ``lo * nodes + hi`` in an int64.
MAX_NODES = (1 << 31) - 1

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
                raise InputError(f"{WHERE}: option {item!r} is not KEY=VALUE")
            if key not in types and key != SHAPE_KEY:
                raise InputError(
                    f"{WHERE}: unknown option {key!r}; expected one of "
                    + ", ".join((*cls.option_names(), SHAPE_KEY))
                )
            if key in values or (key == SHAPE_KEY and shape is not None):
                raise InputError(f"{WHERE}: option {key!r} given twice")
            if key == SHAPE_KEY:
                shape = text.strip().lower()
                if shape not in SHAPES:
                    raise InputError(
                        f"{WHERE}: unknown shape {text.strip()!r}; expected one of "
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
                f"{WHERE}: hub_cap={self.hub_cap:g} caps the expected degrees at "
                f"{self.degree_cap():g}, below avg_degree={self.avg_degree:g}; expected "
                f"hub_cap >= {math.sqrt(self.avg_degree / self.nodes):.4g} or "
                f"{NO_HUB_CAP:g} (no cap)"
            )
        for name in ("train_fraction", "val_fraction", "test_fraction"):
            _require(self, name, 0 <= getattr(self, name) <= 1, "in [0, 1]")
        total = self.train_fraction + self.val_fraction + self.test_fraction
        if total > 1 + _FRACTION_SUM_TOL:
            raise InputError(
                f"{WHERE}: train_fraction + val_fraction + test_fraction = {total:g}; "
                "expected at most 1"
            )
        same, cross = self.edge_counts()
        same_pairs, cross_pairs = _pair_counts(class_sizes(self.nodes, self.classes))
        if same > same_pairs or cross > cross_pairs:
            raise InputError(
                f"{WHERE}: avg_degree={self.avg_degree:g} with homophily={self.homophily:g} "
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


def class_sizes(nodes: int, classes: int) -> np.ndarray:
    """int64[classes]: the sizes of the balanced classes (``nodes // classes`` or one more;
    :func:`~distmb.data.datasets.synthetic.balanced_labels` draws labels of these sizes)."""
    return np.array(
        [nodes // classes + (c < nodes % classes) for c in range(classes)], dtype=np.int64
    )


def _pair_counts(sizes: np.ndarray) -> tuple[int, int]:
    """(same-class, cross-class) numbers of distinct vertex pairs for these class sizes."""
    n = int(sizes.sum())
    same = sum(int(s) * (int(s) - 1) // 2 for s in sizes)
    return same, n * (n - 1) // 2 - same


def _parse_number(key: str, text: str, *, integer: bool) -> int | float:
    """``text`` as an int (whole numbers such as ``1e5`` accepted) or a finite float."""
    kind = "an integer" if integer else "a number"
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{WHERE}: {key}={text!r} is not {kind}") from None
    if not math.isfinite(value):
        raise InputError(f"{WHERE}: {key}={text!r} is not a finite number")
    if not integer:
        return value
    try:
        return int(text)  # exact for long integers
    except ValueError:
        pass
    if not value.is_integer():
        raise InputError(f"{WHERE}: {key}={text!r} is not a whole number")
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
        raise InputError(f"{WHERE}: {name}={value!r} is not {kind}")


def _require(config: SyntheticConfig, name: str, ok: bool, expected: str) -> None:
    """Raise naming option ``name`` and the expected range unless ``ok``."""
    if not ok:
        raise InputError(
            f"{WHERE}: {name}={getattr(config, name)} is out of range; expected {expected}"
        )
