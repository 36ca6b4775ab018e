"""GNN layers and models over message-flow-graph blocks (:class:`distmb.pipeline.sample.Block`).

- :mod:`distmb.nn.aggregate`: aggregation primitives (the seam for fused kernels).
- :mod:`distmb.nn.sage`, :mod:`distmb.nn.gat`: the layers of equations 1 and 2.
- :mod:`distmb.nn.gcn`, :mod:`distmb.nn.gin`: GCN (symmetric normalisation) and GIN layers.
- :mod:`distmb.nn.models`: multi-layer models and :func:`build_model`.
- :mod:`distmb.nn.user`: the contract of a user's own model, ``--model package.module:Class``.
- :func:`bf16_products`: the fused kernels' matrix products on bfloat16 operands
  (``--precision bf16`` on the CPU; :mod:`distmb.nn.kernels.cpu_update`).
"""

from __future__ import annotations

from distmb.nn.aggregate import (
    AGGREGATORS,
    add_self_loops,
    aggregate,
    edge_dst,
    edge_softmax,
    in_degrees,
    weighted_aggregate,
)
from distmb.nn.gat import GATConv
from distmb.nn.gcn import GCNConv
from distmb.nn.gin import GINConv
from distmb.nn.kernels.cpu_update import bf16_products
from distmb.nn.models import (
    GAT,
    GCN,
    GIN,
    MODELS,
    BlockModel,
    GraphSAGE,
    HaloInputs,
    LayerInput,
    build_model,
)
from distmb.nn.sage import SAGEConv

__all__ = [
    "AGGREGATORS",
    "MODELS",
    "GAT",
    "GCN",
    "GIN",
    "BlockModel",
    "GATConv",
    "GCNConv",
    "GINConv",
    "GraphSAGE",
    "HaloInputs",
    "LayerInput",
    "SAGEConv",
    "add_self_loops",
    "aggregate",
    "bf16_products",
    "build_model",
    "edge_dst",
    "edge_softmax",
    "in_degrees",
    "weighted_aggregate",
]
