"""Run under mpiexec: with ls large, cs >= all halos, nc >= all candidates and d = 1, every
halo row a rank loads at iteration k equals the row its owner pushed most recently before
k (the owner's computed layer input at k-1 or earlier); a halo never pushed misses.

The pushed rows are not taken on trust from the push's own recording: every layer input the
model computes is captured independently (by wrapping the scheme's per-layer hook), and each
pushed row must equal the sender's captured input row of that vertex at that step and layer;
the set pushed to each peer must be exactly the step's computed sources that the peer holds
as halo (from the partition's send lists).

argv: PART_DIR EPOCHS
"""

from __future__ import annotations

import sys

import numpy as np

from distmb.comm import MpiGroup
from distmb.config.train import TrainConfig
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.build import make_halo_scheme
from distmb.engine.build.data import open_part

part_dir, epochs = sys.argv[1], int(sys.argv[2])
comm = MpiGroup()
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
orig_ids = np.asarray(store.orig_ids)
#: (epoch, step, layer) -> {VID_o: this rank's computed input row of that vertex}
inputs: dict[tuple[int, int, int], dict[int, np.ndarray]] = {}
hook = halo.layer_input


def capture(batch, layer, h, step, num_steps):
    block = batch.blocks[layer]
    tags = orig_ids[block.src_ids[: block.n_computed].numpy()]
    rows = h.detach().numpy().copy()
    inputs[(halo.epoch, step, layer)] = {int(v): rows[i] for i, v in enumerate(tags)}
    return hook(batch, layer, h, step, num_steps)


halo.layer_input = capture
sends = {j: set(orig_ids[np.asarray(store.send_list(j))].tolist()) for j in range(comm.size)}


def record(kind, k, layer, tags, rows, extra):
    events.append((kind, trainer.halo.epoch, k, layer, tags, rows, extra))


trainer.halo.record = record
trainer.fit()
everything = comm.allgather(events)
all_inputs = comm.allgather(inputs)
all_sends = comm.allgather(sends)
iters = comm.allgather(len(trainer.epoch_batches(0)))
if comm.rank == 0:
    num_iters = iters[0]
    latest: dict[tuple[int, int, int], list[tuple[int, np.ndarray]]] = {}
    pushes_checked = 0
    for sender, evs in enumerate(everything):
        for kind, epoch, k, layer, tags, rows, counts in evs:
            if kind != "push":
                continue
            g = epoch * num_iters + k
            dest = np.repeat(np.arange(comm.size), counts)
            computed = all_inputs[sender][(epoch, k, layer)]
            for d in range(comm.size):
                want = set(computed) & all_sends[sender][d] if d != sender else set()
                got = {int(v) for v, to in zip(tags, dest, strict=True) if to == d}
                assert got == want, (sender, d, epoch, k, layer, len(got), len(want))
            for tag, row, d in zip(tags, rows, dest, strict=True):
                assert np.array_equal(row, computed[int(tag)]), (sender, int(tag), g, layer)
                pushes_checked += 1
                latest.setdefault((int(d), layer, int(tag)), []).append((g, row))
    assert pushes_checked > 0
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
