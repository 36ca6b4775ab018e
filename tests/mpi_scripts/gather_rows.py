"""Run under mpiexec or torchrun: RankGroup.gather_rows hands rank 0 every rank's rows, in
chunks of at most ``chunk_bytes``, each with its ids; reassembled by id they equal the whole
table.

argv: CHUNK_BYTES
"""

from __future__ import annotations

import sys

import numpy as np

from distmb.comm.mpi import launch_communicator

chunk_bytes = int(sys.argv[1])
comm = launch_communicator()
n, width = 1000, 3
table = np.random.default_rng(0).standard_normal((n, width)).astype(np.float32)
owner = np.random.default_rng(1).integers(0, comm.size, n)  # uneven shares, some maybe empty
ids = np.flatnonzero(owner == comm.rank)[::-1].copy()  # any order
chunks: list[tuple[np.ndarray, np.ndarray]] = []


def sink(chunk_ids: np.ndarray, rows: np.ndarray) -> None:
    chunks.append((chunk_ids.copy(), rows.copy()))


comm.gather_rows(ids, table[ids], sink if comm.rank == 0 else None, chunk_bytes=chunk_bytes)
if comm.rank == 0:
    rows_per_chunk = max(1, chunk_bytes // (width * 4))
    assert all(len(i) == len(r) <= rows_per_chunk for i, r in chunks)
    got = np.full((n, width), np.nan, dtype=np.float32)
    seen = np.zeros(n, dtype=int)
    for chunk_ids, rows in chunks:
        got[chunk_ids] = rows
        np.add.at(seen, chunk_ids, 1)
    assert (seen == 1).all()
    np.testing.assert_array_equal(got, table)
    print(f"gathered {n} rows in {len(chunks)} chunks", flush=True)
else:
    assert not chunks
comm.close_torch_distributed()
