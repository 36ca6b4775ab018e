"""Run under mpiexec: --early-stop on several ranks stops every rank after the same epoch, the
one a patience-2 rule picks from the validation accuracies of the same run without early
stopping, and best.pt holds the best validation epoch.

argv: PART_DIR CHECKPOINT_DIR
"""

from __future__ import annotations

import sys

import torch

from distmb.comm import MpiGroup
from distmb.config.train import TrainConfig
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.build import make_halo_scheme
from distmb.engine.build.data import open_part
from distmb.engine.checkpoint import BEST_FILE

part_dir, ckpt = sys.argv[1], sys.argv[2]
comm = MpiGroup()
store = open_part(comm, part_dir)
base = dict(layers=2, fanout=(4, 4), hidden=16, batch_size=50, lr=0.2, epochs=12, progress=False)


def fit(**extra) -> list[dict]:
    config = TrainConfig(**base, **extra)
    halo = make_halo_scheme(comm, store, config)
    trainer = Trainer(LocalGraph.from_store(store), config, comm=comm, halo=halo, log=print)
    return trainer.fit()


full = fit()
stopped = fit(early_stop=2, checkpoint_dir=ckpt)
vals = [r["val_acc"] for r in full]
stop = next(i for i in range(len(vals)) if i - vals[: i + 1].index(max(vals[: i + 1])) >= 2)
assert stop < len(vals) - 1, "the run must stop early"
lengths = comm.allgather(len(stopped))
assert lengths == [stop + 1] * comm.size, (lengths, stop)
assert stopped[-1]["stopped"] == "early_stop"
best = vals[: stop + 1].index(max(vals[: stop + 1]))
if comm.rank == 0:
    assert torch.load(f"{ckpt}/{BEST_FILE}", weights_only=True)["epoch"] == best
    print(f"stopped after epoch {stop} on {comm.size} ranks; best {best}", flush=True)
