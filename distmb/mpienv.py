"""Whether this process is one rank of an MPI job, read from the launcher's environment
(no mpi4py import: the partitioner and the trainer ask before deciding to load MPI)."""

from __future__ import annotations

import os

#: Environment variables that MPI launchers (mpirun, mpiexec, srun) set in every rank.
MPI_LAUNCH_MARKERS = (
    "PMI_RANK",
    "PMI_SIZE",
    "PMIX_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "MPI_LOCALNRANKS",
)


def is_mpi_launch() -> bool:
    """Whether this process was started by an MPI launcher (mpirun, mpiexec, srun)."""
    return any(m in os.environ for m in MPI_LAUNCH_MARKERS)
