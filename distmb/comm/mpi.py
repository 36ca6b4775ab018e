"""Communication between ranks: mpi4py on numpy buffers, torch.distributed on tensors.

Every collective is a method call visible at its call site, and every rank calls the same
collectives in the same order (the trainer guarantees equal iteration counts).

Two communicators share one interface (:class:`RankGroup`, which holds the operations
both run over ``torch.distributed``), and differ in how the ranks find each other and in the
small collectives:

- :class:`Communicator`: the ranks of an MPI launch (``mpirun``, ``mpiexec``, ``srun``).
  Everything goes over MPI on numpy buffers until :meth:`Communicator.use_torch_distributed`
  (``--comm torch``) sets up a ``torch.distributed`` group from the MPI launch (rank, size
  and the rendezvous address agreed over MPI); from then on the bulk operations go through
  it: the gradient all-reduce, the HEC pushes (:func:`make_push`), the all-to-all-v of
  ``--exact-remote`` and the halo exchange of exact evaluation.
- :class:`TorchCommunicator`: the workers of ``torchrun`` (no MPI at all): a gloo group
  from ``env://`` carries the small collectives, the outputs' gathering and, on the CPU, the
  bulk operations; on a GPU the bulk operations go over an NCCL group on device tensors.

The operations:

- :meth:`RankGroup.allreduce_gradients`: one all-reduce over a flat buffer of all
  gradients, then averaged, or buckets that start during the backward pass
  (:class:`BucketedAllreduce`, torch.distributed only).
- :class:`EmbeddingPush` / :class:`TorchEmbeddingPush`: the non-blocking all-to-all-v of
  (``VID_o``, embedding rows) of the Asynchronous Embedding Push, with a queue of depth
  ``d``.
- :meth:`RankGroup.alltoallv`: the synchronous all-to-all-v of ``--exact-remote``;
  :meth:`RankGroup.halo_exchange`: the exchange of exact evaluation.
- :meth:`RankGroup.gather_rows`: every rank's rows to rank 0, chunk by chunk (the
  gathered outputs of ``distmb.cli.predict``).
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from distmb.comm.watchdog import TORCHRUN_TIMEOUT_S
from distmb.core.units import FLOAT32_BYTES, row_message_bytes

if TYPE_CHECKING:
    from distmb.comm.watchdog import CollectiveWatchdog

#: Growth factor of reusable communication buffers when a message does not fit.
BUFFER_GROWTH = 1.5
#: Bytes of rows per message of :meth:`RankGroup.gather_rows` (rank 0 holds one at a time).
GATHER_CHUNK_BYTES = 64 << 20

#: torch.distributed backend of ``--comm torch`` for host tensors.
TORCH_CPU_BACKEND = "gloo"
#: torch.distributed backend of ``--comm torch`` for CUDA tensors.
TORCH_CUDA_BACKEND = "nccl"
#: Seconds a rank waits for the others while the torch.distributed group is set up (and in
#: a collective of the group ``--comm torch`` sets up under MPI).
TORCH_RENDEZVOUS_TIMEOUT_S = 120.0
#: Address of rank 0's rendezvous store when every rank runs on the same host.
LOOPBACK = "127.0.0.1"

#: ``sink(ids, rows)``: takes one chunk of gathered rows: int64[k] ids and their rows.
RowSink = Callable[[np.ndarray, np.ndarray], None]


def _chunks(num_rows: int, row_bytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive chunks of ``num_rows`` rows of ``row_bytes`` bytes,
    each at most ``chunk_bytes`` (one row at least)."""
    step = max(1, chunk_bytes // max(row_bytes, 1))
    return [(start, min(start + step, num_rows)) for start in range(0, num_rows, step)]


def _sink_in_chunks(ids: np.ndarray, rows: np.ndarray, sink: RowSink, chunk_bytes: int) -> None:
    """Hand this rank's own ``ids`` (int64[n]) and ``rows`` ([n, ...]) to ``sink`` in chunks
    of at most ``chunk_bytes`` bytes of rows."""
    row_bytes = int(rows.itemsize * np.prod(rows.shape[1:], dtype=np.int64))
    for start, stop in _chunks(len(ids), row_bytes, chunk_bytes):
        sink(ids[start:stop], rows[start:stop])


def _mpi():
    from mpi4py import MPI

    return MPI


def _host_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing ``array``'s memory (C-contiguous; a read-only array, e.g. a
    memory map, is copied first: torch warns about, and must never write, read-only
    memory)."""
    array = np.ascontiguousarray(array)
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


def exchange_counts(group, device: torch.device, counts: np.ndarray) -> np.ndarray:
    """One ``all_to_all_single`` of per-peer counts over ``group``: ``counts[j]`` (int64[P])
    goes to rank ``j``; returns what every rank sent here (int64[P], on the host: the
    counts size the receive buffers). On ``device`` (the group's: NCCL moves device
    tensors only)."""
    import torch.distributed as dist

    send = torch.from_numpy(np.ascontiguousarray(counts, dtype=np.int64)).to(device)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.cpu().numpy()


def _init_process_group(**kwargs: Any) -> None:
    """``torch.distributed.init_process_group(**kwargs)``, after importing the torch module
    whose functions take the default group as a default argument
    (``torch.distributed.nn.functional``: ``group=group.WORLD``, read when it is imported).

    Imported after the group exists (torch's optimizers import it through ``torch._dynamo``),
    those defaults keep the group alive past ``destroy_process_group``: its gloo worker
    threads then outlive the interpreter, and one that frees a finished collective holding
    Python tensors during finalization aborts the process at exit ("terminate called
    without an active exception"). Imported first, the defaults hold no group.
    """
    import torch.distributed as dist
    import torch.distributed.nn.functional  # noqa: F401 (imported for its defaults)

    dist.init_process_group(**kwargs)


class RankGroup(ABC):
    """The ranks of a multi-rank run: what the trainer, the halo schemes and
    ``distmb.cli.predict`` call, and the operations that run over ``torch.distributed`` once
    :attr:`torch_group` is set (the gradient all-reduce, the all-to-all-v and halo exchange,
    the teardown). The subclasses say how the ranks were started and run the small
    collectives: :class:`Communicator` (MPI), :class:`TorchCommunicator` (torchrun).

    Args:
        rank, size: this rank and the number of ranks.
    """

    #: The launcher that started the ranks (messages; ``--comm`` mpi needs ``"mpi"``).
    launcher: str = ""

    def __init__(self, rank: int, size: int) -> None:
        self.rank = rank
        self.size = size
        self._grad_buffer: torch.Tensor | None = None
        #: Gradient all-reduces since the last reset (the trainer resets it every epoch).
        self.allreduce_stats = AllreduceStats()
        #: Marks each collective below while set (:mod:`distmb.comm.watchdog`; the trainer sets it
        #: for ``--collective-timeout`` under MPI).
        self.watchdog: CollectiveWatchdog | None = None
        #: The torch.distributed group of the bulk operations (the gradient all-reduce, the
        #: HEC pushes, the all-to-all-v and halo exchange), or None: they go over MPI.
        self.torch_group = None
        #: Where the tensors of :attr:`torch_group` live (``cpu`` for gloo, the rank's GPU
        #: for NCCL).
        self.torch_device = torch.device("cpu")
        #: The bucketed all-reduce of :meth:`prepare_gradients`, while there is one.
        self._buckets: BucketedAllreduce | None = None
        self._local_rank: int | None = None

    # -- what the launch decides ---------------------------------------------------------
    @abstractmethod
    def local_rank(self) -> int:
        """This rank's index among the ranks on its node (which GPU it takes with
        ``--device cuda``); may be a collective of every rank. Computed once."""

    @abstractmethod
    def use_torch_distributed(
        self, backend: str = TORCH_CPU_BACKEND, device: torch.device | str = "cpu"
    ) -> None:
        """Route the bulk operations through a ``torch.distributed`` group of ``backend``
        on tensors on ``device`` from now on (every rank, together)."""

    @abstractmethod
    def abort(self, code: int) -> None:
        """End every rank of the job with exit code ``code`` (a failing rank calls it)."""

    # -- small collectives ---------------------------------------------------------------
    @abstractmethod
    def allreduce_max(self, value: float) -> float:
        """The largest ``value`` of all ranks."""

    @abstractmethod
    def allreduce_min(self, value: float) -> float:
        """The smallest ``value`` of all ranks."""

    @abstractmethod
    def allreduce_sum(self, values: np.ndarray) -> np.ndarray:
        """Element-wise sum over ranks of a float64 or int64 array."""

    @abstractmethod
    def allgather(self, obj: Any) -> list[Any]:
        """Python objects from every rank, in rank order (small metadata only)."""

    @abstractmethod
    def bcast(self, obj: Any, root: int = 0) -> Any:
        """Rank ``root``'s Python object on every rank (small metadata only)."""

    @abstractmethod
    def barrier(self) -> None:
        """Wait until every rank is here."""

    @abstractmethod
    def _send_host(self, array: np.ndarray, dest: int, tag: int) -> None:
        """Point-to-point send of a C-contiguous host array to rank ``dest``."""

    @abstractmethod
    def _recv_host(self, array: np.ndarray, source: int, tag: int) -> None:
        """Receive into ``array`` (C-contiguous, the sent size) from rank ``source``."""

    def watched(self, collective: str) -> AbstractContextManager[None]:
        """The watchdog's mark of a wait in ``collective`` (nothing without a watchdog)."""
        if self.watchdog is None:
            return nullcontext()
        return self.watchdog.watch(collective)

    def close_torch_distributed(self) -> None:
        """Tear the ``torch.distributed`` group down (nothing when there is none), on every
        rank together: a barrier of the group first, so that no rank destroys its end while
        a peer's last collective still moves data through it (gloo aborts then)."""
        if self.torch_group is not None:
            import torch.distributed as dist

            if self._buckets is not None:  # its hooks would start into a group that is gone
                self._buckets.remove()
                self._buckets = None
            with self.watched("torch.distributed teardown"):
                dist.barrier(group=self.torch_group)
            dist.destroy_process_group()
            self.torch_group = None

    # -- gradients -------------------------------------------------------------------------
    def prepare_gradients(self, model: torch.nn.Module, bucket_bytes: int) -> None:
        """With a torch group and ``bucket_bytes > 0``: all-reduce ``model``'s gradients in
        buckets of about ``bucket_bytes`` that start during the backward pass, as soon as
        each is complete (:class:`BucketedAllreduce`); :meth:`allreduce_gradients` then
        only finishes them. Otherwise (MPI, or ``bucket_bytes == 0``) nothing changes: one
        flat all-reduce after the backward pass. Call once, on every rank, before training."""
        if self.torch_group is None or bucket_bytes <= 0:
            self._buckets = None
            return
        self._buckets = BucketedAllreduce(
            model, bucket_bytes, self.size, self.torch_group, self.watched
        )

    def allreduce_gradients(self, model: torch.nn.Module) -> None:
        """Average the gradients of ``model`` over ranks in place.

        Parameters without a gradient contribute zeros, so every rank sends the same layout.
        Through MPI: one flat ``Allreduce`` of a host buffer (CUDA gradients are staged
        through host memory); through torch.distributed: one flat ``all_reduce`` on the
        gradients' device, or, after :meth:`prepare_gradients`, the buckets the backward
        pass started, finished here.
        """
        params = list(model.parameters())
        total = sum(p.numel() for p in params)
        if self._buckets is not None and self._buckets.model is model:
            self._buckets.finish()
        else:
            self._allreduce_flat(params, total)
        self.allreduce_stats.calls += 1
        self.allreduce_stats.payload_bytes += total * FLOAT32_BYTES

    def _allreduce_flat(self, params: list[torch.nn.Parameter], total: int) -> None:
        """One all-reduce of every gradient packed into one flat float32 buffer of ``total``
        elements, then averaged and unpacked."""
        # torch.distributed reduces where the gradients are; MPI reads host memory.
        device = self.torch_device if self.torch_group is not None else torch.device("cpu")
        if (
            self._grad_buffer is None
            or self._grad_buffer.numel() != total
            or self._grad_buffer.device != device
        ):
            self._grad_buffer = torch.empty(total, dtype=torch.float32, device=device)
        flat = self._grad_buffer
        _pack_gradients(params, flat)
        with self.watched("gradient allreduce"):
            self._sum_flat(flat)
        flat.div_(self.size)
        _unpack_gradients(params, flat)

    def _sum_flat(self, flat: torch.Tensor) -> None:
        """Sum ``flat`` (float32[total], on :attr:`torch_device`) over ranks in place."""
        import torch.distributed as dist

        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.torch_group)

    # -- exchanges ---------------------------------------------------------------------------
    def alltoallv(
        self,
        counts: np.ndarray,
        send: np.ndarray | torch.Tensor,
        recv_counts: np.ndarray | None = None,
    ) -> tuple[np.ndarray, Any]:
        """Synchronous all-to-all-v of rows grouped by peer: ``counts[j]`` rows of ``send``
        (int64 or float32, any row shape) go to rank ``j``.

        Over :attr:`torch_group`: ``all_to_all_single`` with splits on tensors on
        :attr:`torch_device` (a tensor ``send`` on that device is sent from where it is;
        numpy is copied there and the result back). The bytes are the same as over MPI.

        Args:
            counts: int64[size], rows to each rank.
            send: the rows, grouped by destination rank (numpy, or a tensor on any device).
            recv_counts: int64[size], rows each rank sends here, when the caller knows them;
                otherwise the counts are exchanged first.

        Returns:
            ``(recv_counts, received)``: int64[size] rows from each rank, and the rows grouped
            by source rank, with ``send``'s dtype and row shape: numpy for numpy ``send``,
            else a tensor (on :attr:`torch_device` with a torch group, else on the CPU).
        """
        import torch.distributed as dist

        counts = np.ascontiguousarray(counts, dtype=np.int64)
        device = self.torch_device
        tensor = send if isinstance(send, torch.Tensor) else _host_tensor(send)
        tensor = tensor.to(device).contiguous()
        with self.watched("all-to-all"):
            if recv_counts is None:
                recv_counts = exchange_counts(self.torch_group, device, counts)
            else:
                recv_counts = np.ascontiguousarray(recv_counts, dtype=np.int64)
            received = torch.empty(
                (int(recv_counts.sum()), *tensor.shape[1:]), dtype=tensor.dtype, device=device
            )
            dist.all_to_all_single(
                received, tensor, recv_counts.tolist(), counts.tolist(), group=self.torch_group
            )
        if isinstance(send, torch.Tensor):
            return recv_counts, received
        return recv_counts, received.cpu().numpy()

    def halo_exchange(
        self,
        send_rows: np.ndarray,
        send_ptr: np.ndarray,
        halo_owner: np.ndarray,
    ) -> np.ndarray:
        """Synchronous exchange: every rank sends its rows of ``send_list(j)`` to each peer
        ``j`` and receives the rows of its own halo vertices (:meth:`alltoallv`).

        Args:
            send_rows: float32[n_send, D], this rank's rows of ``send_ids`` (its send lists
                concatenated, peer by peer).
            send_ptr: int64[size + 1], this part's send-list offsets (``PartitionStore``).
            halo_owner: int32[n_halo], owner of each halo vertex.

        Returns:
            float32[n_halo, D] in halo order. Part ``i``'s send list towards ``j`` equals
            ``j``'s halo vertices owned by ``i`` in ``VID_o`` order, so the rows from ``i``
            fill the positions ``halo_owner == i`` in order (no count exchange needed).
        """
        _, recv = self.alltoallv(
            np.diff(send_ptr),
            np.asarray(send_rows, dtype=np.float32),
            recv_counts=np.bincount(halo_owner, minlength=self.size),
        )
        out = np.empty_like(recv)
        out[np.argsort(halo_owner, kind="stable")] = recv
        return out

    # -- gathering outputs ------------------------------------------------------------------
    def gather_rows(
        self,
        ids: np.ndarray,
        rows: np.ndarray,
        sink: RowSink | None,
        chunk_bytes: int = GATHER_CHUNK_BYTES,
    ) -> None:
        """Hand every rank's rows to ``sink`` on rank 0, in chunks: rank 0's own first, then
        rank 1's, and so on; the other ranks send theirs (point-to-point, in order). Rank 0
        holds one received chunk at a time, so the gathered table never has to fit in its
        memory (``sink`` writes each chunk where it belongs, e.g. into a memory map).

        Args:
            ids: int64[n], this rank's ids of its rows (e.g. their ``VID_o``).
            rows: [n, D] of one dtype and width on every rank, C-contiguous.
            sink: ``sink(ids, rows)`` per chunk, on rank 0 (ignored elsewhere).
            chunk_bytes: bytes of rows per message at most.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        rows = np.ascontiguousarray(rows)
        row_bytes = int(rows.itemsize * np.prod(rows.shape[1:], dtype=np.int64))
        counts = self.allgather(int(ids.size))
        if self.rank != 0:
            for start, stop in _chunks(ids.size, row_bytes, chunk_bytes):
                self._send_host(ids[start:stop], dest=0, tag=0)
                self._send_host(rows[start:stop], dest=0, tag=1)
            return
        assert sink is not None
        _sink_in_chunks(ids, rows, sink, chunk_bytes)
        for source in range(1, self.size):
            for start, stop in _chunks(counts[source], row_bytes, chunk_bytes):
                chunk_ids = np.empty(stop - start, dtype=np.int64)
                chunk_rows = np.empty((stop - start, *rows.shape[1:]), dtype=rows.dtype)
                self._recv_host(chunk_ids, source=source, tag=0)
                self._recv_host(chunk_rows, source=source, tag=1)
                sink(chunk_ids, chunk_rows)


class Communicator(RankGroup):
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
            from distmb.comm.mpienv import local_rank_from_env

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
            _init_process_group(
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
                [host, (counts * width, _offsets(counts) * width), mpi_type],
                [received, (recv_counts * width, _offsets(recv_counts) * width), mpi_type],
            )
        return recv_counts, torch.from_numpy(received) if as_tensor else received


class TorchCommunicator(RankGroup):
    """The workers of ``torchrun`` (``python -m torch.distributed.run``), without MPI.

    A gloo process group from ``env://`` (torchrun's ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``) is made at once: :attr:`host_group`, which carries the
    small collectives (host tensors, Python objects), the gathering of outputs and, until
    :meth:`use_torch_distributed` picks NCCL on a GPU, the bulk operations too
    (:attr:`torch_group` is the same group on the CPU).

    A failing rank ends its process (:meth:`abort`); torchrun's agent sees the exit and
    stops the other workers. There is no collective watchdog (it heartbeats over MPI): a
    rank that stops without dying fails its peers' collectives after
    :data:`TORCHRUN_TIMEOUT_S`.

    Raises:
        RuntimeError: torch.distributed is unavailable.
    """

    launcher = "torchrun"

    def __init__(self, timeout_s: float = TORCHRUN_TIMEOUT_S) -> None:
        import torch.distributed as dist

        if not dist.is_available():
            raise RuntimeError("torchrun: this torch build has no torch.distributed")
        _init_process_group(
            backend=TORCH_CPU_BACKEND,
            init_method="env://",
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        super().__init__(dist.get_rank(), dist.get_world_size())
        #: The gloo group of every rank (host tensors).
        self.host_group = dist.group.WORLD
        self.torch_group = self.host_group

    def local_rank(self) -> int:
        """``LOCAL_RANK`` (torchrun sets it; :func:`distmb.comm.mpienv.local_rank_from_env`),
        else this rank's index among the ranks on its host (a collective of every rank)."""
        if self._local_rank is None:
            from distmb.comm.mpienv import local_rank_from_env

            found = local_rank_from_env()
            if found is None:
                hosts = self.allgather(socket.gethostname())
                found = hosts[: self.rank].count(hosts[self.rank])
            self._local_rank = found
        return self._local_rank

    def use_torch_distributed(
        self, backend: str = TORCH_CPU_BACKEND, device: torch.device | str = "cpu"
    ) -> None:
        """The bulk operations over ``backend`` on ``device``: the gloo group itself on the
        CPU, a new NCCL group of every rank on a GPU (set the rank's GPU with
        ``torch.cuda.set_device`` first).

        Raises:
            RuntimeError: a second group was asked for.
        """
        import torch.distributed as dist

        if self.torch_group is not self.host_group:
            raise RuntimeError("--comm torch: a torch.distributed group is already set up")
        if backend != TORCH_CPU_BACKEND:
            with self.watched("torch.distributed rendezvous"):
                self.torch_group = dist.new_group(backend=backend)
        self.torch_device = torch.device(device)

    def close_torch_distributed(self) -> None:
        super().close_torch_distributed()  # destroys the NCCL group and the gloo group
        self.host_group = None

    # -- small collectives -----------------------------------------------------------------
    def _reduce_scalar(self, value: float, op) -> float:
        import torch.distributed as dist

        exact = isinstance(value, int | np.integer)
        tensor = torch.tensor([value], dtype=torch.int64 if exact else torch.float64)
        dist.all_reduce(tensor, op=op, group=self.host_group)
        return int(tensor.item()) if exact else float(tensor.item())

    def allreduce_max(self, value: float) -> float:
        import torch.distributed as dist

        with self.watched("allreduce (max)"):
            return self._reduce_scalar(value, dist.ReduceOp.MAX)

    def allreduce_min(self, value: float) -> float:
        import torch.distributed as dist

        with self.watched("allreduce (min)"):
            return self._reduce_scalar(value, dist.ReduceOp.MIN)

    def allreduce_sum(self, values: np.ndarray) -> np.ndarray:
        import torch.distributed as dist

        tensor = torch.from_numpy(np.array(values, copy=True))
        with self.watched("allreduce (sum)"):
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.host_group)
        return tensor.numpy()

    def allgather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        with self.watched("allgather"):
            dist.all_gather_object(out, obj, group=self.host_group)
        return out

    def bcast(self, obj: Any, root: int = 0) -> Any:
        import torch.distributed as dist

        box = [obj]
        with self.watched("bcast"):
            dist.broadcast_object_list(box, src=root, group=self.host_group)
        return box[0]

    def barrier(self) -> None:
        import torch.distributed as dist

        with self.watched("barrier"):
            dist.barrier(group=self.host_group)

    def abort(self, code: int) -> None:
        """End this process at once with ``code`` (after flushing what it wrote): torchrun's
        agent sees a worker fail and stops the others. No teardown: a collective still in
        flight would wait for the peers."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def _send_host(self, array: np.ndarray, dest: int, tag: int) -> None:
        import torch.distributed as dist

        dist.send(_host_tensor(array), dst=dest, group=self.host_group, tag=tag)

    def _recv_host(self, array: np.ndarray, source: int, tag: int) -> None:
        import torch.distributed as dist

        dist.recv(torch.from_numpy(array), src=source, group=self.host_group, tag=tag)


def launch_communicator() -> RankGroup:
    """The ranks of this job: :class:`Communicator` when an MPI launcher started it, else
    :class:`TorchCommunicator` (torchrun; :func:`distmb.comm.mpienv.is_torchrun_launch`)."""
    from distmb.comm.mpienv import is_mpi_launch

    return Communicator() if is_mpi_launch() else TorchCommunicator()


class SingleProcess:
    """The ranks of a run started without a launcher: one rank, and every collective of
    :class:`RankGroup` is the identity (nothing to reduce, gather or wait for)."""

    rank = 0
    size = 1

    def local_rank(self) -> int:
        """The only rank is the first on its node."""
        return 0

    def __init__(self) -> None:
        #: Always zero: one rank reduces nothing.
        self.allreduce_stats = AllreduceStats()

    def allreduce_max(self, value: float) -> float:
        return value

    def allreduce_min(self, value: float) -> float:
        return value

    def allreduce_sum(self, values: np.ndarray) -> np.ndarray:
        return np.array(values, copy=True)

    def allgather(self, obj):
        return [obj]

    def barrier(self) -> None:
        pass

    def prepare_gradients(self, model: torch.nn.Module, bucket_bytes: int) -> None:
        pass

    def allreduce_gradients(self, model: torch.nn.Module) -> None:
        pass

    def gather_rows(
        self,
        ids: np.ndarray,
        rows: np.ndarray,
        sink: RowSink | None,
        chunk_bytes: int = GATHER_CHUNK_BYTES,
    ) -> None:
        """:meth:`RankGroup.gather_rows` of one rank: its own rows, chunk by chunk."""
        assert sink is not None
        _sink_in_chunks(np.asarray(ids, dtype=np.int64), rows, sink, chunk_bytes)


@dataclass
class _Buffers:
    """Reusable send/receive storage of one in-flight push."""

    send_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    send_rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32))
    recv_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    recv_rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32))


def _offsets(counts: np.ndarray) -> np.ndarray:
    """int64 exclusive prefix sum of ``counts``: where each peer's segment starts."""
    out = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=out[1:])
    return out


def _fit(buf: np.ndarray, n: int) -> np.ndarray:
    """``buf`` if it holds ``n`` elements, else a larger replacement (grown geometrically)."""
    if buf.shape[0] >= n:
        return buf
    return np.empty(max(n, int(buf.shape[0] * BUFFER_GROWTH)), dtype=buf.dtype)


@dataclass
class PushStats:
    """Traffic and waiting of one layer's pushes since the last reset.

    Attributes:
        rows_sent, bytes_sent: (``VID_o``, row) messages this rank sent to its peers and
            their bytes (:func:`~distmb.core.units.row_message_bytes`).
        rows_received, bytes_received: the same for the messages that arrived here
            (counted when an exchange finishes).
        wait_s: wall seconds waiting for exchanges to finish (``Waitall``).
        mpi_s, mpi_cpu_s: wall and calling-thread CPU seconds inside every MPI call of the
            pushes (the blocking count ``Alltoall``, posting the ``Ialltoallv``, the
            ``Waitall``): what the pushes cost the training thread, to be told apart from
            the compute of the phase that runs them (an MPI library that polls while it
            waits spends CPU there).
    """

    rows_sent: int = 0
    bytes_sent: int = 0
    rows_received: int = 0
    bytes_received: int = 0
    wait_s: float = 0.0
    mpi_s: float = 0.0
    mpi_cpu_s: float = 0.0

    def reset(self) -> None:
        self.rows_sent = self.bytes_sent = self.rows_received = self.bytes_received = 0
        self.wait_s = self.mpi_s = self.mpi_cpu_s = 0.0

    @contextmanager
    def in_mpi(self) -> Iterator[None]:
        """Add the wall and thread-CPU seconds of the enclosed MPI calls to ``mpi_s`` and
        ``mpi_cpu_s``."""
        start, cpu_start = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.mpi_s += time.perf_counter() - start
            self.mpi_cpu_s += time.thread_time() - cpu_start


@dataclass
class AllreduceStats:
    """Gradient all-reduces since the last reset: ``calls`` and the ``payload_bytes`` each
    rank contributed (the flat float32 gradient buffer, ``4 * parameters`` per call). What
    crosses the network depends on the algorithm (a ring moves ``2 (P - 1) / P`` times the
    payload per rank)."""

    calls: int = 0
    payload_bytes: int = 0

    def reset(self) -> None:
        self.calls = self.payload_bytes = 0


class EmbeddingPush:
    """Non-blocking all-to-all-v of (VID_o, rows) for one layer, ``delay`` messages deep.

    ``start`` exchanges the per-peer counts (a small blocking ``Alltoall``), then starts
    ``Ialltoallv`` for ids and rows; ``finish`` waits for the oldest exchange and returns what
    arrived. ``delay + 1`` buffer sets are reused round-robin, so steady-state iterations
    allocate nothing.
    """

    def __init__(self, comm: Communicator, dim: int, delay: int) -> None:
        self.comm = comm
        self.dim = dim
        self.delay = delay
        # ``delay + 1`` sets used round-robin, made when first needed: pushes start only in
        # epochs longer than ``delay``, so a huge --hec-delay allocates nothing.
        self._pool: list[_Buffers] = []
        self._next = 0
        self._inflight: deque[tuple[list, _Buffers, int]] = deque()
        self.stats = PushStats()

    def __len__(self) -> int:
        return len(self._inflight)

    def start(
        self, counts: np.ndarray, ids: np.ndarray | torch.Tensor, rows: np.ndarray | torch.Tensor
    ) -> None:
        """Send ``ids[k]`` (int64 VID_o) and ``rows[k]`` (float32[dim]; both may be tensors
        on any device, copied to host memory first) grouped by peer: the first ``counts[0]``
        entries go to rank 0, the next ``counts[1]`` to rank 1, ..."""
        MPI = _mpi()
        size, dim = self.comm.size, self.dim
        counts = np.ascontiguousarray(counts, dtype=np.int64)
        recv_counts = np.empty(size, dtype=np.int64)
        with self.comm.watched("embedding push (counts)"), self.stats.in_mpi():
            self.comm.comm.Alltoall(counts, recv_counts)
        if self._next == len(self._pool):
            self._pool.append(_Buffers())
        buf = self._pool[self._next]
        self._next = (self._next + 1) % (self.delay + 1)
        n_send, n_recv = int(counts.sum()), int(recv_counts.sum())
        buf.send_ids = _fit(buf.send_ids, n_send)
        buf.send_rows = _fit(buf.send_rows, n_send * dim)
        buf.recv_ids = _fit(buf.recv_ids, n_recv)
        buf.recv_rows = _fit(buf.recv_rows, n_recv * dim)
        if isinstance(rows, torch.Tensor):  # device rows are staged through host memory
            rows = rows.detach().cpu().numpy()
        if isinstance(ids, torch.Tensor):
            ids = ids.cpu().numpy()
        buf.send_ids[:n_send] = ids
        buf.send_rows[: n_send * dim] = np.asarray(rows, dtype=np.float32).reshape(-1)
        sdisp = _offsets(counts)
        rdisp = _offsets(recv_counts)
        with self.stats.in_mpi():
            requests = [
                self.comm.comm.Ialltoallv(
                    [buf.send_ids, (counts, sdisp), MPI.INT64_T],
                    [buf.recv_ids, (recv_counts, rdisp), MPI.INT64_T],
                ),
                self.comm.comm.Ialltoallv(
                    [buf.send_rows, (counts * dim, sdisp * dim), MPI.FLOAT],
                    [buf.recv_rows, (recv_counts * dim, rdisp * dim), MPI.FLOAT],
                ),
            ]
        self._inflight.append((requests, buf, n_recv))
        self.stats.rows_sent += n_send
        self.stats.bytes_sent += n_send * row_message_bytes(dim)

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        """Wait for the oldest exchange; returns (ids int64[n], rows float32[n, dim]) views
        into reused buffers (valid until the buffer set is reused, ``delay + 1`` pushes
        later)."""
        requests, buf, n_recv = self._inflight.popleft()
        start = time.perf_counter()
        with self.comm.watched("embedding push (wait)"), self.stats.in_mpi():
            _mpi().Request.Waitall(requests)
        self.stats.wait_s += time.perf_counter() - start
        self.stats.rows_received += n_recv
        self.stats.bytes_received += n_recv * row_message_bytes(self.dim)
        return buf.recv_ids[:n_recv], buf.recv_rows[: n_recv * self.dim].reshape(n_recv, self.dim)


def _pack_gradients(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Copy every parameter's gradient into consecutive slices of ``flat`` (float32[total],
    on any device); a parameter without one contributes zeros."""
    offset = 0
    for p in params:
        n = p.numel()
        if p.grad is None:
            flat[offset : offset + n].zero_()
        else:
            flat[offset : offset + n].copy_(p.grad.reshape(-1))
        offset += n


def _unpack_gradients(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Inverse of :func:`_pack_gradients`: the slices of ``flat`` become the gradients (a
    parameter without one gets a new tensor on its own device)."""
    offset = 0
    for p in params:
        n = p.numel()
        if p.grad is None:
            p.grad = flat[offset : offset + n].view_as(p).to(p.device, copy=True)
        else:
            p.grad.copy_(flat[offset : offset + n].view_as(p))
        offset += n


class BucketedAllreduce:
    """The gradient all-reduce of ``--comm torch`` in buckets that overlap the backward pass
    (DDP's reducer, without wrapping the model).

    The parameters are grouped, in reverse order of ``model.parameters()`` (the order in
    which the backward pass of a layer stack produces their gradients), into buckets of about
    ``bucket_bytes`` of float32 gradients (a parameter larger than that is a bucket of its
    own); each bucket has a flat buffer on the parameters' device. A
    ``post_accumulate_grad`` hook per parameter copies its gradient into its bucket; when a
    bucket is complete and every bucket before it has started, it starts (an asynchronous
    ``all_reduce``), so buckets start in the same order on every rank whatever order the
    hooks fire in (collectives must match across ranks). :meth:`finish` (after the backward
    pass) treats parameters that got no gradient as zeros (as the flat all-reduce does),
    starts the remaining buckets in order, waits for all, and writes the averages back.

    Element for element the sum is the same all-reduce SUM over the same ranks as the flat
    one followed by the same division, so with 2 ranks (``a + b``) the result is bit for bit
    the flat all-reduce's; with more, the library's reduction order may depend on the buffer
    size (a ring's chunking), so values may differ in rounding.

    Args:
        model: its parameters with ``requires_grad`` are reduced (hooks registered here).
        bucket_bytes: bytes of gradients per bucket (about; at least one parameter each).
        world: the number of ranks (the divisor of the average).
        group: the torch.distributed group.
        watched: the communicator's watchdog context for the final wait.

    Raises:
        RuntimeError: a gradient accumulated into a parameter after its bucket started
            (more than one backward pass per step).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        bucket_bytes: int,
        world: int,
        group,
        watched: Callable[[str], AbstractContextManager[None]],
    ) -> None:
        self.model = model
        self.world = world
        self.group = group
        self._watched = watched
        self.params = [p for p in model.parameters() if p.requires_grad]
        per_bucket = max(1, bucket_bytes // FLOAT32_BYTES)
        #: Buckets as lists of indices into :attr:`params`.
        self.buckets: list[list[int]] = []
        size = 0
        for i in reversed(range(len(self.params))):
            n = self.params[i].numel()
            if not self.buckets or (size > 0 and size + n > per_bucket):
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(i)
            size += n
        self._bucket_of: dict[int, int] = {}
        self._offset: dict[int, int] = {}
        self.flats: list[torch.Tensor] = []
        for b, members in enumerate(self.buckets):
            offset = 0
            for i in members:
                self._bucket_of[i], self._offset[i] = b, offset
                offset += self.params[i].numel()
            self.flats.append(
                torch.empty(offset, dtype=torch.float32, device=self.params[members[0]].device)
            )
        self._ready = [False] * len(self.params)
        self._missing = [len(members) for members in self.buckets]
        self._works: list = []
        self._next = 0  # the first bucket not started
        self.hooks = [
            p.register_post_accumulate_grad_hook(self._hook(i)) for i, p in enumerate(self.params)
        ]

    def _hook(self, i: int) -> Callable[[torch.Tensor], None]:
        def ready(param: torch.Tensor) -> None:
            self._take(i, param.grad)

        return ready

    def _take(self, i: int, grad: torch.Tensor | None) -> None:
        """Parameter ``i``'s gradient (None: zeros) into its bucket; start what is ready."""
        b = self._bucket_of[i]
        if self._ready[i]:
            if b < self._next:
                raise RuntimeError(
                    "a gradient was accumulated after its bucket's all-reduce started (more "
                    "than one backward pass per optimizer step); set --grad-bucket-mb 0"
                )
            self._missing[b] += 1  # accumulated again before the bucket started: recopy
        n = self.params[i].numel()
        view = self.flats[b][self._offset[i] : self._offset[i] + n]
        if grad is None:
            view.zero_()
        else:
            view.copy_(grad.reshape(-1))
        self._ready[i] = True
        self._missing[b] -= 1
        self._start_ready()

    def _start_ready(self) -> None:
        import torch.distributed as dist

        while self._next < len(self.buckets) and self._missing[self._next] == 0:
            self._works.append(
                dist.all_reduce(
                    self.flats[self._next], op=dist.ReduceOp.SUM, group=self.group, async_op=True
                )
            )
            self._next += 1

    @property
    def started(self) -> int:
        """Buckets started since the last :meth:`finish` (tests: the overlap happened)."""
        return self._next

    def finish(self) -> None:
        """Start what the backward pass left (parameters without a gradient count as zeros),
        wait for every bucket, and write the averaged gradients back."""
        for i, p in enumerate(self.params):
            if not self._ready[i]:  # no backward reached it: what it holds, as flat packing
                self._take(i, p.grad)
        with self._watched("gradient allreduce"):
            for work in self._works:
                work.wait()
        for b, members in enumerate(self.buckets):
            flat = self.flats[b].div_(self.world)
            for i in members:
                p = self.params[i]
                view = flat[self._offset[i] : self._offset[i] + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = view.clone()
                else:
                    p.grad.copy_(view)
        self._works = []
        self._next = 0
        self._ready = [False] * len(self.params)
        self._missing = [len(members) for members in self.buckets]

    def remove(self) -> None:
        """Unregister the hooks and let go of the group (a process group kept alive past
        ``destroy_process_group`` aborts the process when it is freed at exit)."""
        for hook in self.hooks:
            hook.remove()
        self.hooks = []
        self.group = None


class TorchEmbeddingPush:
    """:class:`EmbeddingPush` over ``torch.distributed`` (``--comm torch``): the same
    messages, counts and queue, with the ids and rows as tensors on the group's device
    (NCCL: device memory end to end; gloo: host tensors).

    ``start`` exchanges the per-peer counts (a blocking ``all_to_all_single`` of int64[P],
    whose result is read on the host: it sizes the receive tensors), then starts two
    asynchronous ``all_to_all_single`` with splits (ids, rows); ``finish`` waits for the
    oldest exchange (``Work.wait``: on a GPU this orders the current stream after the
    transfer, no host synchronisation) and returns its tensors.
    """

    def __init__(self, comm: RankGroup, dim: int, delay: int) -> None:
        self.comm = comm
        self.dim = dim
        self.delay = delay
        self.device = comm.torch_device
        self._inflight: deque[tuple[list, torch.Tensor, torch.Tensor, tuple]] = deque()
        self.stats = PushStats()

    def __len__(self) -> int:
        return len(self._inflight)

    def start(
        self, counts: np.ndarray, ids: np.ndarray | torch.Tensor, rows: np.ndarray | torch.Tensor
    ) -> None:
        """As :meth:`EmbeddingPush.start`; ``ids`` and ``rows`` may be tensors on any device
        (moved to the group's device)."""
        import torch.distributed as dist

        group = self.comm.torch_group
        counts = np.ascontiguousarray(counts, dtype=np.int64)
        with self.comm.watched("embedding push (counts)"), self.stats.in_mpi():
            recv = exchange_counts(group, self.device, counts)
        send_ids = torch.as_tensor(ids, dtype=torch.int64).to(self.device).contiguous()
        send_rows = (
            torch.as_tensor(rows, dtype=torch.float32)
            .to(self.device)
            .reshape(-1, self.dim)
            .contiguous()
        )
        n_send, n_recv = int(counts.sum()), int(recv.sum())
        recv_ids = torch.empty(n_recv, dtype=torch.int64, device=self.device)
        recv_rows = torch.empty((n_recv, self.dim), dtype=torch.float32, device=self.device)
        splits_out, splits_in = recv.tolist(), counts.tolist()
        with self.stats.in_mpi():
            works = [
                dist.all_to_all_single(
                    recv_ids, send_ids, splits_out, splits_in, group=group, async_op=True
                ),
                dist.all_to_all_single(
                    recv_rows, send_rows, splits_out, splits_in, group=group, async_op=True
                ),
            ]
        # The send tensors stay referenced until the exchange is waited for.
        self._inflight.append((works, recv_ids, recv_rows, (send_ids, send_rows)))
        self.stats.rows_sent += n_send
        self.stats.bytes_sent += n_send * row_message_bytes(self.dim)

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Wait for the oldest exchange; returns (ids int64[n], rows float32[n, dim]) on the
        group's device."""
        works, recv_ids, recv_rows, _ = self._inflight.popleft()
        start = time.perf_counter()
        with self.comm.watched("embedding push (wait)"), self.stats.in_mpi():
            for work in works:
                work.wait()
        self.stats.wait_s += time.perf_counter() - start
        n_recv = int(recv_ids.shape[0])
        self.stats.rows_received += n_recv
        self.stats.bytes_received += n_recv * row_message_bytes(self.dim)
        return recv_ids, recv_rows


def make_push(comm: RankGroup, dim: int, delay: int) -> EmbeddingPush | TorchEmbeddingPush:
    """The embedding push of one layer: over ``torch.distributed`` once the communicator
    uses it (``--comm torch``, and always under torchrun), else over MPI."""
    if getattr(comm, "torch_group", None) is not None:
        return TorchEmbeddingPush(comm, dim, delay)
    return EmbeddingPush(comm, dim, delay)
