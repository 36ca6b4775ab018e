"""CUDA streams and events of the data path, and nothing on other devices.

- :class:`EventClock` times stretches of device work with CUDA timing events recorded on
  the calling thread's current stream, read later (:class:`EventSpan`): no host wait per
  stretch. The phase timers (:mod:`distmb.engine.timers`) and the BatchLoader's sample and
  gather stages use it.
- :class:`DeviceStage` gives the BatchLoader's producer thread its own CUDA stream, so that
  the next batches are made while training runs on the consumer's stream, and hands each
  batch over without a host wait: the consumer's stream waits on an event recorded after the
  batch, and the batch's tensors are marked as used there (``record_stream``) so the caching
  allocator does not give their memory to the producer's stream while training reads them.

On any device but CUDA every helper is a no-op that creates no stream or event object (CPU
ops are synchronous: host clocks measure them), so the callers keep one code path.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

#: Milliseconds per second (``torch.cuda.Event.elapsed_time`` is in milliseconds).
MS_PER_S = 1000.0


def cuda_device(device: torch.device | str | None) -> torch.device | None:
    """``device`` when it is a CUDA device, else None (the CPU, or no device given)."""
    if device is None:
        return None
    device = torch.device(device)
    return device if device.type == "cuda" else None


@dataclass(frozen=True)
class EventSpan:
    """A stretch of device work between two timing events of one device.

    Attributes:
        start: recorded on a stream before the stretch's first launch.
        end: recorded on the same stream after its last launch.
    """

    start: torch.cuda.Event
    end: torch.cuda.Event

    def seconds(self) -> float:
        """Seconds of device time from ``start`` to ``end``: the stream's work between them,
        and the gaps in which it waited for the host to launch more (or for another stream
        it was made to wait on). Valid once ``end`` has completed (after a synchronize of
        the device); reading it earlier raises."""
        return self.start.elapsed_time(self.end) / MS_PER_S


class EventClock:
    """Marks points in the device's work on the calling thread's current stream.

    Args:
        device: the device whose work is timed; not a CUDA device: :attr:`enabled` is False,
            :meth:`mark` and :meth:`span` return None (time it with host clocks).
    """

    def __init__(self, device: torch.device | str | None) -> None:
        self.device = cuda_device(device)

    @property
    def enabled(self) -> bool:
        """Whether the clock records events (a CUDA device)."""
        return self.device is not None

    def mark(self) -> torch.cuda.Event | None:
        """A timing event recorded now on this thread's current stream of :attr:`device`
        (None off CUDA)."""
        if self.device is None:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def span(self, start: torch.cuda.Event | None) -> EventSpan | None:
        """The stretch from ``start`` (a :meth:`mark`) to now, on the current stream (None
        when ``start`` is None)."""
        if start is None:
            return None
        end = self.mark()
        assert end is not None  # a start was marked: the clock is enabled
        return EventSpan(start, end)


class DeviceStage:
    """The BatchLoader's producer thread on its own CUDA stream (see the module docstring).

    Call :meth:`begin` on the consumer's thread before the producer starts, run the producer
    inside :meth:`producing`, take :meth:`made` after each batch on the producer's thread,
    and :meth:`hand_over` the batch's tensors on the consumer's thread before it uses them.

    Args:
        device: the loader's device; not a CUDA device: every method is a no-op and no stream
            is created.
    """

    def __init__(self, device: torch.device | str | None) -> None:
        self.device = cuda_device(device)
        self._stream: torch.cuda.Stream | None = None

    @property
    def stream(self) -> torch.cuda.Stream | None:
        """The producer's stream, created on :attr:`device` at the first use, then kept (None
        off CUDA)."""
        if self.device is not None and self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        return self._stream

    def begin(self) -> None:
        """Consumer's thread, before the producer starts: the producer's stream waits for the
        work queued so far on the consumer's current stream (tables, caches and batches it
        wrote), without a host wait."""
        if self.device is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))

    @contextmanager
    def producing(self) -> Iterator[None]:
        """Producer's thread: within, the producer's stream is this thread's current stream,
        so everything the stages launch is queued there."""
        if self.device is None:
            yield
            return
        with torch.cuda.stream(self.stream):
            yield

    def made(self) -> torch.cuda.Event | None:
        """Producer's thread, after a batch is made: an event on the producer's stream that
        completes when the batch's device work has (None off CUDA)."""
        if self.device is None:
            return None
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def hand_over(self, made: torch.cuda.Event | None, tensors: Iterable[torch.Tensor]) -> None:
        """Consumer's thread, before the batch is used: its current stream waits on ``made``
        (:meth:`made` of the batch), and every CUDA tensor of ``tensors`` is marked as used
        on that stream, so its memory is not reused before the work queued there is done."""
        if self.device is None or made is None:
            return
        current = torch.cuda.current_stream(self.device)
        current.wait_event(made)
        for tensor in tensors:
            if tensor.is_cuda:
                tensor.record_stream(current)
