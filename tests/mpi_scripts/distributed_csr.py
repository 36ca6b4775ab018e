"""Run under mpiexec: distributed_csr gives every rank its rows of the symmetric graph of all
ranks' edge slices; rank 0 gathers the rows and compares them with a brute-force CSR.

argv: NUM_NODES NUM_EDGES
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from distmb.partition.collective import vertex_ranges
from distmb.partition.distributed import distributed_csr, edge_slice

comm = MPI.COMM_WORLD
n, m = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
src[:10], dst[:10] = dst[10:20], src[10:20]  # reciprocal edges
dst[20:25] = src[20:25]  # self-loops
vtxdist = vertex_ranges(n, comm.size)
xadj, adjncy = distributed_csr(comm, *edge_slice(src, dst, comm.rank, comm.size), vtxdist)
rows = comm.gather([xadj, adjncy])
if comm.rank == 0:
    pairs = {(int(u), int(v)) for u, v in zip(src, dst, strict=True) if u != v}
    pairs |= {(v, u) for u, v in pairs}
    for r, (x, a) in enumerate(rows):
        for i in range(x.size - 1):
            v = int(vtxdist[r]) + i
            expected = sorted(u for u, w in pairs if w == v)
            got = a[x[i] : x[i + 1]].tolist()
            assert got == expected, (v, got, expected)
    assert sum(int(x[-1]) for x, _ in rows) == len(pairs)
    print("ok", len(pairs))
