"""Run under mpiexec: ``distmb-partition --assignment`` with writing failing on the last rank
only; every rank must end with that error (no hang) and leave no partition behind.

argv: the distmb-partition arguments
"""

from __future__ import annotations

import sys

from mpi4py import MPI

from distmb.cli.partition import main
from distmb.partition import distwrite

real = distwrite.write_part


def failing(ctx, indptr, indices, p):
    if MPI.COMM_WORLD.rank == MPI.COMM_WORLD.size - 1:
        raise OSError(f"injected failure writing part {p}")
    return real(ctx, indptr, indices, p)


distwrite.write_part = failing
sys.exit(main(sys.argv[1:]))
