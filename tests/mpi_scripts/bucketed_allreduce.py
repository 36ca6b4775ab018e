"""Run under mpiexec: the bucketed gradient all-reduce of ``--comm torch``
(``Communicator.prepare_gradients``) starts buckets during the backward pass and gives the
flat all-reduce's averages: bit for bit on 2 ranks (``a + b`` whatever the bucketing), to
rounding on more; a parameter that gets no gradient on one rank only counts as zeros there;
the mean of every rank's gradients gathered over MPI is the reference.

argv: (none)
"""

from __future__ import annotations

import numpy as np
import torch

from distmb.comm.mpi import Communicator

comm = Communicator()
comm.use_torch_distributed()


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(9, 40), torch.nn.ReLU(), torch.nn.Linear(40, 30), torch.nn.ReLU(),
        torch.nn.Linear(30, 6), torch.nn.Linear(6, 6),
    )  # fmt: skip


def backward(model: torch.nn.Module, step: int) -> None:
    gen = torch.Generator().manual_seed(1000 * step + comm.rank)
    x = torch.randn(17, 9, generator=gen)
    model.zero_grad(set_to_none=True)
    h = model[4](model[3](model[2](model[1](model[0](x)))))
    if comm.rank == 0 and step % 2 == 1:  # the last layer unused on rank 0 every other step
        out = h
    else:
        out = model[5](h)
    (out.square().sum() * (1 + comm.rank)).backward()


def grads(model: torch.nn.Module) -> list[np.ndarray]:
    return [p.grad.numpy().copy() for p in model.parameters()]


flat_model, bucket_model = make_model(), make_model()
# 64 floats per bucket: the six parameter tensors make several buckets.
comm.prepare_gradients(bucket_model, 64 * 4)
buckets = comm._buckets
assert buckets is not None and len(buckets.buckets) >= 4, buckets.buckets
for step in range(4):
    backward(flat_model, step)
    mine = [
        np.zeros(tuple(p.shape), np.float32) if p.grad is None else p.grad.numpy().copy()
        for p in flat_model.parameters()
    ]
    want = [np.mean([g[i] for g in comm.allgather(mine)], axis=0) for i in range(len(mine))]
    params = list(flat_model.parameters())
    comm._allreduce_flat(params, sum(p.numel() for p in params))
    backward(bucket_model, step)
    # Every parameter used: the buckets started during the backward pass, the first one
    # at least (the last one's parameter is the input layer's, ready last). With the last
    # layer unused, its bucket (the first) waits for the finish, and so do all after it.
    if comm.rank != 0 or step % 2 == 0:
        assert buckets.started >= len(buckets.buckets) - 1, (step, buckets.started)
    else:
        assert buckets.started == 0, (step, buckets.started)
    comm.allreduce_gradients(bucket_model)
    assert buckets.started == 0
    for w, a, b in zip(want, grads(flat_model), grads(bucket_model), strict=True):
        np.testing.assert_allclose(b, w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-6)
        if comm.size == 2:
            np.testing.assert_array_equal(b, a)
comm.close_torch_distributed()
if comm.rank == 0:
    print(f"bucketed all-reduce: {comm.size} ranks agree", flush=True)
