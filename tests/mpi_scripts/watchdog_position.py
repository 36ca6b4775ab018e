"""Run under ``mpiexec -n 2``: rank 1 tells its watchdog it is at epoch 5, iteration 3, then
waits in a barrier; rank 0 moves on through ten iterations of its own (each wakes its
watchdog, which listens) and prints where it last heard rank 1 was. All of it well within
one heartbeat period (a 20 s timeout: a heartbeat every 2 s), so only heartbeats sent on the
moves themselves can have told it."""

from __future__ import annotations

import time

from mpi4py import MPI

from distmb.comm.watchdog import CollectiveWatchdog

comm = MPI.COMM_WORLD
watchdog = CollectiveWatchdog(comm, 20.0)
watchdog.start()
comm.Barrier()
if comm.rank == 1:
    watchdog.at(5, 3)
else:
    for step in range(10):
        time.sleep(0.1)
        watchdog.at(0, step)
    print(f"rank 1 last heard {watchdog.peers[1].where()}", flush=True)
comm.Barrier()
watchdog.stop()
