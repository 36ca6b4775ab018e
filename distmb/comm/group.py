"""The ranks of a run and the collectives between them: :class:`RankGroup`.

Every collective is a method call visible at its call site, and every rank calls the same
collectives in the same order (the trainer guarantees equal iteration counts).

Three implementations share the interface:

- :class:`~distmb.comm.mpi.MpiGroup`: the ranks of an MPI launch (``mpirun``, ``mpiexec``,
  ``srun``); numpy buffers over MPI until :meth:`RankGroup.use_torch_distributed`
  (``--comm torch``) routes the bulk operations through a ``torch.distributed`` group.
- :class:`~distmb.comm.torch.TorchGroup`: the workers of ``torchrun``, without MPI.
- :class:`SingleProcess`: one rank started without a launcher; every collective is the
  identity.

The operations that run over ``torch.distributed`` once :attr:`RankGroup.torch_group` is set
live here, shared by both multi-rank groups: the gradient all-reduce (flat, or in buckets
during the backward pass, :mod:`distmb.comm.buckets`), :meth:`RankGroup.alltoallv` of
``--exact-remote``, :meth:`RankGroup.halo_exchange` of exact evaluation, and the teardown.
:meth:`RankGroup.gather_rows` (the outputs of ``distmb.predict``) runs over each group's
point-to-point messages.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from distmb.comm.buckets import (
    AllreduceStats,
    BucketedAllreduce,
    pack_gradients,
    unpack_gradients,
)
from distmb.core.units import FLOAT32_BYTES

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from distmb.comm.watchdog import CollectiveWatchdog

#: Bytes of rows per message of :meth:`RankGroup.gather_rows` (rank 0 holds one at a time).
GATHER_CHUNK_BYTES = 64 << 20
#: torch.distributed backend of ``--comm torch`` for host tensors.
TORCH_CPU_BACKEND = "gloo"
#: torch.distributed backend of ``--comm torch`` for CUDA tensors.
TORCH_CUDA_BACKEND = "nccl"

#: ``sink(ids, rows)``: takes one chunk of gathered rows: int64[k] ids and their rows.
RowSink = Callable[[np.ndarray, np.ndarray], None]


def row_chunks(num_rows: int, row_bytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive chunks of ``num_rows`` rows of ``row_bytes`` bytes,
    each at most ``chunk_bytes`` (one row at least)."""
    step = max(1, chunk_bytes // max(row_bytes, 1))
    return [(start, min(start + step, num_rows)) for start in range(0, num_rows, step)]


def _row_bytes(rows: np.ndarray) -> int:
    """Bytes of one row of ``rows`` ([n, ...])."""
    return int(rows.itemsize * np.prod(rows.shape[1:], dtype=np.int64))


def _sink_in_chunks(ids: np.ndarray, rows: np.ndarray, sink: RowSink, chunk_bytes: int) -> None:
    """Hand this rank's own ``ids`` (int64[n]) and ``rows`` ([n, ...]) to ``sink`` in chunks
    of at most ``chunk_bytes`` bytes of rows."""
    for start, stop in row_chunks(len(ids), _row_bytes(rows), chunk_bytes):
        sink(ids[start:stop], rows[start:stop])


def peer_offsets(counts: np.ndarray) -> np.ndarray:
    """int64 exclusive prefix sum of ``counts`` (int64[P]): where each peer's segment of a
    message grouped by peer starts."""
    out = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=out[1:])
    return out


def host_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing ``array``'s memory (C-contiguous; a read-only array, e.g. a
    memory map, is copied first: torch warns about, and must never write, read-only
    memory)."""
    array = np.ascontiguousarray(array)
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


def exchange_counts(
    group: ProcessGroup | None, device: torch.device, counts: np.ndarray
) -> np.ndarray:
    """One ``all_to_all_single`` of per-peer counts over the torch.distributed ``group``:
    ``counts[j]`` (int64[P]) goes to rank ``j``; returns what every rank sent here (int64[P],
    on the host: the counts size the receive buffers). On ``device`` (the group's: NCCL moves
    device tensors only)."""
    import torch.distributed as dist

    send = torch.from_numpy(np.ascontiguousarray(counts, dtype=np.int64)).to(device)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.cpu().numpy()


class RankGroup(ABC):
    """The ranks of a run: what the trainer, the halo schemes and ``distmb.predict``
    call, and the operations that run over ``torch.distributed`` once :attr:`torch_group`
    is set (the gradient all-reduce, the all-to-all-v and halo exchange, the teardown). The
    subclasses say how the ranks were started and run the small collectives and the
    point-to-point messages: :class:`~distmb.comm.mpi.MpiGroup` (MPI),
    :class:`~distmb.comm.torch.TorchGroup` (torchrun), :class:`SingleProcess` (one rank).

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
        #: Marks each collective below while set (:mod:`distmb.comm.watchdog`; the trainer
        #: sets it for ``--collective-timeout`` under MPI).
        self.watchdog: CollectiveWatchdog | None = None
        #: The torch.distributed group of the bulk operations (the gradient all-reduce, the
        #: HEC pushes, the all-to-all-v and halo exchange), or None: they go over MPI.
        self.torch_group: ProcessGroup | None = None
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
        """The largest ``value`` of all ranks (an ``int`` stays an ``int``)."""

    @abstractmethod
    def allreduce_min(self, value: float) -> float:
        """The smallest ``value`` of all ranks (an ``int`` stays an ``int``)."""

    @abstractmethod
    def allreduce_sum(self, values: np.ndarray) -> np.ndarray:
        """Element-wise sum over ranks of a float64 or int64 array (a new array)."""

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
        each is complete (:class:`~distmb.comm.buckets.BucketedAllreduce`);
        :meth:`allreduce_gradients` then only finishes them. Otherwise (MPI, or
        ``bucket_bytes == 0``) nothing changes: one flat all-reduce after the backward pass.
        Call once, on every rank, before training."""
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
        pack_gradients(params, flat)
        with self.watched("gradient allreduce"):
            self._sum_flat(flat)
        flat.div_(self.size)
        unpack_gradients(params, flat)

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
        tensor = send if isinstance(send, torch.Tensor) else host_tensor(send)
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
        row_bytes = _row_bytes(rows)
        counts = self.allgather(int(ids.size))
        if self.rank != 0:
            for start, stop in row_chunks(ids.size, row_bytes, chunk_bytes):
                self._send_host(ids[start:stop], dest=0, tag=0)
                self._send_host(rows[start:stop], dest=0, tag=1)
            return
        assert sink is not None
        _sink_in_chunks(ids, rows, sink, chunk_bytes)
        for source in range(1, self.size):
            for start, stop in row_chunks(counts[source], row_bytes, chunk_bytes):
                chunk_ids = np.empty(stop - start, dtype=np.int64)
                chunk_rows = np.empty((stop - start, *rows.shape[1:]), dtype=rows.dtype)
                self._recv_host(chunk_ids, source=source, tag=0)
                self._recv_host(chunk_rows, source=source, tag=1)
                sink(chunk_ids, chunk_rows)


class SingleProcess(RankGroup):
    """The ranks of a run started without a launcher: one rank, and every collective is the
    identity (nothing to reduce, gather or wait for).

    The gradients are left as the backward pass made them (a parameter without a gradient
    keeps none) and :attr:`~RankGroup.allreduce_stats` stays zero: one rank reduces nothing.
    There is no peer to send to, so the point-to-point messages raise.
    """

    def __init__(self) -> None:
        super().__init__(rank=0, size=1)

    def local_rank(self) -> int:
        """The only rank is the first on its node."""
        return 0

    def use_torch_distributed(
        self, backend: str = TORCH_CPU_BACKEND, device: torch.device | str = "cpu"
    ) -> None:
        """Nothing to route: one rank exchanges nothing (no group is set up)."""

    def abort(self, code: int) -> None:
        """End this process with ``code`` (``SystemExit``)."""
        raise SystemExit(code)

    def allreduce_max(self, value: float) -> float:
        return value

    def allreduce_min(self, value: float) -> float:
        return value

    def allreduce_sum(self, values: np.ndarray) -> np.ndarray:
        return np.array(values, copy=True)

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def bcast(self, obj: Any, root: int = 0) -> Any:
        self._check_peer(root)
        return obj

    def barrier(self) -> None:
        pass

    def _send_host(self, array: np.ndarray, dest: int, tag: int) -> None:
        self._check_peer(dest)
        raise ValueError("one rank: there is no peer to send to")

    def _recv_host(self, array: np.ndarray, source: int, tag: int) -> None:
        self._check_peer(source)
        raise ValueError("one rank: there is no peer to receive from")

    @staticmethod
    def _check_peer(rank: int) -> None:
        if rank != 0:
            raise ValueError(f"one rank: there is no rank {rank}")

    def prepare_gradients(self, model: torch.nn.Module, bucket_bytes: int) -> None:
        """Nothing to prepare: the gradients are already the average over one rank."""

    def allreduce_gradients(self, model: torch.nn.Module) -> None:
        """The identity: the gradients are already the average over one rank."""

    def alltoallv(
        self,
        counts: np.ndarray,
        send: np.ndarray | torch.Tensor,
        recv_counts: np.ndarray | None = None,
    ) -> tuple[np.ndarray, Any]:
        """:meth:`RankGroup.alltoallv` of one rank: ``send`` comes back (a copy, on its
        device), with ``counts`` (int64[1]) as the received counts."""
        counts = np.ascontiguousarray(counts, dtype=np.int64).copy()
        if counts.shape != (1,) or int(counts[0]) != len(send):
            raise ValueError(f"one rank: counts {counts.tolist()} for {len(send)} rows")
        if recv_counts is not None and not np.array_equal(recv_counts, counts):
            raise ValueError(f"one rank: receives {counts.tolist()}, not {list(recv_counts)}")
        if isinstance(send, torch.Tensor):
            return counts, send.clone()
        return counts, np.array(send, copy=True)
