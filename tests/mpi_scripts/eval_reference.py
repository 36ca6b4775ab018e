"""Run under mpiexec or torchrun: exact layer-wise evaluation (per part, with halo exchanges)
equals an independent full-graph GraphSAGE forward pass (float64, scatter-mean over the whole
graph's in-edges) with the same weights, for every vertex of every part.

argv: PART_DIRS DATASET_SPEC [torch]  (PART_DIRS: one or more partitions of DATASET_SPEC
into as many parts as there are ranks, joined by ``os.pathsep``, checked one after the other in
this launch; torch: the halo exchanges over torch.distributed, as --comm torch; always so under
torchrun)
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

from distmb.comm import launch_communicator
from distmb.config.train import TrainConfig
from distmb.data import load_dataset
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.build import make_halo_scheme
from distmb.engine.build.data import open_part
from distmb.engine.evaluate import layerwise_inference

part_dirs, spec = sys.argv[1].split(os.pathsep), sys.argv[2]
comm = launch_communicator()
if sys.argv[3:] == ["torch"] and comm.launcher == "mpi":
    comm.use_torch_distributed("gloo", "cpu")


def check(part_dir: str) -> None:
    """One epoch on ``part_dir``, then its layer-wise evaluation against the reference (rank 0
    prints a line when they agree)."""
    store = open_part(comm, part_dir)
    config = TrainConfig(
        layers=3, fanout=(3, 3, 3), hidden=8, batch_size=100, epochs=1, progress=False
    )
    trainer = Trainer(
        LocalGraph.from_store(store),
        config,
        comm=comm,
        halo=make_halo_scheme(comm, store, config),
        log=lambda _: None,
    )
    trainer.fit()  # one epoch: weights away from their initialisation
    logits = layerwise_inference(
        trainer.model, trainer.features, trainer.sampler, 97, trainer.eval_table
    ).numpy()
    rows = comm.allgather((np.asarray(store.orig_ids[: store.n_solid]), logits))
    if comm.rank == 0:
        graph = load_dataset(spec)
        n = graph.num_nodes
        dst = torch.from_numpy(np.repeat(np.arange(n), np.diff(graph.indptr)))
        src = torch.from_numpy(np.asarray(graph.indices, dtype=np.int64))
        deg = torch.bincount(dst, minlength=n).clamp(min=1).double().unsqueeze(1)
        h = torch.from_numpy(graph.features).double()
        state = {k: v.double() for k, v in trainer.model.state_dict().items()}
        for layer in range(config.layers):
            mean = torch.zeros(n, h.shape[1], dtype=torch.float64).index_add_(0, dst, h[src]) / deg
            w_n, w_s = (
                state[f"layers.{layer}.fc_neigh.weight"],
                state[f"layers.{layer}.fc_self.weight"],
            )
            h = mean @ w_n.T + h @ w_s.T + state[f"layers.{layer}.bias"]
            if layer < config.layers - 1:
                h = torch.relu(h)
        reference = h.numpy()
        covered = np.zeros(n, dtype=bool)
        for orig, part_logits in rows:
            np.testing.assert_allclose(part_logits, reference[orig], rtol=1e-4, atol=1e-4)
            covered[orig] = True
        assert covered.all()
        print(f"evaluation equals the full-graph reference on {comm.size} rank(s)", flush=True)


for part_dir in part_dirs:
    check(part_dir)
comm.close_torch_distributed()
