"""The gradient all-reduce's pieces: packing every gradient into one flat buffer, the
all-reduce in buckets that overlap the backward pass (``--comm torch``), and its counters.

:meth:`distmb.comm.group.RankGroup.allreduce_gradients` uses them; this module knows no
group, only a ``torch.distributed`` process group handle.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from distmb.core.units import FLOAT32_BYTES

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


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


def pack_gradients(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
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


def unpack_gradients(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Inverse of :func:`pack_gradients`: the slices of ``flat`` become the gradients (a
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
        watched: the rank group's watchdog context for the final wait.

    Raises:
        RuntimeError: a gradient accumulated into a parameter after its bucket started
            (more than one backward pass per step).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        bucket_bytes: int,
        world: int,
        group: ProcessGroup,
        watched: Callable[[str], AbstractContextManager[None]],
    ) -> None:
        self.model = model
        self.world = world
        self.group: ProcessGroup | None = group
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
