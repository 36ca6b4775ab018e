"""Documented hyper-parameters: the README's accuracy tables are measured with these
(``benchmarks/accuracy.py`` writes ``results/accuracy.json``; the tests assert the bounds).

Each recipe is a dict of :class:`~distmb.config.train.TrainConfig` fields; :func:`as_flags` turns
one into ``python -m distmb.train`` flags.
"""

from __future__ import annotations

from typing import Any

from distmb.config.train import flag_of

#: Cora (Planetoid public split; 140 training vertices, hence the small batches).
CORA_SAGE: dict[str, Any] = dict(
    model="sage",
    layers=2,
    hidden=64,
    fanout=(10, 10),
    batch_size=20,
    lr=0.01,
    weight_decay=5e-4,
    dropout=0.5,
    epochs=30,
)
CORA_GAT: dict[str, Any] = {**CORA_SAGE, "model": "gat", "hidden": 16, "heads": 4}
#: Cora GraphSAGE with model selection: the "gcn" aggregator (DGL's SAGEConv, as the
#: full-graph references use), row-normalised features (PyG's NormalizeFeatures), a cosine
#: schedule over 100 epochs, early stopping after 50 evaluations without a better validation
#: accuracy, and the test accuracy of the best validation epoch.
CORA_SAGE_SELECTED: dict[str, Any] = {
    **CORA_SAGE,
    "aggr": "gcn",
    "normalize_features": "row",
    "lr_schedule": "cosine",
    "epochs": 100,
    "early_stop": 50,
}
#: Seeds of the model-selection entry (medians of 10: single Cora runs spread over 2-3 points).
CORA_SELECTED_SEEDS: tuple[int, ...] = tuple(range(10))

#: The multi-rank table: per dataset, one rank's recipe (P ranks use ``batch_size // P`` per
#: rank, the same global batch). The default synthetic graph with fewer, smaller batches
#: than the paper's defaults, so that the multi-rank runs stay within CI's time.
MULTI_RANK: dict[str, dict[str, Any]] = {
    "cora": {k: v for k, v in CORA_SAGE.items() if k not in ("model", "dropout")},
    "synthetic": dict(layers=2, fanout=(10, 15), hidden=128, batch_size=250, lr=0.003, epochs=15),
}

#: Seeds per dataset of the multi-rank table: Cora's 1000 test vertices make single runs
#: spread over 2-3 points, so it takes the median of 10; the synthetic graph (24000 test
#: vertices) of 3.
MULTI_RANK_SEEDS: dict[str, tuple[int, ...]] = {"cora": tuple(range(10)), "synthetic": (0, 1, 2)}


def as_flags(recipe: dict[str, Any]) -> list[str]:
    """``{"batch_size": 20, "fanout": (10, 10)}`` -> ``["--batch-size", "20", "--fanout",
    "10,10"]``."""
    flags = []
    for key, value in recipe.items():
        text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
        flags += [flag_of(key), text]
    return flags
