"""Offline partitioner: ``distmb-partition`` (METIS, train-balanced) -> format version 1."""

from distmb.partition.pipeline import partition_graph

__all__ = ["partition_graph"]
