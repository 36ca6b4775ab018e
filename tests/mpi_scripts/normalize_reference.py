"""Run under mpiexec: with --normalize-features row and standard, every rank's training
source (solid rows and replicated halo rows) and evaluation source return the rows of the
whole graph's normalisation computed by numpy on one process (``REF_DIR/<kind>.npy``, by
``VID_o``), and every rank holds the same statistics.

argv: PART_DIR REF_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from distmb.comm import MpiGroup
from distmb.config.train import TrainConfig
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.build import make_halo_scheme
from distmb.engine.build.data import open_part

part_dir, ref_dir = sys.argv[1], Path(sys.argv[2])
comm = MpiGroup()
store = open_part(comm, part_dir)
for kind in ("row", "standard"):
    config = TrainConfig(
        layers=2, fanout=(3, 3), hidden=8, batch_size=50, epochs=1, progress=False,
        normalize_features=kind,
    )  # fmt: skip
    trainer = Trainer(
        LocalGraph.from_store(store),
        config,
        comm=comm,
        halo=make_halo_scheme(comm, store, config),
        log=lambda _: None,
    )
    expected = np.load(ref_dir / f"{kind}.npy")
    train = trainer.features
    assert train.has_halo == (store.n_local > store.n_solid)
    ids = np.arange(train.num_rows)
    orig = np.asarray(store.orig_ids[: train.num_rows])
    for source in (train, trainer.feature_sources.evaluation()):
        np.testing.assert_allclose(source.gather(ids).numpy(), expected[orig], rtol=1e-5, atol=1e-6)
    norm = trainer.normalization
    stats = comm.allgather(None if kind == "row" else (norm.mean.numpy(), norm.std.numpy()))
    if kind == "standard":
        for mean, std in stats[1:]:
            assert np.array_equal(mean, stats[0][0]) and np.array_equal(std, stats[0][1])
    trainer.fit()  # training and evaluation run on the normalised rows
    if comm.rank == 0:
        print(f"{kind}: equal on {comm.size} ranks", flush=True)
