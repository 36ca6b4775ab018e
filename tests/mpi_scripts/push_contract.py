"""The embedding-push contract (:class:`~distmb.halo.hec.transport.EmbeddingTransport`), one
set of checks run against both transports: the rows pushed at step ``k`` arrive at step
``k + delay`` at the peers they were sent to, with the ids and rows that were sent, grouped
by source rank, and the statistics count them. Every rank computes what each peer sent it
from the peers' known messages (a function of source, destination and step), including empty
messages, a step where nobody sends, and one large enough to grow the reused buffers.

``mpi``: :class:`~distmb.halo.hec.transport.MpiEmbeddingTransport` over
:class:`~distmb.comm.MpiGroup`; ``torch``:
:class:`~distmb.halo.hec.transport.TorchEmbeddingTransport` over the group's
``torch.distributed`` group (gloo on the CPU; with DEVICE ``cuda`` NCCL between one GPU per
rank, device tensors end to end). Both are built by :func:`~distmb.halo.hec.transport.make_push`.
Rank 0 prints ``push contract holds: IMPL, delay D, on P ranks`` for each.

Under torchrun (no MPI) the group is a :class:`~distmb.comm.TorchGroup` and ``torch`` the only
IMPL (``tests/test_nccl.py`` runs it with DEVICE ``cuda``, NCCL at world size 1).

argv: DEVICE (cpu | cuda) IMPL [IMPL ...]
"""

from __future__ import annotations

import sys
import traceback

import numpy as np
import torch

from distmb.comm import MpiGroup, TorchGroup
from distmb.comm.mpienv import is_torchrun_launch
from distmb.core.units import row_message_bytes
from distmb.halo.hec.transport import (
    EmbeddingTransport,
    MpiEmbeddingTransport,
    TorchEmbeddingTransport,
    make_push,
)

DIM, STEPS = 5, 9
#: The queue depths checked (``--hec-delay``).
DELAYS = (1, 2)
#: A step where no rank sends anything, and one where every rank sends many rows.
EMPTY_STEP, LARGE_STEP = 2, 6


def count(src: int, dst: int, step: int) -> int:
    """Rows ``src`` pushes to ``dst`` at ``step``: uneven, zero for some pairs."""
    if step == EMPTY_STEP:
        return 0
    if step == LARGE_STEP:
        return 40 + src + dst
    return (src + 2 * dst + 3 * step) % 4


def ids_from(src: int, dst: int, step: int) -> np.ndarray:
    """int64 ids of those rows (unique per source, destination and step)."""
    base = (step * 100 + src * 10 + dst) * 1000
    return base + np.arange(count(src, dst, step), dtype=np.int64)


def rows_of(ids: np.ndarray) -> np.ndarray:
    """float32[n, DIM] rows, a function of the ids."""
    return (ids[:, None] % 9973 + np.arange(DIM) / 4).astype(np.float32)


def sent_by(rank: int, size: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """``rank``'s counts (int64[P]) and ids (grouped by destination) at ``step``."""
    counts = np.array([count(rank, d, step) for d in range(size)], dtype=np.int64)
    return counts, np.concatenate([ids_from(rank, d, step) for d in range(size)])


def received_by(rank: int, size: int, step: int) -> np.ndarray:
    """The ids ``rank`` receives from the pushes of ``step``, grouped by source rank."""
    return np.concatenate([ids_from(s, rank, step) for s in range(size)])


def as_host(array) -> np.ndarray:
    return array.cpu().numpy() if isinstance(array, torch.Tensor) else np.asarray(array)


def check_push(push: EmbeddingTransport, rank: int, size: int, device: torch.device) -> None:
    delay = push.delay
    tensors = isinstance(push, TorchEmbeddingTransport)
    rows_sent = rows_received = 0

    def check_finish(step: int) -> None:
        nonlocal rows_received
        ids, rows = push.finish()
        if tensors:
            assert ids.device == rows.device == device, (ids.device, rows.device)
        else:
            assert isinstance(ids, np.ndarray) and isinstance(rows, np.ndarray)
        want = received_by(rank, size, step)
        assert ids.dtype in (np.int64, torch.int64) and rows.dtype in (np.float32, torch.float32)
        assert tuple(rows.shape) == (want.size, DIM), (rows.shape, want.size)
        np.testing.assert_array_equal(as_host(ids), want)
        np.testing.assert_array_equal(as_host(rows), rows_of(want))
        rows_received += want.size

    for step in range(STEPS):
        if step >= delay:
            check_finish(step - delay)
        counts, ids = sent_by(rank, size, step)
        rows = rows_of(ids)
        if step % 2:  # tensors on the device as well as numpy arrays go in
            ids, rows = torch.from_numpy(ids).to(device), torch.from_numpy(rows).to(device)
        push.start(counts, ids, rows)
        rows_sent += int(counts.sum())
        assert len(push) == min(step + 1, delay), (step, len(push))
    for step in range(STEPS - delay, STEPS):
        check_finish(step)
    assert len(push) == 0

    stats = push.stats
    assert stats.rows_sent == rows_sent and stats.rows_received == rows_received > 0
    assert stats.bytes_sent == rows_sent * row_message_bytes(DIM)
    assert stats.bytes_received == rows_received * row_message_bytes(DIM)
    assert stats.mpi_s > 0 and stats.wait_s >= 0 and stats.mpi_cpu_s >= 0
    stats.reset()
    assert stats.rows_sent == stats.bytes_received == 0 and stats.mpi_s == 0.0


def main(device_name: str, impls: list[str]) -> None:
    torchrun = is_torchrun_launch()
    if torchrun and impls != ["torch"]:
        raise SystemExit("under torchrun (no MPI) the only IMPL is torch")
    group = TorchGroup() if torchrun else MpiGroup()
    device = torch.device("cpu")
    if device_name == "cuda":
        device = torch.device("cuda", group.local_rank())
        torch.cuda.set_device(device)
    for impl in impls:
        try:
            if impl == "torch":
                group.use_torch_distributed("nccl" if device.type == "cuda" else "gloo", device)
            for delay in DELAYS:
                push = make_push(group, DIM, delay)
                kind = TorchEmbeddingTransport if impl == "torch" else MpiEmbeddingTransport
                assert type(push) is kind, type(push)
                check_push(push, group.rank, group.size, device)
                if group.rank == 0:
                    print(
                        f"push contract holds: {impl}, delay {delay}, on {group.size} ranks",
                        flush=True,
                    )
            group.close_torch_distributed()
        except BaseException:  # a failed check must end the job, not leave the peers waiting
            print(f"rank {group.rank}: {impl} failed", file=sys.stderr, flush=True)
            traceback.print_exc()
            group.abort(1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
