"""Tests of the built-in synthetic dataset (distmb.data.datasets.synthetic)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from distmb.core.errors import InputError
from distmb.data import load_dataset
from distmb.data.datasets.synthetic import generate
from distmb.data.datasets.synthetic_config import NO_HUB_CAP, SyntheticConfig
from distmb.data.graph import Graph

#: A small graph for the structural tests (fast, but large enough for statistics).
SMALL = dict(nodes=20_000, avg_degree=12, classes=10, feat_dim=32, homophily=0.3)

#: Full-batch L-BFGS iterations and L2 weight of the reference classifiers.
REF_STEPS = 100
REF_WEIGHT_DECAY = 1e-3

#: Propagation hops of the SIGN-style reference: features [X, AX, A^2 X].
REF_HOPS = 2


def edge_list(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) int64[num_edges] of the in-edge CSR: ``src -> dst``."""
    dst = np.repeat(np.arange(g.num_nodes, dtype=np.int64), g.in_degree())
    return g.indices, dst


def measured_homophily(g: Graph) -> float:
    src, dst = edge_list(g)
    return float(np.mean(g.labels[src] == g.labels[dst]))


# --------------------------------------------------------------------------------------------
# Reference classifiers (independent of the library): linear models on raw and on propagated
# features. The propagated one is a linear proxy of what a 2-3 layer GNN sees (SGC/SIGN).
# --------------------------------------------------------------------------------------------


def propagated_features(g: Graph, hops: int) -> np.ndarray:
    """float32[n, (hops + 1) * d]: [X, AX, ..., A^hops X], A row-normalised with self-loops."""
    n = g.num_nodes
    adj = sp.csr_matrix(
        (np.ones(g.num_edges, dtype=np.float32), g.indices, g.indptr), shape=(n, n)
    ) + sp.identity(n, dtype=np.float32, format="csr")
    adj = sp.diags((1.0 / np.asarray(adj.sum(axis=1)).ravel()).astype(np.float32)) @ adj
    blocks = [g.features]
    for _ in range(hops):
        blocks.append(np.asarray(adj @ blocks[-1], dtype=np.float32))
    return np.concatenate(blocks, axis=1)


def linear_test_accuracy(x: np.ndarray, g: Graph) -> float:
    """Test accuracy of multinomial logistic regression fitted on the training split."""
    torch.manual_seed(0)
    feats = torch.from_numpy(x)
    train = torch.from_numpy(g.train_idx)
    test = torch.from_numpy(g.test_idx)
    feats = (feats - feats[train].mean(0)) / (feats[train].std(0) + 1e-6)
    labels = torch.from_numpy(g.labels)
    model = torch.nn.Linear(feats.shape[1], g.num_classes)
    opt = torch.optim.LBFGS(
        model.parameters(),
        lr=1.0,
        max_iter=REF_STEPS,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(feats[train]), labels[train])
        loss = loss + REF_WEIGHT_DECAY * sum((p**2).sum() for p in model.parameters())
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        pred = model(feats[test]).argmax(1)
    return float((pred == labels[test]).float().mean())


def test_default_is_learnable_but_needs_the_graph():
    g = generate()
    chance = 1.0 / g.num_classes
    raw = linear_test_accuracy(g.features, g)
    prop = linear_test_accuracy(propagated_features(g, REF_HOPS), g)
    assert raw >= chance + 0.25, f"raw-feature accuracy {raw:.3f} too close to chance"
    assert raw <= 0.70, f"raw features alone already give {raw:.3f}"
    assert prop - raw >= 0.15, f"graph adds only {prop - raw:.3f} ({raw:.3f} -> {prop:.3f})"
    assert prop <= 0.95, f"propagated features give {prop:.3f}: no room left for a GNN"


def test_graph_signal_comes_from_homophily():
    """At chance-level homophily the neighbourhood carries no class signal."""
    chance_level = dict(SMALL, homophily=1.0 / SMALL["classes"], feature_signal=1.75)
    g = generate(SyntheticConfig(**chance_level))
    raw = linear_test_accuracy(g.features, g)
    prop = linear_test_accuracy(propagated_features(g, REF_HOPS), g)
    assert prop - raw <= 0.03


# --------------------------------------------------------------------------------------------
# Determinism
# --------------------------------------------------------------------------------------------

ARRAYS = ("indptr", "indices", "features", "labels", "train_idx", "val_idx", "test_idx")


def test_same_config_gives_identical_arrays():
    cfg = SyntheticConfig(nodes=3000, avg_degree=10, feat_dim=16, seed=5)
    a, b = generate(cfg), generate(cfg)
    for name in ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
    assert a.identity() == b.identity()


def test_other_seed_gives_other_graph():
    a = generate(SyntheticConfig(nodes=3000, avg_degree=10, feat_dim=16, seed=5))
    b = generate(SyntheticConfig(nodes=3000, avg_degree=10, feat_dim=16, seed=6))
    assert a.identity()["sha256"] != b.identity()["sha256"]
    assert not np.array_equal(a.labels, b.labels)
    assert not np.array_equal(a.features, b.features)
    assert not np.array_equal(a.train_idx, b.train_idx)


def test_structure_does_not_depend_on_feature_options():
    a = generate(SyntheticConfig(nodes=3000, avg_degree=10, feat_dim=16, seed=5))
    b = generate(SyntheticConfig(nodes=3000, avg_degree=10, feat_dim=7, feature_signal=0.5, seed=5))
    for name in ("indptr", "indices", "labels", "train_idx", "val_idx", "test_idx"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


# --------------------------------------------------------------------------------------------
# Structure
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small() -> Graph:
    return generate(SyntheticConfig(**SMALL))


def test_symmetric_simple_graph(small: Graph):
    n = small.num_nodes
    src, dst = edge_list(small)
    forward = np.sort(src * n + dst)
    backward = np.sort(dst * n + src)
    assert np.array_equal(forward, backward), "some edge has no reverse"
    assert not np.any(src == dst), "self-loop"
    assert np.unique(forward).size == forward.size, "duplicate edge"


def test_exact_edge_count_and_degree(small: Graph):
    undirected = round(SMALL["nodes"] * SMALL["avg_degree"] / 2)
    assert small.num_edges == 2 * undirected
    assert small.in_degree().mean() == pytest.approx(SMALL["avg_degree"], rel=0.01)


@pytest.mark.parametrize("homophily", [0.0, 0.1, 0.3, 0.75, 1.0])
def test_measured_homophily_matches_config(homophily: float):
    g = generate(SyntheticConfig(**dict(SMALL, nodes=5000, homophily=homophily)))
    assert measured_homophily(g) == pytest.approx(homophily, abs=0.005)


def test_degree_distribution_is_heavy_tailed(small: Graph):
    deg = np.sort(small.in_degree())[::-1]
    mean = deg.mean()
    assert deg[0] >= 15 * mean
    # In a Poisson (Erdos-Renyi) graph of this mean the top 1 % hold ~2 % of the edges.
    top_share = deg[: deg.size // 100].sum() / deg.sum()
    assert top_share >= 0.10
    # CCDF slope on log-log axes between 2.5x and 10x the mean degree: -(gamma - 1) = -1.5.
    ks = mean * np.array([2.5, 5.0, 10.0])
    ccdf = np.array([(deg >= k).mean() for k in ks])
    slope = np.polyfit(np.log(ks), np.log(ccdf), 1)[0]
    assert -2.0 <= slope <= -1.1, slope


def test_larger_exponent_gives_lighter_tail():
    def top_share(exponent: float) -> float:
        g = generate(SyntheticConfig(**dict(SMALL, power_law_exponent=exponent)))
        deg = np.sort(g.in_degree())[::-1]
        return float(deg[: deg.size // 100].sum() / deg.sum())

    assert top_share(2.2) > top_share(3.0) > top_share(6.0)


def test_uncapped_degrees_have_hubs_beyond_the_old_cap():
    # Same seed, same weights before capping: only the cap differs.
    cap = math.sqrt(SMALL["nodes"] * SMALL["avg_degree"])  # the default cap (hub_cap=1)
    capped = generate(SyntheticConfig(**SMALL)).in_degree()
    free = generate(SyntheticConfig(**dict(SMALL, hub_cap=0))).in_degree()
    for deg in (capped, free):  # exact edge count either way
        assert deg.sum() == SMALL["nodes"] * SMALL["avg_degree"]
    # Capped: no vertex far above the cap (realised degrees scatter around the weights).
    assert capped.max() <= 1.1 * cap
    # Uncapped: Pareto(2.5) scaled to mean 12 has x_min = 12 / 3, so P(w >= cap) =
    # (cap / 4) ** -1.5 = 7.4e-4, i.e. ~15 of 20000 vertices above the old cap.
    expected_above = SMALL["nodes"] * (cap / (SMALL["avg_degree"] / 3)) ** -1.5
    assert expected_above == pytest.approx(14.7, abs=0.1)
    assert expected_above / 3 <= (free >= cap).sum() <= 3 * expected_above
    assert free.max() >= 3 * cap


def test_products_shape_against_its_config():
    cfg = SyntheticConfig.from_spec("shape=products")
    assert (cfg.nodes, cfg.avg_degree, cfg.feat_dim, cfg.classes) == (200_000, 30.0, 100, 47)
    assert cfg.train_fraction == 0.25 and cfg.hub_cap == NO_HUB_CAP
    g = generate(cfg)
    deg = g.in_degree()
    assert (g.num_nodes, g.feat_dim, g.num_classes) == (200_000, 100, 47)
    assert deg.mean() == pytest.approx(cfg.avg_degree, rel=1e-6)
    old_cap = math.sqrt(cfg.nodes * cfg.avg_degree)  # 2449
    assert deg.max() >= 2 * old_cap
    assert g.train_idx.size == pytest.approx(cfg.nodes / 4, rel=0.01)
    assert measured_homophily(g) == pytest.approx(cfg.homophily, abs=1e-6)


def test_shape_options_are_overridable():
    products = SyntheticConfig.from_spec("shape=products")
    cfg = SyntheticConfig.from_spec("nodes=20000, shape=products, seed=3")
    assert cfg == dataclasses.replace(products, nodes=20000, seed=3)
    assert SyntheticConfig.from_spec("shape=Products") == products
    # The spec a shaped config writes into the notes reads back without the shape.
    assert SyntheticConfig.from_spec(cfg.to_spec()) == cfg


def test_near_complete_graph_is_still_exact():
    # 10 vertices in 2 classes: 20 same-class pairs, all of which are asked for.
    g = generate(SyntheticConfig(nodes=10, classes=2, avg_degree=8, homophily=0.5, feat_dim=2))
    assert g.num_edges == 80
    assert measured_homophily(g) == 0.5


def test_tiny_and_empty_graphs():
    g = generate(SyntheticConfig(nodes=2, classes=2, avg_degree=1, homophily=0, feat_dim=3))
    assert g.num_edges == 2 and sorted(g.indices.tolist()) == [0, 1]
    empty = generate(SyntheticConfig(nodes=50, avg_degree=0, classes=5, feat_dim=3))
    assert empty.num_edges == 0 and empty.features.shape == (50, 3)


# --------------------------------------------------------------------------------------------
# Features, labels, splits
# --------------------------------------------------------------------------------------------


def test_features_labels_and_splits(small: Graph):
    cfg = SyntheticConfig(**SMALL)
    n, c = cfg.nodes, cfg.classes
    assert small.name == "synthetic"
    assert small.features.dtype == np.float32 and small.features.shape == (n, cfg.feat_dim)
    assert np.isfinite(small.features).all()
    assert small.labels.dtype == np.int64
    assert small.labels.min() >= 0 and small.labels.max() < c
    sizes = np.bincount(small.labels, minlength=c)
    assert sizes.max() - sizes.min() <= 1
    for idx, frac in (
        (small.train_idx, cfg.train_fraction),
        (small.val_idx, cfg.val_fraction),
        (small.test_idx, cfg.test_fraction),
    ):
        assert abs(idx.size - frac * n) <= c
        # stratified: every class gets its share
        per_class = np.bincount(small.labels[idx], minlength=c)
        assert np.all(np.abs(per_class - frac * sizes) <= 1)
    splits = np.concatenate([small.train_idx, small.val_idx, small.test_idx])
    assert np.unique(splits).size == splits.size


def test_class_centroids_have_the_configured_norm(small: Graph):
    cfg = SyntheticConfig(**SMALL)
    centroids = np.stack(
        [small.features[small.labels == k].mean(axis=0) for k in range(cfg.classes)]
    )
    norms = np.linalg.norm(centroids, axis=1)
    scale = 1.0 / np.sqrt(cfg.feat_dim)  # the noise's per-coordinate standard deviation
    assert np.allclose(norms, cfg.feature_signal * scale, rtol=0.1)
    noise = small.features - centroids[small.labels]
    assert noise.std() == pytest.approx(scale, rel=0.02)


@pytest.mark.parametrize("feat_dim", [16, 100, 1000])
def test_feature_rows_have_a_realistic_norm(feat_dim: int):
    """Rows have a mean squared norm of ``1 + feature_signal**2 / feat_dim`` (~1, like
    row-normalised real features), not ``feat_dim``: see ``synthetic._features``."""
    cfg = SyntheticConfig(nodes=2000, avg_degree=4, feat_dim=feat_dim)
    sq_norms = (generate(cfg).features.astype(np.float64) ** 2).sum(axis=1)
    expected = 1.0 + cfg.feature_signal**2 / feat_dim
    assert sq_norms.mean() == pytest.approx(expected, rel=0.05)


#: The default generator config on fewer vertices (same feature dimension and scale, same
#: degree law and homophily): 1000 training vertices, i.e. one default-sized batch.
DEFAULT_FEATURES_SMALL_GRAPH = dict(nodes=10_000)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_untrained_default_model_starts_at_chance_loss(seed: int):
    """The default GraphSAGE (3 layers, hidden 256, fan-out 5,10,15, dropout 0.5, as in
    ``python -m distmb.train``) starts at a training-mode cross-entropy within 15 % of
    ``ln(classes)`` on the built-in features: an untrained model is unsure of every class.
    Features of norm ``sqrt(feat_dim)`` gave ~6 for ``ln 10 = 2.3`` (issue item 8)."""
    from distmb.config.train import TrainConfig
    from distmb.data.local import LocalGraph
    from distmb.engine import Trainer

    g = generate(SyntheticConfig(**DEFAULT_FEATURES_SMALL_GRAPH))
    trainer = Trainer(
        LocalGraph.from_graph(g), TrainConfig(seed=seed, progress=False), log=lambda _: None
    )
    trainer.model.train()  # as in the first epoch: dropout on, sampled neighbourhoods
    total, count = 0.0, 0
    with torch.no_grad():
        for it, seeds in enumerate(trainer.epoch_batches(0)):
            batch = trainer.loader.make_batch(0, it, seeds)
            logits = trainer.model(batch.blocks, batch.x)
            y = torch.from_numpy(g.labels[seeds])
            total += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
            count += seeds.size
    chance = np.log(g.num_classes)
    assert count == g.train_idx.size
    assert abs(total / count - chance) <= 0.15 * chance, (total / count, chance)


def test_notes_record_the_config(small: Graph):
    assert small.notes[0] == "synthetic:" + SyntheticConfig(**SMALL).to_spec()


# --------------------------------------------------------------------------------------------
# Spec parsing
# --------------------------------------------------------------------------------------------


def test_empty_spec_gives_defaults():
    assert SyntheticConfig.from_spec("") == SyntheticConfig()
    assert SyntheticConfig.from_spec(" , ") == SyntheticConfig()


def test_spec_values():
    cfg = SyntheticConfig.from_spec("nodes=1e5, avg_degree=50,feat_dim=100 ,Seed=7,")
    assert cfg.nodes == 100_000 and type(cfg.nodes) is int
    assert cfg.avg_degree == 50.0 and cfg.feat_dim == 100 and cfg.seed == 7
    assert cfg.classes == SyntheticConfig().classes
    big = SyntheticConfig.from_spec("nodes=2500000,avg_degree=50")
    assert big.nodes == 2_500_000
    assert SyntheticConfig.from_spec("nodes=2.5e6").nodes == 2_500_000


def test_spec_round_trip():
    cfg = SyntheticConfig(nodes=1234, avg_degree=7.5, homophily=0.25, train_fraction=0.05, seed=3)
    assert SyntheticConfig.from_spec(cfg.to_spec()) == cfg


def test_load_dataset_dispatches_to_generator():
    g = load_dataset("synthetic:nodes=500,avg_degree=4,feat_dim=8")
    assert g.name == "synthetic" and g.num_nodes == 500 and g.feat_dim == 8
    with pytest.raises(InputError, match="unknown option 'node'"):
        load_dataset("synthetic:node=500")


@pytest.mark.parametrize(
    ("spec", "fragments"),
    [
        ("node=5", ["unknown option 'node'", "expected one of nodes, avg_degree, classes"]),
        ("nodes", ["'nodes' is not KEY=VALUE"]),
        ("nodes=abc", ["nodes='abc'", "integer"]),
        ("nodes=1.5", ["nodes='1.5'", "whole number"]),
        ("nodes=1", ["nodes=1", "[2,"]),
        ("nodes=5,nodes=6", ["'nodes' given twice"]),
        ("classes=1", ["classes=1", "[2, nodes]"]),
        ("nodes=10,classes=11", ["classes=11"]),
        ("feat_dim=0", ["feat_dim=0", ">= 1"]),
        ("seed=-1", ["seed=-1", ">= 0"]),
        ("avg_degree=nan", ["avg_degree", "finite"]),
        ("avg_degree=-1", ["avg_degree=-1.0", "[0, nodes - 1]"]),
        ("nodes=10,avg_degree=10", ["avg_degree=10.0", "[0, nodes - 1]"]),
        ("homophily=1.5", ["homophily=1.5", "[0, 1]"]),
        ("feature_signal=-0.1", ["feature_signal", ">= 0"]),
        ("power_law_exponent=2", ["power_law_exponent=2.0", "> 2"]),
        ("train_fraction=1.2", ["train_fraction=1.2", "[0, 1]"]),
        (
            "train_fraction=0.5,val_fraction=0.3,test_fraction=0.3",
            ["train_fraction + val_fraction + test_fraction = 1.1", "at most 1"],
        ),
        ("nodes=4,classes=2,avg_degree=2,homophily=1", ["same-class", "at most 2"]),
        ("hub_cap=-1", ["hub_cap=-1.0", ">= 0", "0 = no cap"]),
        (
            "nodes=100,avg_degree=10,hub_cap=0.1",
            ["hub_cap=0.1", "below avg_degree=10", ">= 0.3162"],
        ),
        ("shape=papers", ["unknown shape 'papers'", "expected one of products"]),
        ("shape=products,shape=products", ["'shape' given twice"]),
        ("shap=products", ["unknown option 'shap'", "seed, shape"]),
    ],
)
def test_bad_specs_are_rejected(spec: str, fragments: list[str]):
    with pytest.raises(InputError) as err:
        SyntheticConfig.from_spec(spec)
    message = str(err.value)
    assert message.startswith("--dataset synthetic: ")
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_direct_construction_is_validated():
    with pytest.raises(InputError, match="nodes='5' is not an integer"):
        SyntheticConfig(nodes="5")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="homophily"):
        SyntheticConfig(homophily=2.0)
    with pytest.raises(InputError, match="nodes=True"):
        SyntheticConfig(nodes=True)
    field_names = [f.name for f in dataclasses.fields(SyntheticConfig)]
    assert SyntheticConfig.option_names() == tuple(field_names)
