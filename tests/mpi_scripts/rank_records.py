"""Run under mpiexec: every rank's ``per_rank`` / ``per_rank_time`` entry of every epoch
record against what happened, captured independently of the counters:

- part sizes against ``partition.json``;
- block sizes (sampled, and used after the halo scheme dropped missed leaves) from the
  blocks themselves, captured by wrapping the scheme's ``after_sample`` hook;
- HEC lookups and hits per layer from the scheme's ``load`` events; rows and bytes pushed
  per layer from its ``push`` events (their per-peer counts); rows received by each rank
  from the peers' ``push`` events addressed to it;
- gradient all-reduces: one per iteration of ``4 * parameters`` bytes;
- the record's ``bytes_received`` equals its ``bytes_pushed`` (every push arrives within its
  epoch) and the per-rank sums equal the record's totals;
- ``compute_cpu`` is the training thread's forward + backward + optimizer CPU seconds
  without those inside the pushes' MPI calls; with one thread no phase's CPU time exceeds
  its wall time.

argv: PART_DIR EPOCHS
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from distmb.comm import MpiGroup
from distmb.config.train import TrainConfig
from distmb.core.units import row_message_bytes
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.build import make_halo_scheme
from distmb.engine.build.data import open_part

#: Slack of comparisons of rounded seconds (records keep 4 digits).
ROUNDING_S = 2e-4
#: A thread's CPU clock may run a tick ahead of the wall clock over a short phase.
CLOCK_TICK_S = 0.01

part_dir, epochs = sys.argv[1], int(sys.argv[2])
comm = MpiGroup()
store = open_part(comm, part_dir)
config = TrainConfig(
    layers=3,
    fanout=(3, 4, 5),
    hidden=8,
    batch_size=16,
    epochs=epochs,
    eval_every=10**6,
    progress=False,
    threads=1,
    hec_size=100_000,
    hec_nc=7,  # binds: pushes are capped, so rows pushed are not all candidates
    hec_lifespan=2,
    hec_delay=1,
)
halo = make_halo_scheme(comm, store, config)
trainer = Trainer(LocalGraph.from_store(store), config, comm=comm, halo=halo, log=lambda _: None)
layers = len(config.fanout)
dims = trainer.model.layer_dims()

#: epoch -> counter name -> int64[layers], from the blocks themselves.
blocks_seen: dict[int, dict[str, np.ndarray]] = defaultdict(
    lambda: defaultdict(lambda: np.zeros(layers, dtype=np.int64))
)
hook = halo.after_sample


def capture(batch, step, num_steps):
    seen = blocks_seen[halo.epoch]
    for layer, block in enumerate(batch.blocks):
        seen["block_dst"][layer] += block.n_dst
        seen["block_src"][layer] += block.n_src
        seen["block_halo"][layer] += block.n_halo
        seen["block_edges_sampled"][layer] += block.indices.shape[0]
    hook(batch, step, num_steps)
    for layer, block in enumerate(batch.blocks):
        seen["block_edges"][layer] += block.indices.shape[0]


halo.after_sample = capture
events: list[tuple] = []


def record(kind, k, layer, tags, rows, extra):
    events.append((kind, halo.epoch, layer, np.asarray(extra).copy()))


halo.record = record
history = trainer.fit()
params = sum(p.numel() for p in trainer.model.parameters())
everything = comm.allgather(events)
meta = json.loads((Path(part_dir) / "partition.json").read_text())

for epoch, rec in enumerate(history):
    mine = rec["per_rank"][comm.rank]
    assert mine["rank"] == comm.rank and len(rec["per_rank"]) == comm.size
    part = meta["parts"][comm.rank]
    for key, want in (
        ("n_solid", part["n_solid"]),
        ("n_halo", part["n_halo"]),
        ("n_edges", part["n_edges"]),
        ("n_train", part["n_train"]),
    ):
        assert mine[key] == want, (key, mine[key], want)
    for key, values in blocks_seen[epoch].items():
        assert mine[key] == values.tolist(), (epoch, key, mine[key], values.tolist())
    assert mine["block_dst"][-1] >= mine["n_train"]  # every training vertex once an epoch
    iters = mine["iterations"]
    assert mine["allreduce_calls"] == iters
    assert mine["allreduce_payload_bytes"] == 4 * params * iters
    lookups, hits = np.zeros(layers, np.int64), np.zeros(layers, np.int64)
    pushed, received = np.zeros(layers, np.int64), np.zeros(layers, np.int64)
    for sender, evs in enumerate(everything):
        for kind, ep, layer, extra in evs:
            if ep != epoch:
                continue
            if kind == "load" and sender == comm.rank:
                lookups[layer] += extra.size
                hits[layer] += int(extra.sum())
            elif kind == "push":
                if sender == comm.rank:
                    pushed[layer] += int(extra.sum())
                received[layer] += int(extra[comm.rank])
    assert mine["hec_lookups"] == lookups.tolist(), (mine["hec_lookups"], lookups)
    assert mine["hec_hits"] == hits.tolist(), (mine["hec_hits"], hits)
    assert mine["rows_pushed"] == pushed.tolist(), (mine["rows_pushed"], pushed)
    assert mine["rows_received"] == received.tolist(), (mine["rows_received"], received)
    row_bytes = [row_message_bytes(d) for d in dims]
    assert mine["bytes_pushed"] == [int(r * b) for r, b in zip(pushed, row_bytes, strict=True)]
    assert mine["bytes_received"] == [int(r * b) for r, b in zip(received, row_bytes, strict=True)]
    assert sum(pushed) > 0 and sum(received) > 0 and sum(hits) > 0
    everyone = rec["per_rank"]
    assert rec["bytes_pushed"] == sum(sum(r["bytes_pushed"]) for r in everyone)
    assert rec["bytes_received"] == rec["bytes_pushed"]
    for layer in range(1, layers):
        total_hits = sum(r["hec_hits"][layer] for r in everyone)
        total_lookups = sum(r["hec_lookups"][layer] for r in everyone)
        assert rec["hec_hit_rate"][layer] == total_hits / total_lookups
    t = rec["per_rank_time"][comm.rank]
    want = t["fwd_cpu"] + t["bwd_cpu"] + t["opt_cpu"] - t["comm_mpi_cpu"]
    assert abs(t["compute_cpu"] - want) <= ROUNDING_S, t
    for phase in ("fwd", "bwd", "ared", "opt"):
        assert 0 <= t[f"{phase}_cpu"] <= t[phase] + CLOCK_TICK_S, (phase, t)
    assert t["sample_cpu"] > 0 and t["gather_cpu"] >= 0 and t["compute_cpu"] > 0, t
print(f"rank records: rank {comm.rank}, {len(history)} epochs, all equal", flush=True)
