"""The ranks of an MPI launch (``mpirun``, ``mpiexec``, ``srun``): :class:`MpiGroup`.

Everything goes over MPI (mpi4py) on numpy buffers until
:meth:`MpiGroup.use_torch_distributed` (``--comm torch``) sets up a ``torch.distributed``
group from the MPI launch (rank, size and the rendezvous address agreed over MPI); from then
on the bulk operations go through it: the gradient all-reduce, the HEC pushes, the
all-to-all-v of ``--exact-remote`` and the halo exchange of exact evaluation.

mpi4py is imported when a group is made, not with this module.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any

import numpy as np
import torch

from distmb.comm.group import TORCH_CPU_BACKEND, RankGroup, peer_offsets
from distmb.comm.mpienv import local_rank_from_env
from distmb.comm.torch import init_process_group

#: Seconds a rank waits for the others while the torch.distributed group is set up (and in
#: a collective of the group ``--comm torch`` sets up under MPI).
TORCH_RENDEZVOUS_TIMEOUT_S = 120.0
#: Address of rank 0's rendezvous store when every rank runs on the same host.
LOOPBACK = "127.0.0.1"


def _mpi():
    """The ``mpi4py.MPI`` module (imported on first use: initialises MPI)."""
    from mpi4py import MPI

    return MPI


class MpiGroup(RankGroup):
    """The ranks of ``MPI.COMM_WORLD`` (or a given communicator): everything over MPI on
    numpy buffers, the bulk operations over torch.distributed after
    :meth:`use_torch_distributed` (``--comm torch``)."""

    launcher = "mpi"

    def __init__(self, comm=None) -> None:
        MPI = _mpi()
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        super().__init__(self.comm.Get_rank(), self.comm.Get_size())

    def local_rank(self) -> int:
        """This rank's index among the ranks on its node (which GPU it takes with
        ``--device cuda``): the launcher's word (:func:`distmb.comm.mpienv.local_rank_from_env`),
        else the rank in ``MPI_Comm_split_type(COMM_TYPE_SHARED)``, a collective of every rank
        (the variables are the same launcher's on every rank, so all take the same branch).
        Computed once."""
        if self._local_rank is None:
            found = local_rank_from_env()
            if found is None:
                node = self.comm.Split_type(_mpi().COMM_TYPE_SHARED, key=self.rank)
                found = node.Get_rank()
                node.Free()
            self._local_rank = found
        return self._local_rank

    # -- torch.distributed -----------------------------------------------------------------
    def use_torch_distributed(
        self, backend: str = TORCH_CPU_BACKEND, device: torch.device | str = "cpu"
    ) -> None:
        """Set up a ``torch.distributed`` process group over these ranks (same rank numbers)
        and route the bulk operations (gradient all-reduce, HEC pushes, all-to-all-v, halo
        exchange) through it from now on.

        No launcher support is needed: rank 0 opens the group's rendezvous store on a port
        the OS picks and sends its address and port to the others over MPI (the loopback
        address when every rank runs on rank 0's host, else rank 0's host name).

        Args:
            backend: ``gloo`` (host tensors) or ``nccl`` (CUDA tensors; set the rank's GPU
                with ``torch.cuda.set_device`` first).
            device: where the tensors this group moves live (``torch_device``).

        Raises:
            RuntimeError: torch.distributed is unavailable, or a group is already set up.
        """
        import torch.distributed as dist

        if not dist.is_available():
            raise RuntimeError("--comm torch: this torch build has no torch.distributed")
        if dist.is_initialized():
            raise RuntimeError("--comm torch: a torch.distributed group is already set up")
        hosts = self.allgather(socket.gethostname())
        host = LOOPBACK if len(set(hosts)) == 1 else hosts[0]
        timeout = datetime.timedelta(seconds=TORCH_RENDEZVOUS_TIMEOUT_S)
        store = None
        port = None
        if self.rank == 0:
            store = dist.TCPStore(
                host, 0, self.size, is_master=True, timeout=timeout, wait_for_workers=False
            )
            port = store.port
        with self.watched("torch.distributed rendezvous"):
            port = self.comm.bcast(port, root=0)
            if self.rank != 0:
                store = dist.TCPStore(host, port, self.size, is_master=False, timeout=timeout)
            init_process_group(
                backend=backend, store=store, rank=self.rank, world_size=self.size, timeout=timeout
            )
        self.torch_group = dist.group.WORLD
        self.torch_device = torch.device(device)

    # -- small collectives -----------------------------------------------------------------
    def allreduce_max(self, value: float) -> float:
        with self.watched("allreduce (max)"):
            return self.comm.allreduce(value, op=_mpi().MAX)

    def allreduce_min(self, value: float) -> float:
        with self.watched("allreduce (min)"):
            return self.comm.allreduce(value, op=_mpi().MIN)

    def allreduce_sum(self, values: np.ndarray) -> np.ndarray:
        out = np.empty_like(values)
        with self.watched("allreduce (sum)"):
            self.comm.Allreduce(np.ascontiguousarray(values), out, op=_mpi().SUM)
        return out

    def allgather(self, obj: Any) -> list[Any]:
        with self.watched("allgather"):
            return self.comm.allgather(obj)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        with self.watched("bcast"):
            return self.comm.bcast(obj, root=root)

    def barrier(self) -> None:
        with self.watched("barrier"):
            self.comm.Barrier()

    def abort(self, code: int) -> None:
        """``MPI_Abort``: the launcher ends every rank."""
        self.comm.Abort(code)

    def _send_host(self, array: np.ndarray, dest: int, tag: int) -> None:
        self.comm.Send(array, dest=dest, tag=tag)

    def _recv_host(self, array: np.ndarray, source: int, tag: int) -> None:
        self.comm.Recv(array, source=source, tag=tag)

    # -- the bulk operations without a torch group -------------------------------------------
    def _sum_flat(self, flat: torch.Tensor) -> None:
        if self.torch_group is not None:
            super()._sum_flat(flat)
        else:  # a host buffer (allreduce_gradients)
            self.comm.Allreduce(_mpi().IN_PLACE, flat.numpy(), op=_mpi().SUM)

    def alltoallv(
        self,
        counts: np.ndarray,
        send: np.ndarray | torch.Tensor,
        recv_counts: np.ndarray | None = None,
    ) -> tuple[np.ndarray, Any]:
        """:meth:`RankGroup.alltoallv`; without a torch group one ``Alltoallv`` on host
        buffers (a tensor ``send`` is copied to the host; its result is a CPU tensor), the
        counts exchanged by ``Alltoall`` when not given."""
        if self.torch_group is not None:
            return super().alltoallv(counts, send, recv_counts)
        MPI = _mpi()
        as_tensor = isinstance(send, torch.Tensor)
        host = send.detach().cpu().numpy() if as_tensor else send
        counts = np.ascontiguousarray(counts, dtype=np.int64)
        host = np.ascontiguousarray(host)
        width = int(np.prod(host.shape[1:], dtype=np.int64))
        with self.watched("all-to-all"):
            if recv_counts is None:
                recv_counts = np.empty_like(counts)
                self.comm.Alltoall(counts, recv_counts)
            else:
                recv_counts = np.ascontiguousarray(recv_counts, dtype=np.int64)
            received = np.empty((int(recv_counts.sum()), *host.shape[1:]), dtype=host.dtype)
            mpi_type = {np.dtype(np.int64): MPI.INT64_T, np.dtype(np.float32): MPI.FLOAT}[
                host.dtype
            ]
            self.comm.Alltoallv(
                [host, (counts * width, peer_offsets(counts) * width), mpi_type],
                [received, (recv_counts * width, peer_offsets(recv_counts) * width), mpi_type],
            )
        return recv_counts, torch.from_numpy(received) if as_tensor else received
