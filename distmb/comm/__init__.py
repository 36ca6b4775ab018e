"""Communication between ranks: the :class:`RankGroup` interface and its implementations
(:class:`MpiGroup`, :class:`TorchGroup`, :class:`SingleProcess`), the gradient all-reduce's
buckets, the launch's choice of group, the collective watchdog and the launchers'
environment."""

from distmb.comm.buckets import AllreduceStats, BucketedAllreduce
from distmb.comm.group import (
    GATHER_CHUNK_BYTES,
    TORCH_CPU_BACKEND,
    TORCH_CUDA_BACKEND,
    RankGroup,
    RowSink,
    SingleProcess,
    exchange_counts,
)
from distmb.comm.launch import launch_communicator
from distmb.comm.mpi import MpiGroup
from distmb.comm.torch import TorchGroup

__all__ = [
    "GATHER_CHUNK_BYTES",
    "TORCH_CPU_BACKEND",
    "TORCH_CUDA_BACKEND",
    "AllreduceStats",
    "BucketedAllreduce",
    "MpiGroup",
    "RankGroup",
    "RowSink",
    "SingleProcess",
    "TorchGroup",
    "exchange_counts",
    "launch_communicator",
]
