"""Which :class:`~distmb.comm.group.RankGroup` a launched process gets."""

from __future__ import annotations

from distmb.comm.group import RankGroup
from distmb.comm.mpi import MpiGroup
from distmb.comm.mpienv import is_mpi_launch
from distmb.comm.torch import TorchGroup


def launch_communicator() -> RankGroup:
    """The ranks of this job: :class:`~distmb.comm.mpi.MpiGroup` when an MPI launcher started
    it, else :class:`~distmb.comm.torch.TorchGroup` (torchrun;
    :func:`distmb.comm.mpienv.is_torchrun_launch`)."""
    return MpiGroup() if is_mpi_launch() else TorchGroup()
