"""Run under mpiexec (``--comm torch``: the MPI communicator opens a gloo group) or torchrun:
``close_torch_distributed`` frees the group, so its gloo worker threads are gone before the
interpreter exits, even when a torch optimizer was built after the group existed (it imports
``torch._dynamo``, which imports the torch module whose functions default to the group).

A group that outlives ``destroy_process_group`` keeps its worker threads; one of them freeing
a finished collective during interpreter finalization aborts the process at exit.

Prints ``rank R: threads BEFORE -> OPEN -> AFTER`` (this process's threads before the group,
with it, after its teardown; BEFORE counts what the MPI library started, if any).
"""

from __future__ import annotations

import os

import torch

from distmb.comm import launch_communicator
from distmb.comm.mpienv import is_torchrun_launch


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


if is_torchrun_launch():
    before = threads()
    comm = launch_communicator()  # opens the gloo group
else:
    comm = launch_communicator()  # MPI
    before = threads()
    comm.use_torch_distributed()  # a gloo group beside it
opened = threads()
model = torch.nn.Linear(3, 2)
optimizer = torch.optim.Adam(model.parameters(), lr=0.1)  # imports torch._dynamo
model(torch.ones(4, 3)).sum().backward()
comm.allreduce_gradients(model)
optimizer.step()
comm.close_torch_distributed()
print(f"rank {comm.rank}: threads {before} -> {opened} -> {threads()}", flush=True)
