"""The BatchLoader: an epoch's seed order -> MiniBatches, in stages, optionally ahead.

Stages per batch: **plan** (the epoch's batches are known up front,
:class:`~distmb.pipeline.plan.EpochPlan`; a *superbatch* is the next K of them, in production
order), **sample** (a :class:`~distmb.pipeline.sample.protocol.BatchSampler`: the local C++ or
device sampler, or the exact baseline's sampler across ranks), **gather** (input features
through a :class:`~distmb.pipeline.features.FeatureSource`, host or device), and later **to
device**. The loader knows its stages only through those two protocols.

A batch's identity (:attr:`MiniBatch.index`, its position in the epoch's plan) fixes its
random stream; the production order is separate (:attr:`EpochPlan.order`), so a reordering
policy may permute the batches of a superbatch without changing what any batch contains.

With ``prefetch = N > 0`` a background thread samples and gathers up to N batches ahead of
the one being trained (the C++ sampler and numpy's row gathers release the GIL). Results
are bit-identical to ``prefetch = 0``: the stages use no random state of the training
thread. Stages that talk to other ranks (``uses_collectives``) always run synchronously on
the training thread, in step order.

On a CUDA device the background thread launches on its own stream
(:class:`~distmb.pipeline.streams.DeviceStage`), not on the training thread's: each batch is
handed over with a stream wait on an event and ``record_stream`` of its tensors, no host
wait. The sample and gather stages are also timed with CUDA events there
(``MiniBatch.sample_span``, ``gather_span``), beside their host clocks.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from distmb import _C
from distmb.core.host_reads import to_device, to_host
from distmb.pipeline.features.protocol import FeatureSource, take_rows
from distmb.pipeline.minibatch import MiniBatch
from distmb.pipeline.plan import EpochPlan
from distmb.pipeline.rows import IndexedRows
from distmb.pipeline.sample.blocks import Block
from distmb.pipeline.sample.protocol import BatchSampler
from distmb.pipeline.streams import DeviceStage, EventClock

#: Default number of batches prepared ahead by the background thread (``--prefetch``).
DEFAULT_PREFETCH = 2

#: Growth factor of a recycled gather buffer over the request that allocated it.
BUFFER_GROWTH = 1.25

#: Seconds the producer waits on a full window before checking whether it was stopped.
_POLL_S = 0.1

#: ``reorder(epoch, indices, batches) -> indices permuted``: production order of the batches
#: ``indices`` (one superbatch; ``batches[i]`` are batch ``i``'s seeds).
Reorder = Callable[[int, list[int], Sequence[np.ndarray]], list[int]]


class BatchLoader:
    """Turns an epoch's batches into :class:`MiniBatch` objects (see the module docstring).

    Args:
        sampler: the sample stage.
        features: the gather stage's feature source; ids are ``blocks[0].src_ids``. When it
            can serve halo ids (:attr:`~distmb.pipeline.features.FeatureSource.has_halo`),
            block 0's halo rows are gathered too (``MiniBatch.x_halo``).
        labels: int64[n] labels by seed id.
        prefetch: batches prepared ahead on a background thread (0: synchronous).
        superbatch: K, batches per superbatch (the unit a reorder policy permutes).
        reorder: optional production-order policy applied to each superbatch.
        threads: OpenMP threads of the background thread's kernels (``None``: this thread's).
        device: the **to device** stage: where batches are delivered (``None``: where the
            sampler made them, CPU for the C++ sampler). A device source
            (:class:`~distmb.pipeline.features.device.DeviceFeatures`) gathers straight onto its
            device; rows gathered on the host are copied there (synchronously, on the thread
            that made the batch, so a recycled host buffer is never refilled while a copy
            reads it).
        in_place: hand block 0's input rows over as :class:`~distmb.pipeline.rows.IndexedRows`
            whose ``head`` holds the gathered destination rows, the others read in place,
            when the source holds them in memory
            (:meth:`~distmb.pipeline.features.FeatureSource.rows_in_place`), the batch stays on the
            host and block 0 has no halo leaves; the consumer's first layer should read them
            (:attr:`~distmb.nn.models.BlockModel.reads_input_in_place`; other consumers call
            ``materialize()``). Otherwise all rows are gathered.
        reuse_buffers: gather into recycled buffers (no page faults for a fresh tensor, no
            unmapping when it is freed). The consumer must then hold one batch at a time: a
            batch's ``x`` is valid until the next batch is requested (then the batch's ``x``
            becomes None and its buffer may be refilled at once). The trainer does; code that
            keeps batches (``list(loader(plan))``) must not set it.
    """

    def __init__(
        self,
        sampler: BatchSampler,
        features: FeatureSource,
        labels: np.ndarray,
        *,
        prefetch: int = DEFAULT_PREFETCH,
        superbatch: int = 1,
        reorder: Reorder | None = None,
        threads: int | None = None,
        reuse_buffers: bool = False,
        device: torch.device | str | None = None,
        in_place: bool = False,
    ) -> None:
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        if superbatch < 1:
            raise ValueError(f"superbatch must be >= 1, got {superbatch}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.sampler = sampler
        self.features = features
        self.labels = labels
        self.prefetch = prefetch
        self.superbatch = superbatch
        self.reorder = reorder
        self.threads = threads if threads is not None else int(_C.get_num_threads())
        self.device = torch.device(device) if device is not None else None
        self.reuse_buffers = reuse_buffers
        # In-place rows are host rows: the batch must stay on the host, from a host source.
        self.in_place = (
            in_place
            and (self.device is None or self.device.type == "cpu")
            and features.device.type == "cpu"
        )
        stage_device = self.device if self.device is not None else features.device
        #: The sample and gather stages' CUDA events (a no-op off CUDA).
        self._clock = EventClock(stage_device)
        #: The producer thread's own CUDA stream and the hand-over (a no-op off CUDA).
        self.device_stage = DeviceStage(stage_device)
        self._free: list[torch.Tensor] = []  # flat float32 buffers ready for reuse
        self._free_lock = threading.Lock()
        #: Buffers allocated by the gather stage so far (reuse keeps this at most prefetch + 2).
        self.buffers_allocated = 0
        #: Seconds the consumer waited for its next batch, since the last reset.
        self.load_wait = 0.0

    @property
    def synchronous(self) -> bool:
        """Whether batches are made on the consumer's thread (no prefetch, or a stage that
        uses collectives)."""
        return self.prefetch == 0 or self.sampler.uses_collectives or self.features.uses_collectives

    # -- plan ----------------------------------------------------------------------------------
    def plan(self, epoch: int, batches: list[np.ndarray]) -> EpochPlan:
        """The epoch's plan: batch ``i`` is ``batches[i]``; production order by superbatch,
        each permuted by the reorder policy if there is one."""
        order: list[int] = []
        for start in range(0, len(batches), self.superbatch):
            indices = list(range(start, min(start + self.superbatch, len(batches))))
            if self.reorder is not None:
                permuted = [int(i) for i in self.reorder(epoch, indices, batches)]
                if sorted(permuted) != indices:
                    raise ValueError(
                        f"reorder policy returned {permuted}, not a permutation of {indices}"
                    )
                indices = permuted
            order.extend(indices)
        return EpochPlan(epoch, batches, order, self.superbatch)

    # -- sample + gather -------------------------------------------------------------------------
    @property
    def inspects(self) -> bool:
        """Whether the feature source plans a superbatch's gathers ahead (``belady``): then a
        whole superbatch is sampled before its first batch is gathered."""
        return self.features.wants_trace

    def gather_ids(self, blocks: list[Block]) -> torch.Tensor:
        """int64[n]: the ids the gather stage reads for a batch with these blocks: block 0's
        computed sources, and its halo leaves too when the source holds their rows."""
        first = blocks[0]
        return first.src_ids if self.features.has_halo else first.src_ids[: first.n_computed]

    def sample_batch(self, epoch: int, index: int, seeds: np.ndarray) -> MiniBatch:
        """The sample stage of batch ``index`` of ``epoch`` (any thread): blocks and labels,
        no features yet."""
        start, cpu_start = time.perf_counter(), time.thread_time()
        mark = self._clock.mark()
        blocks = self.sampler.sample(seeds, epoch, index)
        span = self._clock.span(mark)
        labels = torch.from_numpy(np.ascontiguousarray(self.labels[seeds], dtype=np.int64))
        if self.device is not None:  # on a GPU without a host synchronisation (to_device)
            labels = to_device(labels, self.device)
        return MiniBatch(
            epoch=epoch,
            index=index,
            seeds=seeds,
            blocks=blocks,
            labels=labels,
            sample_s=time.perf_counter() - start,
            sample_cpu_s=time.thread_time() - cpu_start,
            sample_span=span,
        )

    def gather_batch(self, batch: MiniBatch) -> MiniBatch:
        """The gather stage (any thread): block 0's input rows in one gather by the source
        (:meth:`~distmb.pipeline.features.FeatureSource.gather_batch_rows`: into a recycled
        host buffer, or on the source's device); ``x`` and ``x_halo`` are views of them."""
        start, cpu_start = time.perf_counter(), time.thread_time()
        mark = self._clock.mark()
        first = batch.blocks[0]
        ids = self.gather_ids(batch.blocks)
        if self.in_place and not first.n_halo:
            in_place = self.features.rows_in_place(ids)
            if in_place is not None:
                # The destinations' own rows are gathered (read in order by the UPDATE, in
                # its forward and backward); the neighbours' stay in place.
                n_dst, dim = first.n_dst, self.features.dim
                buffer = self._take_buffer(n_dst * dim)
                head = buffer[: n_dst * dim].view(n_dst, dim)
                # (take_rows widens a two-byte table's rows to float32.)
                take_rows(in_place.table, in_place.ids[:n_dst].numpy(), head)
                batch.x = IndexedRows(in_place.table, in_place.ids, head)
                batch.x_halo = None
                batch.buffer = buffer if self.reuse_buffers else None
                return self._to_device(batch, start, cpu_start, mark)
        rows, buffer = self.features.gather_batch_rows(ids, self._take_buffer)
        batch.x = rows[: first.n_computed]
        has_halo_rows = self.features.has_halo and first.n_halo
        batch.x_halo = rows[first.n_computed :] if has_halo_rows else None
        batch.buffer = buffer if self.reuse_buffers else None
        return self._to_device(batch, start, cpu_start, mark)

    def _to_device(
        self,
        batch: MiniBatch,
        start: float,
        cpu_start: float,
        mark: torch.cuda.Event | None,
    ) -> MiniBatch:
        """The to-device stage (timed with the gather, from ``start``, ``cpu_start`` and the
        event ``mark``): the batch on :attr:`device`."""
        if self.device is not None:
            on_host = batch.x is not None and batch.x.device.type == "cpu"
            batch.to(self.device)
            if on_host and batch.x is not None and batch.x.device.type != "cpu":
                self._recycle(batch, keep_rows=True)  # the device holds copies now
        batch.gather_s = time.perf_counter() - start
        batch.gather_cpu_s = time.thread_time() - cpu_start
        batch.gather_span = self._clock.span(mark)
        return batch

    def make_batch(self, epoch: int, index: int, seeds: np.ndarray) -> MiniBatch:
        """Sample and gather batch ``index`` of ``epoch`` (any thread)."""
        return self.gather_batch(self.sample_batch(epoch, index, seeds))

    def produce(self, plan: EpochPlan) -> Iterator[MiniBatch]:
        """The plan's batches in production order, made on the calling thread. With an
        inspecting source, each superbatch is sampled first, its gathers handed to the
        inspector (``features.inspect``; its time is the source's ``inspect_time``), then
        gathered batch by batch."""
        for indices in plan.superbatches():
            if not self.inspects:
                for index in indices:
                    yield self.make_batch(plan.epoch, index, plan.batches[index])
                continue
            sampled = [self.sample_batch(plan.epoch, i, plan.batches[i]) for i in indices]
            self.features.inspect([to_host(self.gather_ids(b.blocks)).numpy() for b in sampled])
            for batch in sampled:
                yield self.gather_batch(batch)

    # -- gather buffers ----------------------------------------------------------------------------
    def _take_buffer(self, numel: int) -> torch.Tensor:
        """A flat float32 buffer of at least ``numel`` elements: a recycled one when it is
        large enough, else a new one (grown by :data:`BUFFER_GROWTH` over the request, so a
        few batches settle the pool's sizes)."""
        with self._free_lock:
            for i, buf in enumerate(self._free):
                if buf.numel() >= numel:
                    return self._free.pop(i)
            if self._free:
                self._free.pop()  # too small for this batch: let it go
        self.buffers_allocated += 1
        size = numel if not self.reuse_buffers else int(numel * BUFFER_GROWTH)
        return torch.empty(max(size, 1), dtype=torch.float32)

    def _recycle(self, batch: MiniBatch | None, keep_rows: bool = False) -> None:
        """Give ``batch``'s gather buffer back (the consumer has moved on, or, with
        ``keep_rows``, the batch's rows are device copies that do not alias it)."""
        if batch is not None and batch.buffer is not None:
            with self._free_lock:
                self._free.append(batch.buffer)
            batch.buffer = None
            if not keep_rows:
                batch.x = None  # a consumer that kept the batch fails loudly, never reads new rows
                batch.x_halo = None

    # -- the epoch -------------------------------------------------------------------------------
    def __call__(self, plan: EpochPlan) -> Iterator[MiniBatch]:
        """The plan's MiniBatches in production order. Time spent waiting for each batch is
        added to :attr:`load_wait`. Closing the iterator early stops the producer."""
        if self.synchronous:
            return self._synchronous(plan)
        return self._prefetched(plan)

    def _synchronous(self, plan: EpochPlan) -> Iterator[MiniBatch]:
        batch: MiniBatch | None = None
        made = self.produce(plan)
        try:
            for _ in plan.order:
                start = time.perf_counter()
                self._recycle(batch)
                batch = next(made)
                self.load_wait += time.perf_counter() - start
                yield batch
        finally:
            made.close()
            self._recycle(batch)

    def _prefetched(self, plan: EpochPlan) -> Iterator[MiniBatch]:
        # A made batch travels with the event its device work completes at (None off CUDA).
        ready: deque[tuple[MiniBatch, torch.cuda.Event | None] | BaseException] = deque()
        available = threading.Condition()
        window = threading.Semaphore(self.prefetch)  # batches made but not yet consumed
        stop = threading.Event()
        stage = self.device_stage
        stage.begin()  # the producer's stream sees what this thread's stream wrote so far

        def produce() -> None:
            try:
                # OpenMP settings are per thread, and PyTorch sets this thread's on its first
                # call: let it do so first, then set the kernels' count.
                torch.get_num_threads()
                _C.set_num_threads(self.threads)
                with stage.producing():
                    made = self.produce(plan)
                    for _ in plan.order:
                        while not window.acquire(timeout=_POLL_S):
                            if stop.is_set():
                                return
                        if stop.is_set():
                            return
                        item = (next(made), stage.made())
                        with available:
                            ready.append(item)
                            available.notify()
            except BaseException as exc:  # noqa: BLE001 - re-raised on the consumer's thread
                with available:
                    ready.append(exc)
                    available.notify()

        producer = threading.Thread(target=produce, name="distmb-batch-loader", daemon=True)
        producer.start()
        batch: MiniBatch | None = None
        try:
            for _ in plan.order:
                start = time.perf_counter()
                self._recycle(batch)  # before the window opens for one more batch
                batch = None
                with available:
                    while not ready:
                        if not available.wait(timeout=_POLL_S) and not producer.is_alive():
                            if ready:
                                break
                            raise RuntimeError("the batch loader's producer thread died")
                    item = ready.popleft()
                self.load_wait += time.perf_counter() - start
                if isinstance(item, BaseException):
                    raise item
                batch, made = item
                stage.hand_over(made, batch.tensors())  # no host wait
                window.release()
                yield batch
        finally:
            stop.set()
            producer.join()
            for leftover in (batch, *ready):
                if isinstance(leftover, tuple):
                    leftover = leftover[0]
                if isinstance(leftover, MiniBatch):
                    self._recycle(leftover)
