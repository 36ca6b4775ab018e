"""Run under mpiexec: with ls large, cs >= all halos, nc >= all candidates and d = 1, every
halo row a rank loads at iteration k equals the row its owner pushed most recently before
k (the owner's computed layer input at k-1 or earlier); a halo never pushed misses.

argv: PART_DIR EPOCHS
"""

from __future__ import annotations

import sys

import numpy as np

from distmb.comm import Communicator
from distmb.config import TrainConfig
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.halo import make_halo_scheme
from distmb.launch import open_part

part_dir, epochs = sys.argv[1], int(sys.argv[2])
comm = Communicator()
store = open_part(comm, part_dir)
config = TrainConfig(
    layers=3,
    fanout=(3, 3, 3),
    hidden=8,
    batch_size=16,
    epochs=epochs,
    eval_every=10**6,
    progress=False,
    dropout=0.5,
    hec_size=100_000,
    hec_nc=10**9,
    hec_lifespan=10**6,
    hec_delay=1,
)
halo = make_halo_scheme(comm, store, config)
trainer = Trainer(LocalGraph.from_store(store), config, comm=comm, halo=halo, log=lambda _: None)
events: list[tuple] = []
clock = {"epoch": 0}


def record(kind, k, layer, tags, rows, extra):
    events.append((kind, trainer.halo.epoch, k, layer, tags, rows, extra))


trainer.halo.record = record
trainer.fit()
everything = comm.allgather(events)
iters = comm.allgather(len(trainer.epoch_batches(0)))
if comm.rank == 0:
    num_iters = iters[0]
    latest: dict[tuple[int, int, int], list[tuple[int, np.ndarray]]] = {}
    for _sender, evs in enumerate(everything):
        for kind, epoch, k, layer, tags, rows, counts in evs:
            if kind != "push":
                continue
            g = epoch * num_iters + k
            dest = np.repeat(np.arange(comm.size), counts)
            for tag, row, d in zip(tags, rows, dest, strict=True):
                latest.setdefault((int(d), layer, int(tag)), []).append((g, row))
    checked = hits = 0
    for receiver, evs in enumerate(everything):
        for kind, epoch, k, layer, tags, rows, hit in evs:
            if kind != "load":
                continue
            g = epoch * num_iters + k
            for tag, row, h in zip(tags, rows, hit, strict=True):
                pushes = [
                    (gp, r) for gp, r in latest.get((receiver, layer, int(tag)), []) if gp <= g - 1
                ]
                checked += 1
                if not pushes:
                    assert not h, f"rank {receiver} hit {tag} at {g} that nobody pushed"
                    continue
                assert h, f"rank {receiver} missed {tag} at {g} (pushed at {pushes[-1][0]})"
                assert np.array_equal(row, max(pushes, key=lambda p: p[0])[1]), (receiver, tag)
                hits += 1
    assert checked > 0 and hits > 0, (checked, hits)
    print(f"AEP exact: {checked} halo loads checked, {hits} hits, all equal", flush=True)
