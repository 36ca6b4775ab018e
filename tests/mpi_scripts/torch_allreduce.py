"""Run under mpiexec: Communicator.allreduce_gradients through torch.distributed (gloo, the
group set up from the MPI launch) averages every rank's gradients, equal to the mean computed
from all ranks' gradients gathered over MPI, and bit for bit to the MPI all-reduce on 2
ranks; parameters without a gradient count as zeros.

argv: (none)
"""

from __future__ import annotations

import numpy as np
import torch

from distmb.comm.mpi import Communicator

comm = Communicator()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Linear(5, 3), torch.nn.Linear(3, 2))


def set_grads(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for i, p in enumerate(model.parameters()):
        # The last layer's bias has no gradient on rank 0 only.
        p.grad = None if (i == 5 and comm.rank == 0) else torch.randn(p.shape, generator=gen)


def grads() -> list[np.ndarray]:
    return [
        np.zeros(tuple(p.shape), np.float32) if p.grad is None else p.grad.numpy().copy()
        for p in model.parameters()
    ]


set_grads(100 + comm.rank)
mine = grads()
everyone = comm.allgather(mine)
want = [np.mean([g[i] for g in everyone], axis=0, dtype=np.float64) for i in range(len(mine))]

comm.allreduce_gradients(model)
via_mpi = grads()
set_grads(100 + comm.rank)
comm.use_torch_distributed()
assert torch.distributed.is_initialized() and torch.distributed.get_world_size() == comm.size
assert torch.distributed.get_rank() == comm.rank
comm.allreduce_gradients(model)
via_torch = grads()
assert comm.allreduce_stats.calls == 2
comm.close_torch_distributed()
assert not torch.distributed.is_initialized()

for w, a, b in zip(want, via_mpi, via_torch, strict=True):
    np.testing.assert_allclose(b, w, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(a, w, rtol=1e-6, atol=1e-6)
    if comm.size == 2:  # a + b in either order: no rounding difference
        np.testing.assert_array_equal(b, a)
if comm.rank == 0:
    print(f"torch all-reduce: {comm.size} ranks agree", flush=True)
