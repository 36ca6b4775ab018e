"""distmb: distributed mini-batch GNN training on CPU clusters (DistGNN-MB)."""

__version__ = "0.1.0"
