"""Run under mpiexec (every rank on this host): the node-local rank read from the
launcher's environment equals the rank in the shared-memory split of MPI_COMM_WORLD (the
fallback when no variable is set), and the local ranks are 0..P-1.

argv: (none)
"""

from __future__ import annotations

import os

from distmb.comm import MpiGroup
from distmb.comm.mpienv import LOCAL_RANK_VARIABLES, local_rank_from_env

from_env = local_rank_from_env()
assert from_env is not None, f"the launcher set none of {LOCAL_RANK_VARIABLES}"
assert MpiGroup().local_rank() == from_env
for name in LOCAL_RANK_VARIABLES:  # no launcher variable: the split decides
    os.environ.pop(name, None)
comm = MpiGroup()
split = comm.local_rank()
assert split == from_env, (split, from_env)
ranks = comm.allgather(split)
assert sorted(ranks) == list(range(comm.size)), ranks
if comm.rank == 0:
    print(f"local ranks {ranks}: environment and split agree", flush=True)
