"""The transports of the Asynchronous Embedding Push: a non-blocking all-to-all-v of
(``VID_o``, embedding row) messages per layer, ``delay`` messages deep.

One contract (:class:`EmbeddingTransport`), two implementations:

- :class:`MpiEmbeddingTransport`: ``Ialltoallv`` on reused host buffers (``--comm mpi``).
- :class:`TorchEmbeddingTransport`: asynchronous ``all_to_all_single`` on tensors on the
  group's device (``--comm torch``, and always under torchrun; NCCL keeps GPU rows on the
  GPU).

:func:`make_push` picks the one the group's bulk operations use.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from distmb.comm import MpiGroup, RankGroup, exchange_counts
from distmb.comm.group import peer_offsets
from distmb.core.host_reads import to_host
from distmb.core.units import row_message_bytes

#: Growth factor of reusable communication buffers when a message does not fit.
BUFFER_GROWTH = 1.5


@dataclass
class PushStats:
    """Traffic and waiting of one layer's pushes since the last reset.

    Attributes:
        rows_sent, bytes_sent: (``VID_o``, row) messages this rank sent to its peers and
            their bytes (:func:`~distmb.core.units.row_message_bytes`).
        rows_received, bytes_received: the same for the messages that arrived here
            (counted when an exchange finishes).
        wait_s: wall seconds waiting for exchanges to finish.
        mpi_s, mpi_cpu_s: wall and calling-thread CPU seconds inside every library call of
            the pushes (the blocking count exchange, posting the exchange, the wait): what
            the pushes cost the training thread, to be told apart from the compute of the
            phase that runs them (an MPI library that polls while it waits spends CPU there).
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
        """Add the wall and thread-CPU seconds of the enclosed library calls to ``mpi_s``
        and ``mpi_cpu_s``."""
        start, cpu_start = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.mpi_s += time.perf_counter() - start
            self.mpi_cpu_s += time.thread_time() - cpu_start


@dataclass
class Exchange:
    """One posted exchange: ``wait()`` completes it, after which ``ids`` (int64[n]) and
    ``rows`` (float32[n, dim]) hold what arrived, grouped by source rank. ``keep_alive``
    holds what the library reads until then (the send tensors)."""

    wait: Callable[[], None]
    ids: np.ndarray | torch.Tensor
    rows: np.ndarray | torch.Tensor
    keep_alive: tuple[Any, ...] = ()


class EmbeddingTransport(ABC):
    """The embedding push of one layer: :meth:`start` sends rows grouped by peer without
    waiting, :meth:`finish` returns what arrived for the oldest exchange still in flight.

    A push started at step ``k`` is finished at step ``k + delay`` (the caller keeps
    ``delay`` exchanges in flight). Every rank starts and finishes the same number of
    exchanges in the same order (they are collectives).

    Args:
        comm: the ranks.
        dim: the width of the rows (float32[dim] each).
        delay: exchanges in flight before the oldest is finished (``--hec-delay``).
    """

    def __init__(self, comm: RankGroup, dim: int, delay: int) -> None:
        self.comm = comm
        self.dim = dim
        self.delay = delay
        self.stats = PushStats()
        self._inflight: deque[Exchange] = deque()

    def __len__(self) -> int:
        """Exchanges started and not finished."""
        return len(self._inflight)

    def start(
        self, counts: np.ndarray, ids: np.ndarray | torch.Tensor, rows: np.ndarray | torch.Tensor
    ) -> None:
        """Send ``ids[k]`` (int64 ``VID_o``) and ``rows[k]`` (float32[dim]) grouped by peer:
        the first ``counts[0]`` entries go to rank 0, the next ``counts[1]`` to rank 1, ...
        (both may be numpy or tensors on any device).

        Args:
            counts: int64[P], entries to each rank.
            ids: int64[n], ``n = counts.sum()``.
            rows: float32[n, dim] (or flat float32[n * dim]).
        """
        counts = np.ascontiguousarray(counts, dtype=np.int64)
        with self.comm.watched("embedding push (counts)"), self.stats.in_mpi():
            recv_counts = self._exchange_counts(counts)
        self._inflight.append(self._post(counts, recv_counts, ids, rows))
        n_send = int(counts.sum())
        self.stats.rows_sent += n_send
        self.stats.bytes_sent += n_send * row_message_bytes(self.dim)

    def finish(self) -> tuple[Any, Any]:
        """Wait for the oldest exchange; returns what arrived: ``(ids, rows)``, int64[n] and
        float32[n, dim], grouped by source rank (numpy or tensors: see the subclass)."""
        exchange = self._inflight.popleft()
        start = time.perf_counter()
        with self.comm.watched("embedding push (wait)"), self.stats.in_mpi():
            exchange.wait()
        self.stats.wait_s += time.perf_counter() - start
        n_recv = int(exchange.ids.shape[0])
        self.stats.rows_received += n_recv
        self.stats.bytes_received += n_recv * row_message_bytes(self.dim)
        return exchange.ids, exchange.rows

    @abstractmethod
    def _exchange_counts(self, counts: np.ndarray) -> np.ndarray:
        """The blocking exchange of per-peer counts: int64[P] sent, int64[P] received."""

    @abstractmethod
    def _post(
        self,
        counts: np.ndarray,
        recv_counts: np.ndarray,
        ids: np.ndarray | torch.Tensor,
        rows: np.ndarray | torch.Tensor,
    ) -> Exchange:
        """Stage the messages and post the non-blocking exchange of ids and rows (the
        library calls timed by ``stats.in_mpi``)."""


@dataclass
class _Buffers:
    """Reusable send/receive storage of one in-flight MPI exchange."""

    send_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    send_rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32))
    recv_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    recv_rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32))


def _fit(buf: np.ndarray, n: int) -> np.ndarray:
    """``buf`` if it holds ``n`` elements, else a larger replacement (grown geometrically)."""
    if buf.shape[0] >= n:
        return buf
    return np.empty(max(n, int(buf.shape[0] * BUFFER_GROWTH)), dtype=buf.dtype)


class MpiEmbeddingTransport(EmbeddingTransport):
    """The push over MPI: the counts by a small blocking ``Alltoall``, then one
    ``Ialltoallv`` for the ids and one for the rows, on host buffers (tensors on a device
    are copied to the host first).

    ``delay + 1`` buffer sets are reused round-robin (made when first needed: pushes start
    only in epochs longer than ``delay``, so a huge ``--hec-delay`` allocates nothing), so
    steady-state iterations allocate nothing. :meth:`finish` returns numpy views into a
    buffer set, valid until it is reused, ``delay + 1`` pushes later.
    """

    def __init__(self, comm: MpiGroup, dim: int, delay: int) -> None:
        super().__init__(comm, dim, delay)
        self.comm: MpiGroup = comm
        self._pool: list[_Buffers] = []
        self._next = 0

    def _exchange_counts(self, counts: np.ndarray) -> np.ndarray:
        recv_counts = np.empty(self.comm.size, dtype=np.int64)
        self.comm.comm.Alltoall(counts, recv_counts)
        return recv_counts

    def _post(
        self,
        counts: np.ndarray,
        recv_counts: np.ndarray,
        ids: np.ndarray | torch.Tensor,
        rows: np.ndarray | torch.Tensor,
    ) -> Exchange:
        from mpi4py import MPI

        dim = self.dim
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
            rows = to_host(rows.detach()).numpy()
        if isinstance(ids, torch.Tensor):
            ids = to_host(ids).numpy()
        buf.send_ids[:n_send] = ids
        buf.send_rows[: n_send * dim] = np.asarray(rows, dtype=np.float32).reshape(-1)
        sdisp, rdisp = peer_offsets(counts), peer_offsets(recv_counts)
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
        return Exchange(
            wait=lambda: MPI.Request.Waitall(requests),
            ids=buf.recv_ids[:n_recv],
            rows=buf.recv_rows[: n_recv * dim].reshape(n_recv, dim),
        )


class TorchEmbeddingTransport(EmbeddingTransport):
    """The push over ``torch.distributed`` (``--comm torch``): the same messages, counts and
    queue as :class:`MpiEmbeddingTransport`, with the ids and rows as tensors on the group's
    device (NCCL: device memory end to end; gloo: host tensors).

    The counts go by a blocking ``all_to_all_single`` of int64[P] (read on the host: they
    size the receive tensors), the ids and rows by two asynchronous ``all_to_all_single``
    with splits; :meth:`finish` waits (``Work.wait``: on a GPU this orders the current
    stream after the transfer, no host synchronisation) and returns new tensors on the
    group's device.
    """

    def __init__(self, comm: RankGroup, dim: int, delay: int) -> None:
        super().__init__(comm, dim, delay)
        self.device = comm.torch_device

    def _exchange_counts(self, counts: np.ndarray) -> np.ndarray:
        return exchange_counts(self.comm.torch_group, self.device, counts)

    def _post(
        self,
        counts: np.ndarray,
        recv_counts: np.ndarray,
        ids: np.ndarray | torch.Tensor,
        rows: np.ndarray | torch.Tensor,
    ) -> Exchange:
        import torch.distributed as dist

        group, device = self.comm.torch_group, self.device
        send_ids = torch.as_tensor(ids, dtype=torch.int64).to(device).contiguous()
        send_rows = (
            torch.as_tensor(rows, dtype=torch.float32).to(device).reshape(-1, self.dim).contiguous()
        )
        n_recv = int(recv_counts.sum())
        recv_ids = torch.empty(n_recv, dtype=torch.int64, device=device)
        recv_rows = torch.empty((n_recv, self.dim), dtype=torch.float32, device=device)
        splits_out, splits_in = recv_counts.tolist(), counts.tolist()
        with self.stats.in_mpi():
            works = [
                dist.all_to_all_single(
                    recv_ids, send_ids, splits_out, splits_in, group=group, async_op=True
                ),
                dist.all_to_all_single(
                    recv_rows, send_rows, splits_out, splits_in, group=group, async_op=True
                ),
            ]

        def wait() -> None:
            for work in works:
                work.wait()

        # The send tensors stay referenced until the exchange is waited for.
        return Exchange(wait, recv_ids, recv_rows, keep_alive=(send_ids, send_rows))


def make_push(comm: RankGroup, dim: int, delay: int) -> EmbeddingTransport:
    """The embedding push of one layer: over ``torch.distributed`` once the group uses it
    (``--comm torch``, and always under torchrun), else over MPI (``comm`` an
    :class:`~distmb.comm.MpiGroup`: the MPI transport calls it from its first push)."""
    if comm.torch_group is not None:
        return TorchEmbeddingTransport(comm, dim, delay)
    return MpiEmbeddingTransport(comm, dim, delay)
