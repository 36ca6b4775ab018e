"""The :class:`~distmb.comm.RankGroup` contract: one set of checks run against every
implementation, each result compared with a numpy reference that every rank computes on its
own from the ranks' known inputs (every input is a function of the rank that holds it).

Under mpiexec, ``argv`` names the implementations to check, one after the other in the same
job (``mpi``: :class:`~distmb.comm.MpiGroup`; ``mpi-torch``: the same after
``use_torch_distributed``, with MPI's all-to-all calls made to fail so that the bulk
operations must go over torch.distributed; ``torch``: :class:`~distmb.comm.TorchGroup`, its
``env://`` rendezvous set up from the MPI launch); rank 0 prints ``contract holds: IMPL on P
ranks`` after each. ``tests/test_comm_contract.py`` imports :func:`check_contract` and runs
it on :class:`~distmb.comm.SingleProcess` in its own process.

Under torchrun (no MPI) ``argv`` names one implementation: ``torch`` (a
:class:`~distmb.comm.TorchGroup` on gloo) or ``torch-nccl`` (the same with its bulk operations
over NCCL on GPU ``LOCAL_RANK``; ``tests/test_nccl.py`` runs it at world size 1).

argv: IMPL [IMPL ...]
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback

import numpy as np
import torch

from distmb.comm import (
    TORCH_CUDA_BACKEND,
    MpiGroup,
    RankGroup,
    SingleProcess,
    TorchGroup,
    exchange_counts,
)
from distmb.comm.mpienv import is_torchrun_launch

#: Row width of the exchanged float32 rows.
WIDTH = 3
#: Rows of the gathered table, and bytes per chunk of gather_rows (8 rows of 3 float32).
GATHER_ROWS, GATHER_CHUNK_BYTES = 1000, 100
#: Bytes per gradient bucket: the six parameter tensors of the bucket model make several.
BUCKET_BYTES = 64 * 4
#: Seconds rank r sleeps before the barrier, times r.
BARRIER_STAGGER_S = 0.05


# ---- the ranks' inputs ---------------------------------------------------------------------


def count(src: int, dst: int, size: int) -> int:
    """Rows ``src`` sends to ``dst``: uneven, zero for some pairs."""
    return (2 * src + 3 * dst + size) % 4


def ids_from(src: int, dst: int, size: int) -> np.ndarray:
    """int64 ids of the rows ``src`` sends to ``dst`` (unique per pair)."""
    return src * 10_000 + dst * 100 + np.arange(count(src, dst, size), dtype=np.int64)


def rows_of(ids: np.ndarray) -> np.ndarray:
    """float32[n, WIDTH] rows, a function of the ids."""
    return (ids[:, None] + np.arange(WIDTH) / 8).astype(np.float32)


def scalar_of(rank: int) -> float:
    return (rank * 7) % 5 + 0.25


def sum_inputs(rank: int) -> tuple[np.ndarray, np.ndarray]:
    """float64[6] and int64[2, 3] summed over ranks."""
    rng = np.random.default_rng(50 + rank)
    return rng.standard_normal(6), rng.integers(-1000, 1000, (2, 3)).astype(np.int64)


def flat_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Linear(5, 3), torch.nn.Linear(3, 2))


def set_flat_grads(model: torch.nn.Module, rank: int) -> None:
    """Random gradients of ``rank`` (drawn on the CPU, on the model's device); the last bias
    has none on rank 0."""
    gen = torch.Generator().manual_seed(100 + rank)
    for i, p in enumerate(model.parameters()):
        grad = torch.randn(p.shape, generator=gen).to(p.device)
        p.grad = None if (i == 5 and rank == 0) else grad


def bucket_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(9, 40), torch.nn.ReLU(), torch.nn.Linear(40, 30), torch.nn.ReLU(),
        torch.nn.Linear(30, 6), torch.nn.Linear(6, 6),
    )  # fmt: skip


def last_layer_unused(rank: int, step: int) -> bool:
    """Rank 0 leaves the last layer out of every other step's loss (no gradient there)."""
    return rank == 0 and step % 2 == 1


def bucket_backward(model: torch.nn.Module, rank: int, step: int) -> None:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(17, 9, generator=gen).to(next(model.parameters()).device)
    model.zero_grad(set_to_none=True)
    h = model[4](model[3](model[2](model[1](model[0](x)))))
    out = h if last_layer_unused(rank, step) else model[5](h)
    (out.square().sum() * (1 + rank)).backward()


def grads_or_zeros(model: torch.nn.Module) -> list[np.ndarray]:
    return [
        np.zeros(tuple(p.shape), np.float32) if p.grad is None else p.grad.cpu().numpy().copy()
        for p in model.parameters()
    ]


# ---- the reference -------------------------------------------------------------------------


def mean_of(per_rank: list[list[np.ndarray]]) -> list[np.ndarray]:
    """The float32 average of every rank's gradients: the sum in rank order, then / P (what a
    sum of two ranks gives bit for bit whatever the order)."""
    out = []
    for i in range(len(per_rank[0])):
        total = per_rank[0][i].copy()
        for grads in per_rank[1:]:
            total = total + grads[i]
        out.append(total / np.float32(len(per_rank)))
    return out


def assert_mean(got: list[np.ndarray], want: list[np.ndarray], size: int) -> None:
    for g, w in zip(got, want, strict=True):
        if size <= 2:  # a + b in either order: no rounding difference
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


# ---- the contract --------------------------------------------------------------------------


def check_small_collectives(group: RankGroup) -> None:
    rank, size = group.rank, group.size
    assert 0 <= rank < size
    assert group.allgather(rank) == list(range(size))
    assert group.allgather({"rank": rank, "name": f"r{rank}"}) == [
        {"rank": r, "name": f"r{r}"} for r in range(size)
    ]
    assert sorted(group.allgather(group.local_rank())) == list(range(size))  # one host
    for root in range(size):
        payload = {"root": root, "ids": list(range(root + 2))}
        assert group.bcast(payload if rank == root else None, root=root) == payload

    values = [scalar_of(r) for r in range(size)]
    assert group.allreduce_max(scalar_of(rank)) == max(values)
    assert group.allreduce_min(scalar_of(rank)) == min(values)
    got_int = group.allreduce_max(3 * rank + 1)
    assert got_int == 3 * (size - 1) + 1 and isinstance(got_int, int), got_int
    got_int = group.allreduce_min(3 * rank + 1)
    assert got_int == 1 and isinstance(got_int, int), got_int

    floats, ints = sum_inputs(rank)
    before = floats.copy()
    total_f = group.allreduce_sum(floats)
    total_i = group.allreduce_sum(ints)
    want_f = np.sum([sum_inputs(r)[0] for r in range(size)], axis=0)
    want_i = np.sum([sum_inputs(r)[1] for r in range(size)], axis=0)
    assert total_f.dtype == np.float64 and total_i.dtype == np.int64
    np.testing.assert_allclose(total_f, want_f, rtol=1e-12)
    np.testing.assert_array_equal(total_i, want_i)
    np.testing.assert_array_equal(floats, before)  # the input is left as it was
    assert total_f is not floats

    # Nobody leaves the barrier before the last rank (rank P - 1, the latest) reached it.
    time.sleep(BARRIER_STAGGER_S * rank)
    reached = time.time()
    group.barrier()
    left = time.time()
    stamps = group.allgather((reached, left))
    assert min(s[1] for s in stamps) >= max(s[0] for s in stamps), stamps


def check_exchanges(group: RankGroup) -> None:
    rank, size = group.rank, group.size
    counts = np.array([count(rank, d, size) for d in range(size)], dtype=np.int64)
    send_ids = np.concatenate([ids_from(rank, d, size) for d in range(size)])
    want_counts = np.array([count(s, rank, size) for s in range(size)], dtype=np.int64)
    want_ids = np.concatenate([ids_from(s, rank, size) for s in range(size)])

    if group.torch_group is not None:
        got = exchange_counts(group.torch_group, group.torch_device, counts)
        np.testing.assert_array_equal(got, want_counts)

    # ids with the counts exchanged, rows with them given; numpy in, numpy out.
    got_counts, got_ids = group.alltoallv(counts, send_ids)
    assert isinstance(got_ids, np.ndarray) and got_ids.dtype == np.int64
    np.testing.assert_array_equal(got_counts, want_counts)
    np.testing.assert_array_equal(got_ids, want_ids)
    _, got_rows = group.alltoallv(counts, rows_of(send_ids), recv_counts=want_counts)
    assert got_rows.dtype == np.float32
    np.testing.assert_array_equal(got_rows, rows_of(want_ids))
    # A tensor in, a tensor out (on the group's device; on the CPU here).
    _, got_tensor = group.alltoallv(counts, torch.from_numpy(rows_of(send_ids)))
    assert isinstance(got_tensor, torch.Tensor) and got_tensor.device == group.torch_device
    np.testing.assert_array_equal(got_tensor.cpu().numpy(), rows_of(want_ids))
    # Nothing to send anywhere.
    zero = np.zeros(size, dtype=np.int64)
    got_counts, got_empty = group.alltoallv(zero, np.empty((0, WIDTH), dtype=np.float32))
    assert got_empty.shape == (0, WIDTH) and not got_counts.any()

    # halo_exchange: this rank's halo is every peer's rows towards it, at shuffled positions;
    # halo_owner says whose each position is, and each owner's rows fill its positions in order.
    owner = np.repeat(np.arange(size), want_counts)
    halo_owner = owner[np.random.default_rng(rank).permutation(owner.size)].astype(np.int32)
    send_ptr = np.concatenate([[0], np.cumsum(counts)])
    halo = group.halo_exchange(rows_of(send_ids), send_ptr, halo_owner)
    expected = np.empty((owner.size, WIDTH), dtype=np.float32)
    for src in range(size):
        expected[np.flatnonzero(halo_owner == src)] = rows_of(ids_from(src, rank, size))
    np.testing.assert_array_equal(halo, expected)


def check_gather_rows(group: RankGroup) -> None:
    """Every rank's rows reach rank 0, each once, in bounded chunks, rank by rank."""
    table = np.random.default_rng(0).standard_normal((GATHER_ROWS, WIDTH)).astype(np.float32)
    owner = np.random.default_rng(1).integers(0, group.size, GATHER_ROWS)  # uneven shares
    ids = np.flatnonzero(owner == group.rank)[::-1].copy()  # any order
    chunks: list[tuple[np.ndarray, np.ndarray]] = []

    def sink(chunk_ids: np.ndarray, rows: np.ndarray) -> None:
        chunks.append((chunk_ids.copy(), rows.copy()))

    group.gather_rows(ids, table[ids], sink if group.rank == 0 else None, GATHER_CHUNK_BYTES)
    if group.rank != 0:
        assert not chunks
        return
    rows_per_chunk = GATHER_CHUNK_BYTES // (WIDTH * 4)
    assert all(0 < len(i) == len(r) <= rows_per_chunk for i, r in chunks)
    sources = [np.unique(owner[i]) for i, _ in chunks]
    assert all(len(s) == 1 for s in sources), "a chunk mixes ranks"
    assert [int(s[0]) for s in sources] == sorted(int(s[0]) for s in sources)  # rank by rank
    got = np.full((GATHER_ROWS, WIDTH), np.nan, dtype=np.float32)
    seen = np.zeros(GATHER_ROWS, dtype=int)
    for chunk_ids, rows in chunks:
        got[chunk_ids] = rows
        np.add.at(seen, chunk_ids, 1)
    assert (seen == 1).all()
    np.testing.assert_array_equal(got, table)


def check_gradients(group: RankGroup) -> None:
    """The flat all-reduce, then the bucketed one (buckets with a torch group only): the
    average of every rank's gradients, a missing gradient counting as zeros. The models live
    on the group's device (NCCL reduces device tensors); the reference is computed there too,
    so the float32 arithmetic is the same."""
    rank, size, device = group.rank, group.size, group.torch_device
    model, reference = flat_model().to(device), flat_model().to(device)
    per_rank = []
    for r in range(size):
        set_flat_grads(reference, r)
        per_rank.append(grads_or_zeros(reference))
    calls, payload = group.allreduce_stats.calls, group.allreduce_stats.payload_bytes
    set_flat_grads(model, rank)
    group.allreduce_gradients(model)
    # One rank has nothing to average: a missing gradient stays missing there.
    assert all(p.grad is not None for p in model.parameters()) or size == 1
    assert_mean(grads_or_zeros(model), mean_of(per_rank), size)
    n_params = sum(p.numel() for p in model.parameters())
    # Without a launcher there is nothing to reduce; a launched group runs its library's
    # all-reduce even alone (world size 1).
    reduced = not isinstance(group, SingleProcess)
    assert group.allreduce_stats.calls == calls + reduced
    assert group.allreduce_stats.payload_bytes == payload + reduced * 4 * n_params

    model, reference = bucket_model().to(device), bucket_model().to(device)
    group.prepare_gradients(model, BUCKET_BYTES)
    buckets = group._buckets
    assert (buckets is not None) == (group.torch_group is not None)
    if buckets is not None:
        assert len(buckets.buckets) >= 4, buckets.buckets
    for step in range(4):
        per_rank = []
        for r in range(size):
            bucket_backward(reference, r, step)
            per_rank.append(grads_or_zeros(reference))
        bucket_backward(model, rank, step)
        if buckets is not None:
            # The buckets started during the backward pass (all but the input layer's,
            # ready last); with the last layer unused, its bucket (the first) waits for
            # the finish, and so does every bucket after it.
            if last_layer_unused(rank, step):
                assert buckets.started == 0, (step, buckets.started)
            else:
                assert buckets.started >= len(buckets.buckets) - 1, (step, buckets.started)
        group.allreduce_gradients(model)
        if buckets is not None:
            assert buckets.started == 0
        assert_mean(grads_or_zeros(model), mean_of(per_rank), size)


def check_contract(group: RankGroup) -> None:
    """Every check of the contract on ``group`` (every rank calls it, together)."""
    check_small_collectives(group)
    check_exchanges(group)
    check_gather_rows(group)
    check_gradients(group)


# ---- the implementations under mpiexec -----------------------------------------------------


class NoAlltoall:
    """An mpi4py communicator with its all-to-all calls refused (everything else forwarded)."""

    def __init__(self, comm) -> None:
        self._comm = comm

    def __getattr__(self, name: str):
        if "lltoall" in name:
            raise AssertionError(f"MPI {name} called although a torch group is in use")
        return getattr(self._comm, name)


def torch_group_from_mpi_launch(world) -> TorchGroup:
    """A :class:`TorchGroup` in an MPI job: torchrun's variables set from MPI's rank and size
    and a port rank 0 found free."""
    port = None
    if world.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    os.environ.update(
        RANK=str(world.rank),
        WORLD_SIZE=str(world.size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(world.bcast(port, root=0)),
    )
    return TorchGroup()


def make_group(impl: str, world) -> RankGroup:
    if impl == "mpi":
        return MpiGroup()
    if impl == "mpi-torch":
        group = MpiGroup()
        group.use_torch_distributed("gloo", "cpu")
        group.comm = NoAlltoall(group.comm)
        return group
    if impl == "torch":
        return torch_group_from_mpi_launch(world)
    raise ValueError(f"unknown implementation {impl!r}")


#: The implementations a torchrun job checks, one per job.
TORCHRUN_IMPLEMENTATIONS = ("torch", "torch-nccl")


def main_torchrun(impls: list[str]) -> None:
    """Under torchrun: :class:`TorchGroup` from torchrun's ``env://``, its bulk operations
    over NCCL on GPU ``LOCAL_RANK`` for ``torch-nccl``. One implementation per job: the
    group's teardown ends torch.distributed in the process."""
    if len(impls) != 1 or impls[0] not in TORCHRUN_IMPLEMENTATIONS:
        raise SystemExit(f"under torchrun: one of {', '.join(TORCHRUN_IMPLEMENTATIONS)}")
    (impl,) = impls
    group = TorchGroup()
    try:
        if impl == "torch-nccl":
            device = torch.device("cuda", group.local_rank())
            torch.cuda.set_device(device)
            group.use_torch_distributed(TORCH_CUDA_BACKEND, device)
            assert group.torch_group is not group.host_group and group.torch_device == device
        check_contract(group)
        group.close_torch_distributed()
    except BaseException:  # a failed check must end the job, not leave the peers waiting
        print(f"rank {group.rank}: {impl} failed", file=sys.stderr, flush=True)
        traceback.print_exc()
        group.abort(1)
    if group.rank == 0:
        print(f"contract holds: {impl} on {group.size} ranks", flush=True)


def main(impls: list[str]) -> None:
    if is_torchrun_launch():
        main_torchrun(impls)
        return
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    for impl in impls:
        try:
            group = make_group(impl, world)
            check_contract(group)
            group.close_torch_distributed()
        except BaseException:  # a failed check must end the job, not leave the peers waiting
            print(f"rank {world.rank}: {impl} failed", file=sys.stderr, flush=True)
            traceback.print_exc()
            world.Abort(1)
        world.Barrier()
        if world.rank == 0:
            print(f"contract holds: {impl} on {world.size} ranks", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
