"""Per-rank epoch records (``per_rank`` / ``per_rank_time``): phase CPU clocks, block work
counters, and every counter against an independent capture under a real ``mpiexec``."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from conftest import SMALL
from test_distributed import SCRIPTS, mpirun

from distmb.comm import SingleProcess
from distmb.config.train import TrainConfig
from distmb.data import load_dataset
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.timers import PhaseTimer
from distmb.engine.work import WORK_COUNTERS, BlockWork
from distmb.partition import partition_graph
from distmb.pipeline.sample.blocks import Block
from distmb.pipeline.sample.host import NeighborSampler

#: Seconds of the busy and sleeping phases of the timer test.
PHASE_S = 0.15


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def test_phase_timer_counts_thread_cpu_apart_from_wall_time():
    timer = PhaseTimer()
    with timer("fwd"):
        _busy(PHASE_S)
    with timer("bwd"):
        time.sleep(PHASE_S)
    cpu = timer.cpu_dict()
    assert set(cpu) == {"fwd_cpu", "bwd_cpu", "ared_cpu", "opt_cpu"}
    assert timer.seconds["bwd"] >= PHASE_S and cpu["bwd_cpu"] < 0.3 * PHASE_S  # asleep
    assert timer.seconds["fwd"] >= PHASE_S and cpu["fwd_cpu"] <= timer.seconds["fwd"] + 0.01
    assert cpu["fwd_cpu"] > 0  # busy: some CPU even when the core is shared
    timer.reset()
    assert timer.cpu_dict()["fwd_cpu"] == 0.0 and timer.as_dict()["fwd"] == 0.0


def _block(n_dst: int, n_src: int, n_halo: int, edges: int) -> Block:
    indptr = torch.zeros(n_dst + 1, dtype=torch.int64)
    indptr[-1] = edges
    return Block(
        n_dst, n_src, n_halo, indptr, torch.zeros(edges, dtype=torch.int64), torch.arange(n_src)
    )


def test_block_work_sums_block_sizes_per_layer():
    work = BlockWork(2)
    sampled = [_block(5, 9, 2, 20), _block(2, 5, 1, 6)]
    work.add_sampled(sampled)
    work.add_used([_block(5, 9, 2, 17), _block(2, 5, 1, 6)])
    work.add_sampled([_block(3, 4, 0, 4), _block(1, 3, 0, 2)])
    work.add_used([_block(3, 4, 0, 4), _block(1, 3, 0, 2)])
    assert work.as_dict() == {
        "block_dst": [8, 3],
        "block_src": [13, 8],
        "block_halo": [2, 1],
        "block_edges_sampled": [24, 8],
        "block_edges": [21, 8],
    }
    with pytest.raises(ValueError, match="3 blocks, expected 2"):
        work.add_sampled([*sampled, sampled[0]])
    work.reset()
    assert all(v == [0, 0] for v in work.as_dict().values())


def test_single_rank_record_counts_the_blocks_an_independent_sampler_draws():
    """One rank: the record's work counters equal the block sizes of a separate sampler drawing
    the same batches (the sampler is deterministic in seed, epoch and batch index); no
    halo, no traffic, no all-reduce."""
    graph = load_dataset(SMALL)
    config = TrainConfig(
        layers=2, fanout=(4, 4), hidden=16, batch_size=100, epochs=2, progress=False, threads=1
    )
    trainer = Trainer(LocalGraph.from_graph(graph), config, log=lambda _: None)
    history = trainer.fit()
    local = trainer.local
    sampler = NeighborSampler(
        local.indptr, local.indices, local.n_solid, local.n_local, config.fanout, config.seed
    )
    for epoch, rec in enumerate(history):
        (mine,) = rec["per_rank"]
        want = {key: np.zeros(2, dtype=np.int64) for key in WORK_COUNTERS}
        for index, seeds in enumerate(trainer.epoch_batches(epoch)):
            for layer, block in enumerate(sampler.sample(seeds, epoch, index)):
                want["block_dst"][layer] += block.n_dst
                want["block_src"][layer] += block.n_src
                want["block_edges_sampled"][layer] += block.num_edges
                want["block_edges"][layer] += block.num_edges
        for key, values in want.items():
            assert mine[key] == values.tolist(), key
        assert mine["block_dst"][-1] == graph.train_idx.size
        assert mine["n_solid"] == graph.num_nodes and mine["n_halo"] == 0
        assert mine["n_edges"] == graph.num_edges and mine["iterations"] == len(
            trainer.epoch_batches(epoch)
        )
        assert mine["allreduce_calls"] == 0 and mine["allreduce_payload_bytes"] == 0
        assert sum(mine["rows_pushed"]) == 0 and sum(mine["rows_received"]) == 0
        assert rec["bytes_received"] == 0
        (t,) = rec["per_rank_time"]
        assert t["compute_cpu"] > 0 and t["comm_mpi_cpu"] == 0
    assert SingleProcess().allreduce_stats.payload_bytes == 0


@pytest.mark.parametrize("parts", [2, 3])
def test_rank_records_match_an_independent_capture_under_mpiexec(tmp_path, parts):
    part_dir = tmp_path / f"p{parts}"
    partition_graph(load_dataset(SMALL), parts, part_dir, seed=0)
    proc = mpirun(parts, [str(SCRIPTS / "rank_records.py"), str(part_dir), "2"], 180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("all equal") == parts, proc.stdout
