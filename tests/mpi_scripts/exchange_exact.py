"""Run under mpiexec or torchrun: ``alltoallv`` and ``halo_exchange`` deliver exactly the rows
every peer sent, checked against what each rank can compute on its own (the messages are a
function of (source, destination, index)). With MODE ``torch`` the exchanges must go over
torch.distributed: under mpiexec the MPI communicator's all-to-all calls are made to fail.

argv: MODE (mpi | torch)
"""

from __future__ import annotations

import sys
import traceback

import numpy as np
import torch

from distmb.comm.mpi import Communicator, launch_communicator

WIDTH = 3


class NoAlltoall:
    """The MPI communicator with its all-to-all calls refused (everything else forwarded)."""

    def __init__(self, comm) -> None:
        self._comm = comm

    def __getattr__(self, name: str):
        if "lltoall" in name:
            raise AssertionError(f"MPI {name} called although --comm torch is in use")
        return getattr(self._comm, name)


def count(src: int, dst: int, size: int) -> int:
    """Rows ``src`` sends to ``dst``: uneven, zero for some pairs (and for all with size 1)."""
    return (2 * src + 3 * dst + size) % 4


def ids_from(src: int, dst: int, size: int) -> np.ndarray:
    return src * 10_000 + dst * 100 + np.arange(count(src, dst, size), dtype=np.int64)


def rows_of(ids: np.ndarray) -> np.ndarray:
    return (ids[:, None] + np.arange(WIDTH) / 8).astype(np.float32)


mode = sys.argv[1]
comm = launch_communicator()
if mode == "torch":
    comm.use_torch_distributed("gloo", "cpu")
    if isinstance(comm, Communicator):
        comm.comm = NoAlltoall(comm.comm)
else:
    assert isinstance(comm, Communicator), "MODE mpi needs an MPI launch"


def check() -> None:
    rank, size = comm.rank, comm.size
    counts = np.array([count(rank, d, size) for d in range(size)], dtype=np.int64)
    send_ids = np.concatenate([ids_from(rank, d, size) for d in range(size)])
    want_counts = np.array([count(s, rank, size) for s in range(size)], dtype=np.int64)
    want_ids = np.concatenate([ids_from(s, rank, size) for s in range(size)])

    # ids with the counts exchanged, rows with them given; numpy in, numpy out.
    got_counts, got_ids = comm.alltoallv(counts, send_ids)
    assert isinstance(got_ids, np.ndarray) and got_ids.dtype == np.int64
    np.testing.assert_array_equal(got_counts, want_counts)
    np.testing.assert_array_equal(got_ids, want_ids)
    _, got_rows = comm.alltoallv(counts, rows_of(send_ids), recv_counts=want_counts)
    np.testing.assert_array_equal(got_rows, rows_of(want_ids))
    # A tensor in, a tensor out (on the group's device with torch, on the CPU with MPI).
    _, got_tensor = comm.alltoallv(counts, torch.from_numpy(rows_of(send_ids)))
    assert isinstance(got_tensor, torch.Tensor) and got_tensor.device == comm.torch_device
    np.testing.assert_array_equal(got_tensor.cpu().numpy(), rows_of(want_ids))
    # Nothing to send anywhere.
    zero = np.zeros(size, dtype=np.int64)
    got_counts, got_empty = comm.alltoallv(zero, np.empty((0, WIDTH), dtype=np.float32))
    assert got_empty.shape == (0, WIDTH) and not got_counts.any()

    # halo_exchange: this rank's halo is every peer's rows towards it, at shuffled positions;
    # halo_owner says whose each position is, and each owner's rows fill its positions in order.
    owner = np.repeat(np.arange(size), want_counts)
    halo_owner = owner[np.random.default_rng(rank).permutation(owner.size)].astype(np.int32)
    send_ptr = np.concatenate([[0], np.cumsum(counts)])
    halo = comm.halo_exchange(rows_of(send_ids), send_ptr, halo_owner)
    expected = np.empty((owner.size, WIDTH), dtype=np.float32)
    for src in range(size):
        expected[np.flatnonzero(halo_owner == src)] = rows_of(ids_from(src, rank, size))
    np.testing.assert_array_equal(halo, expected)


try:
    check()
except BaseException:  # a failed check must end the job, not leave the peers waiting
    traceback.print_exc()
    comm.abort(1)
comm.barrier()
comm.close_torch_distributed()
if comm.rank == 0:
    print(f"{comm.size} ranks exchanged exactly over {mode}", flush=True)
