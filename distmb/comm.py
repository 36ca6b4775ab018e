"""Communication between ranks (mpi4py on numpy buffers).

Every collective is a method call visible at its call site, and every rank calls the same
collectives in the same order (the trainer guarantees equal iteration counts).

- :meth:`Communicator.allreduce_gradients`: one ``Allreduce`` over a flat buffer of all
  gradients, then averaged; through ``torch.distributed`` (gloo on CPU) after
  :meth:`Communicator.use_torch_distributed` (``--comm torch``), whose process group is set
  up from the MPI launch (rank, size and the rendezvous address agreed over MPI).
- :class:`EmbeddingPush`: the non-blocking all-to-all-v of (``VID_o``, embedding rows) of
  the Asynchronous Embedding Push, with a queue of depth ``d`` and reusable buffers.
- :meth:`Communicator.halo_exchange`: the synchronous exchange of exact evaluation.
- :meth:`Communicator.gather_rows`: every rank's rows to rank 0, chunk by chunk (the
  gathered outputs of ``distmb.predict``).
"""

from __future__ import annotations

import datetime
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from distmb.units import FLOAT32_BYTES, row_message_bytes

if TYPE_CHECKING:
    from distmb.watchdog import CollectiveWatchdog

#: Growth factor of reusable communication buffers when a message does not fit.
BUFFER_GROWTH = 1.5
#: Bytes of rows per message of :meth:`Communicator.gather_rows` (rank 0 holds one at a time).
GATHER_CHUNK_BYTES = 64 << 20

#: torch.distributed backend of ``--comm torch`` for host tensors.
TORCH_CPU_BACKEND = "gloo"
#: Seconds a rank waits for the others while the torch.distributed group is set up.
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


class Communicator:
    """The ranks of ``MPI.COMM_WORLD`` (or a given communicator)."""

    def __init__(self, comm=None) -> None:
        MPI = _mpi()
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()
        self._grad_buffer: torch.Tensor | None = None
        #: Gradient all-reduces since the last reset (the trainer resets it every epoch).
        self.allreduce_stats = AllreduceStats()
        #: Marks each collective below while set (:mod:`distmb.watchdog`; the trainer sets it
        #: for ``--collective-timeout``).
        self.watchdog: CollectiveWatchdog | None = None
        #: The torch.distributed group of the same ranks once :meth:`use_torch_distributed`
        #: ran (``--comm torch``), else None.
        self.torch_group = None

    # -- torch.distributed -----------------------------------------------------------------
    def use_torch_distributed(self, backend: str = TORCH_CPU_BACKEND) -> None:
        """Set up a ``torch.distributed`` process group over these ranks (same rank numbers)
        and route the gradient all-reduce through it from now on.

        No launcher support is needed: rank 0 opens the group's rendezvous store on a port
        the OS picks and sends its address and port to the others over MPI (the loopback
        address when every rank runs on rank 0's host, else rank 0's host name).

        Args:
            backend: ``gloo`` (host tensors).

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
            dist.init_process_group(
                backend, store=store, rank=self.rank, world_size=self.size, timeout=timeout
            )
        self.torch_group = dist.group.WORLD

    def close_torch_distributed(self) -> None:
        """Tear the ``torch.distributed`` group down (nothing when there is none)."""
        if self.torch_group is not None:
            import torch.distributed as dist

            dist.destroy_process_group()
            self.torch_group = None

    def watched(self, collective: str) -> AbstractContextManager[None]:
        """The watchdog's mark of a wait in ``collective`` (nothing without a watchdog)."""
        if self.watchdog is None:
            return nullcontext()
        return self.watchdog.watch(collective)

    # -- small collectives -----------------------------------------------------------------
    def allreduce_max(self, value: float) -> float:
        with self.watched("allreduce (max)"):
            return self.comm.allreduce(value, op=_mpi().MAX)

    def allreduce_min(self, value: float) -> float:
        with self.watched("allreduce (min)"):
            return self.comm.allreduce(value, op=_mpi().MIN)

    def allreduce_sum(self, values: np.ndarray) -> np.ndarray:
        """Element-wise sum over ranks of a float64 or int64 array."""
        out = np.empty_like(values)
        with self.watched("allreduce (sum)"):
            self.comm.Allreduce(np.ascontiguousarray(values), out, op=_mpi().SUM)
        return out

    def allgather(self, obj):
        """Python objects from every rank (small metadata only)."""
        with self.watched("allgather"):
            return self.comm.allgather(obj)

    def barrier(self) -> None:
        with self.watched("barrier"):
            self.comm.Barrier()

    def abort(self, code: int) -> None:
        self.comm.Abort(code)

    # -- gradients -------------------------------------------------------------------------
    def allreduce_gradients(self, model: torch.nn.Module) -> None:
        """Average the gradients of ``model`` over ranks in place (one flat ``Allreduce``).

        Parameters without a gradient contribute zeros, so every rank sends the same layout.
        """
        params = list(model.parameters())
        total = sum(p.numel() for p in params)
        if self._grad_buffer is None or self._grad_buffer.numel() != total:
            self._grad_buffer = torch.empty(total, dtype=torch.float32)
        flat = self._grad_buffer
        offset = 0
        for p in params:
            n = p.numel()
            if p.grad is None:
                flat[offset : offset + n].zero_()
            else:
                flat[offset : offset + n].copy_(p.grad.reshape(-1))
            offset += n
        with self.watched("gradient allreduce"):
            if self.torch_group is not None:
                import torch.distributed as dist

                dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.torch_group)
            else:
                self.comm.Allreduce(_mpi().IN_PLACE, flat.numpy(), op=_mpi().SUM)
        self.allreduce_stats.calls += 1
        self.allreduce_stats.payload_bytes += total * FLOAT32_BYTES
        flat.div_(self.size)
        offset = 0
        for p in params:
            n = p.numel()
            if p.grad is None:
                p.grad = flat[offset : offset + n].view_as(p).clone()
            else:
                p.grad.copy_(flat[offset : offset + n].view_as(p))
            offset += n

    def alltoallv(
        self, counts: np.ndarray, send: np.ndarray, recv_counts: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Synchronous all-to-all-v of rows grouped by peer: ``counts[j]`` rows of ``send``
        (int64 or float32, any row shape) go to rank ``j``.

        Args:
            recv_counts: int64[size], rows each rank sends here, when the caller knows them;
                otherwise the counts are exchanged first (``Alltoall``).

        Returns:
            ``(recv_counts, received)``: int64[size] rows from each rank, and the rows grouped
            by source rank, with ``send``'s dtype and row shape.
        """
        MPI = _mpi()
        counts = np.ascontiguousarray(counts, dtype=np.int64)
        send = np.ascontiguousarray(send)
        width = int(np.prod(send.shape[1:], dtype=np.int64))
        with self.watched("all-to-all"):
            if recv_counts is None:
                recv_counts = np.empty_like(counts)
                self.comm.Alltoall(counts, recv_counts)
            else:
                recv_counts = np.ascontiguousarray(recv_counts, dtype=np.int64)
            received = np.empty((int(recv_counts.sum()), *send.shape[1:]), dtype=send.dtype)
            mpi_type = {np.dtype(np.int64): MPI.INT64_T, np.dtype(np.float32): MPI.FLOAT}[
                send.dtype
            ]
            self.comm.Alltoallv(
                [send, (counts * width, _offsets(counts) * width), mpi_type],
                [received, (recv_counts * width, _offsets(recv_counts) * width), mpi_type],
            )
        return recv_counts, received

    # -- exact evaluation --------------------------------------------------------------------
    def halo_exchange(
        self,
        send_rows: np.ndarray,
        send_ptr: np.ndarray,
        halo_owner: np.ndarray,
    ) -> np.ndarray:
        """Synchronous exchange: every rank sends its rows of ``send_list(j)`` to each peer
        ``j`` and receives the rows of its own halo vertices.

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
        counts = self.comm.gather(int(ids.size), root=0)
        if self.rank != 0:
            for start, stop in _chunks(ids.size, row_bytes, chunk_bytes):
                self.comm.Send(ids[start:stop], dest=0, tag=0)
                self.comm.Send(rows[start:stop], dest=0, tag=1)
            return
        assert sink is not None
        _sink_in_chunks(ids, rows, sink, chunk_bytes)
        for source in range(1, self.size):
            for start, stop in _chunks(counts[source], row_bytes, chunk_bytes):
                chunk_ids = np.empty(stop - start, dtype=np.int64)
                chunk_rows = np.empty((stop - start, *rows.shape[1:]), dtype=rows.dtype)
                self.comm.Recv(chunk_ids, source=source, tag=0)
                self.comm.Recv(chunk_rows, source=source, tag=1)
                sink(chunk_ids, chunk_rows)


class SingleProcess:
    """The ranks of a run started without MPI: one rank, and every collective of
    :class:`Communicator` is the identity (nothing to reduce, gather or wait for)."""

    rank = 0
    size = 1

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

    def allreduce_gradients(self, model: torch.nn.Module) -> None:
        pass

    def gather_rows(
        self,
        ids: np.ndarray,
        rows: np.ndarray,
        sink: RowSink | None,
        chunk_bytes: int = GATHER_CHUNK_BYTES,
    ) -> None:
        """:meth:`Communicator.gather_rows` of one rank: its own rows, chunk by chunk."""
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
            their bytes (:func:`~distmb.units.row_message_bytes`).
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

    def start(self, counts: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> None:
        """Send ``ids[k]`` (int64 VID_o) and ``rows[k]`` (float32[dim]) grouped by peer:
        the first ``counts[0]`` entries go to rank 0, the next ``counts[1]`` to rank 1, ..."""
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
