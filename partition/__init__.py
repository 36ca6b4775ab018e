"""Offline partitioner (imported as distmb.partition)."""
