"""The exact halo scheme (``--exact-remote``, DistDGL-like): batches sampled across ranks
(:class:`ExactBatchSampler`), their input rows fetched from the owners
(:class:`RemoteFeatures`), assembled by :class:`ExactRemote`."""

from distmb.halo.exact.remote import RemoteFeatures
from distmb.halo.exact.sampler import ExactBatchSampler
from distmb.halo.exact.scheme import ExactRemote

__all__ = ["ExactBatchSampler", "ExactRemote", "RemoteFeatures"]
