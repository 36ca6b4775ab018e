"""Whether this process is one rank of an MPI job or of a ``torchrun`` job, read from the
launcher's environment (no mpi4py or torch import: the partitioner and the trainer ask before
deciding what to load)."""

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


#: Set by ``torchrun`` (``python -m torch.distributed.run``) in every worker it starts.
TORCHRUN_MARKER = "TORCHELASTIC_RUN_ID"
#: The ``env://`` rendezvous of ``torch.distributed``: set together by torchrun, or by hand
#: for a launcher of one's own.
TORCH_ENV_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def is_torchrun_launch(environ: dict[str, str] | None = None) -> bool:
    """Whether this process is one worker of ``torchrun`` (its :data:`TORCHRUN_MARKER`, or all
    of :data:`TORCH_ENV_VARIABLES`) and was not started by an MPI launcher: an MPI job that
    happens to export ``RANK`` or ``MASTER_ADDR`` stays an MPI job (:func:`is_mpi_launch`
    wins)."""
    env = os.environ if environ is None else environ
    if any(m in env for m in MPI_LAUNCH_MARKERS):
        return False
    return TORCHRUN_MARKER in env or all(env.get(v) for v in TORCH_ENV_VARIABLES)


#: Environment variables that hold this process's rank among the ranks of its node, most
#: specific first: Open MPI's mpirun, MPICH's Hydra (mpiexec), Slurm's srun, PMIx launchers,
#: and torchrun. (MPICH sets ``MPI_LOCALNRANKS`` beside ``MPI_LOCALRANKID``.)
LOCAL_RANK_VARIABLES = (
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "SLURM_LOCALID",
    "PMIX_LOCAL_RANK",
    "LOCAL_RANK",
)


def local_rank_from_env(environ: dict[str, str] | None = None) -> int | None:
    """This process's rank among the ranks on its node, from the launcher's environment
    (:data:`LOCAL_RANK_VARIABLES`, the first one set wins), or None when no launcher said.

    Raises:
        ValueError: the variable is set but is not a non-negative integer (naming it).
    """
    env = os.environ if environ is None else environ
    for name in LOCAL_RANK_VARIABLES:
        value = env.get(name)
        if value is None or value == "":
            continue
        try:
            rank = int(value)
        except ValueError:
            rank = -1
        if rank < 0:
            raise ValueError(f"{name}={value!r}: expected this rank's index on its node (>= 0)")
        return rank
    return None
