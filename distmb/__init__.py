"""distmb: distributed mini-batch GNN training on CPU clusters (DistGNN-MB).

The public API (docs/api.md), imported on first use so that ``import distmb`` stays cheap
(no torch, no C++ extension until a name is used)::

    import distmb

    graph = distmb.load_dataset("synthetic")            # or distmb.from_pyg(data)
    config = distmb.TrainConfig(layers=2, fanout=(10, 10), epochs=5)
    history = distmb.Trainer(distmb.LocalGraph.from_graph(graph), config).fit()
    for batch in distmb.NeighborLoader(graph, graph.train_idx, [10, 10], batch_size=256):
        ...                                              # batch.blocks, batch.x, batch.labels
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Each public name and the module that defines it.
_EXPORTS: dict[str, str] = {
    "BlockModel": "distmb.nn",
    "GAT": "distmb.nn",
    "GCN": "distmb.nn",
    "GIN": "distmb.nn",
    "Graph": "distmb.data",
    "GraphSAGE": "distmb.nn",
    "LocalGraph": "distmb.data.local",
    "MiniBatch": "distmb.pipeline",
    "NeighborLoader": "distmb.pipeline",
    "TrainConfig": "distmb.config.train",
    "Trainer": "distmb.engine",
    "build_model": "distmb.nn",
    "from_dgl": "distmb.data",
    "from_pyg": "distmb.data",
    "layerwise_inference": "distmb.engine.evaluate",
    "load_dataset": "distmb.data",
    "partition_graph": "distmb.partition",
    "predict": "distmb.predict",
}

__all__ = [
    "BlockModel",
    "GAT",
    "GCN",
    "GIN",
    "Graph",
    "GraphSAGE",
    "LocalGraph",
    "MiniBatch",
    "NeighborLoader",
    "TrainConfig",
    "Trainer",
    "__version__",
    "build_model",
    "from_dgl",
    "from_pyg",
    "layerwise_inference",
    "load_dataset",
    "partition_graph",
    "predict",
]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports lazily
    from distmb.config.train import TrainConfig
    from distmb.data import Graph, from_dgl, from_pyg, load_dataset
    from distmb.data.local import LocalGraph
    from distmb.engine import Trainer
    from distmb.engine.evaluate import layerwise_inference
    from distmb.nn import GAT, GCN, GIN, BlockModel, GraphSAGE, build_model
    from distmb.partition import partition_graph
    from distmb.pipeline import MiniBatch, NeighborLoader
    from distmb.predict import predict


def __getattr__(name: str) -> Any:
    """Import the public name ``name`` from its module on first use (then cache it here)."""
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'distmb' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    # ``distmb.predict`` names a submodule too: the name stays bound to that module, which is
    # callable (it calls the function), so ``import distmb.predict`` and ``distmb.predict(...)``
    # agree in either order.
    value = module if module_name == f"{__name__}.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
