"""Run under mpiexec: the HEC push over torch.distributed (``TorchEmbeddingPush``,
``all_to_all_single`` with splits, completed ``d`` pushes later) delivers the same ids and
rows as the MPI push (``EmbeddingPush``) on the same random traces, including empty
messages, and caches fed from each (the C++ one from MPI, the device one from torch) end
with the same contents; every row received is one its sender pushed.

argv: DELAY [DEVICE]  (``cuda``: NCCL between one GPU per rank, device tensors end to end)
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from distmb.comm.mpi import Communicator, EmbeddingPush, TorchEmbeddingPush
from distmb.halo.hec.device import DeviceHistoricalCache
from distmb.halo.hec.host import HistoricalEmbeddingCache

DIM, STEPS, CAPACITY, LIFESPAN = 5, 9, 40, 3
delay = int(sys.argv[1])
on_gpu = len(sys.argv) > 2 and sys.argv[2] == "cuda"
comm = Communicator()
device = torch.device("cuda", comm.local_rank()) if on_gpu else torch.device("cpu")
if on_gpu:
    torch.cuda.set_device(device)
comm.use_torch_distributed("nccl" if on_gpu else "gloo", device)
mpi_push, torch_push = EmbeddingPush(comm, DIM, delay), TorchEmbeddingPush(comm, DIM, delay)
cpp_cache = HistoricalEmbeddingCache(CAPACITY, DIM, LIFESPAN)
dev_cache = DeviceHistoricalCache(CAPACITY, DIM, LIFESPAN, device=device)
rng = np.random.default_rng(comm.rank)
sent: list[tuple[np.ndarray, np.ndarray]] = []
for step in range(STEPS):
    counts = rng.integers(0, 6, comm.size)
    counts[comm.rank] = 0
    if step == 2:
        counts[:] = 0  # nothing to send this step
    n = int(counts.sum())
    ids = rng.integers(0, 100, n).astype(np.int64) * comm.size + comm.rank  # sender in the id
    rows = rng.standard_normal((n, DIM)).astype(np.float32)
    sent.append((ids, rows))
    mpi_push.start(counts, ids, rows)
    torch_push.start(counts, torch.from_numpy(ids).to(device), torch.from_numpy(rows).to(device))
    if step >= delay:
        got_ids, got_rows = mpi_push.finish()
        t_ids, t_rows = torch_push.finish()
        assert t_ids.device == t_rows.device == device
        np.testing.assert_array_equal(t_ids.cpu().numpy(), got_ids)
        np.testing.assert_array_equal(t_rows.cpu().numpy(), got_rows)
        cpp_cache.store(got_ids.copy(), got_rows.copy())
        dev_cache.store(t_ids, t_rows)
    cpp_cache.advance()
    dev_cache.advance()
assert len(mpi_push) == len(torch_push) == delay
everyone = comm.allgather(sent)
for _ in range(delay):
    got_ids, got_rows = mpi_push.finish()
    t_ids, t_rows = torch_push.finish()
    t_ids, t_rows = t_ids.cpu(), t_rows.cpu()
    np.testing.assert_array_equal(t_ids.numpy(), got_ids)
    np.testing.assert_array_equal(t_rows.numpy(), got_rows)
# Every id that arrived was pushed by its sender (id % size) with that row.
for tag, row in zip(t_ids.numpy(), t_rows.numpy(), strict=True):
    ids, rows = zip(*everyone[int(tag) % comm.size], strict=True)
    ids, rows = np.concatenate(ids), np.concatenate(rows)
    assert any(np.array_equal(row, rows[i]) for i in np.flatnonzero(ids == tag)), tag
a, b = cpp_cache.state(), dev_cache.state()
assert a.keys() == b.keys()
for key in a:
    np.testing.assert_array_equal(a[key], b[key])
assert torch_push.stats.rows_received == mpi_push.stats.rows_received > 0
assert torch_push.stats.bytes_sent == mpi_push.stats.bytes_sent
comm.close_torch_distributed()
if comm.rank == 0:
    print(f"torch push: {comm.size} ranks, delay {delay}: all equal", flush=True)
