"""The FLOP and byte counts of benchmarks/roofline.py: against a hand-counted tiny block set,
and against the GEMM shapes the fused SAGE kernels are really called with."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from distmb.core.errors import InputError
from distmb.nn.kernels.dispatch import set_kernels
from distmb.nn.models import GraphSAGE, stack_widths
from distmb.pipeline.sample import Block

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "roofline.py"


def _load_roofline():
    if str(_PATH.parent) not in sys.path:  # its sibling modules (record.py), as when run
        sys.path.insert(0, str(_PATH.parent))
    spec = importlib.util.spec_from_file_location("roofline_benchmark", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


roofline = _load_roofline()
BlockShape, Work = roofline.BlockShape, roofline.Work

#: The tiny model: 4 features -> 8 -> 8 -> 3 classes. Layers 0 and 1 aggregate first
#: (8 >= 4, 8 >= 8), layer 2 projects first (3 < 8).
WIDTHS = [(4, 8), (8, 8), (8, 3)]
#: Its blocks: (n_dst, n_src, edges); blocks[l + 1].n_src == blocks[l].n_dst.
SHAPES = [BlockShape(3, 5, 6), BlockShape(2, 3, 4), BlockShape(1, 2, 2)]

# Hand counts (F = 4 bytes per float32; gate bits: one byte per row for 8 or fewer columns).
HAND = {
    # layer 0, 4 -> 8, first layer (no input gradient), ReLU + dropout
    (0, "agg_fwd"): Work(6 * 4 + 3 * 4, 4 * (6 * 4 + 3 * 4)),
    # 2 sources [3 x 4] @ [8 x 4]^T; read x, w twice + bias, write [3 x 8], 3 gate bytes
    (0, "update_fwd"): Work(2 * (2 * 3 * 4 * 8), 4 * (2 * (12 + 32) + 8 + 24) + 3),
    # only the two weight gradients; read grad_out, both x, write both dW, bias grad
    (0, "update_bwd"): Work(2 * (2 * 3 * 4 * 8), 4 * (24 + 2 * (12 + 32) + 8) + 3),
    # layer 1, 8 -> 8
    (1, "agg_fwd"): Work(4 * 8 + 2 * 8, 4 * (4 * 8 + 2 * 8)),
    (1, "update_fwd"): Work(2 * (2 * 2 * 8 * 8), 4 * (2 * (16 + 64) + 8 + 16) + 2),
    # dX and dW of both sources: read grad_out; per source read W + write dX, read X + write dW
    (1, "update_bwd"): Work(4 * (2 * 2 * 8 * 8), 4 * (16 + 2 * (80 + 80) + 8) + 2),
    # 4 gathered rows of 8, 3 source rows written, 2 addend rows (self gradient) read
    (1, "agg_bwd"): Work(2 * 4 * 8 + 2 * 8, 4 * 8 * (4 + 3 + 2)),
    # layer 2, 8 -> 3, projects first, no activation
    (2, "proj_fwd"): Work(2 * 2 * 8 * 3, 4 * (16 + 24 + 3 + 6)),  # all n_src = 2 rows
    (2, "agg_fwd"): Work(2 * 3 + 1 * 3, 4 * (2 * 3 + 1 * 3)),
    # self source [1 x 8] @ [3 x 8]^T plus the aggregate as addend [1 x 3]
    (2, "update_fwd"): Work(2 * 1 * 8 * 3, 4 * (8 + 24 + 3 + 3 + 3)),
    # dX_self, dW_self; grad_out read, W and X read, dX and dW written, bias and addend grads
    (2, "update_bwd"): Work(2 * (2 * 1 * 8 * 3), 4 * (3 + (24 + 8) + (8 + 24) + 3 + 3)),
    (2, "agg_bwd"): Work(2 * 2 * 3, 4 * 3 * (2 + 2)),  # no addend
    (2, "proj_bwd"): Work(2 * (2 * 2 * 8 * 3), 4 * (6 + (24 + 16) + (16 + 24))),
}


def test_hand_counted_block_set():
    got = roofline.sage_batch_work(SHAPES, WIDTHS)
    assert got == HAND
    assert roofline.gemm_flops(got) == 384 + 384 + 512 + 1024 + 96 + 48 + 96 + 192
    assert roofline.feature_gather_bytes(SHAPES[0], 4) == 2 * 5 * 4 * 4
    epoch = roofline.epoch_work([SHAPES, SHAPES], WIDTHS, feat_dim=4)
    assert epoch["phases"]["gather"] == Work(0, 2 * 160)
    agg_fwd = HAND[(0, "agg_fwd")] + HAND[(1, "agg_fwd")] + HAND[(2, "agg_fwd")]
    assert epoch["phases"]["agg_fwd"] == agg_fwd + agg_fwd
    gemm_bwd = sum((w for (_, k), w in HAND.items() if k in ("update_bwd", "proj_bwd")), Work())
    assert epoch["phases"]["gemm_bwd"] == gemm_bwd + gemm_bwd


def test_layer_count_mismatch_is_refused():
    with pytest.raises(ValueError, match="2 blocks for 3 layers"):
        roofline.sage_batch_work(SHAPES[:2], WIDTHS)


def _random_blocks(sizes: list[tuple[int, int, int]], seed: int) -> list[Block]:
    """Consistent blocks of the given (n_dst, n_src, max fan-out); every destination has 1 to
    max fan-out edges to random sources."""
    rng = np.random.default_rng(seed)
    blocks = []
    for n_dst, n_src, fanout in sizes:
        deg = rng.integers(1, fanout + 1, n_dst)
        indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
        indices = rng.integers(0, n_src, int(deg.sum())).astype(np.int64)
        blocks.append(
            Block(n_dst, n_src, 0, torch.from_numpy(indptr), torch.from_numpy(indices),
                  torch.arange(n_src, dtype=torch.int64))
        )  # fmt: skip
    return blocks


@pytest.mark.parametrize("hidden", [16, 5])  # 5 < 12: the hidden layers project first too
def test_counts_match_the_fused_kernel_calls(hidden):
    """Run a real fused GraphSAGE step under the KernelTimer: the GEMM FLOPs of each
    (layer, kernel) tallied from the operands of the kernel calls equal the counts from the
    block shapes, and the kernels called are exactly the ones counted."""
    set_kernels("fused")
    in_dim, classes = 12, 4
    torch.manual_seed(0)
    model = GraphSAGE(in_dim, hidden, classes, num_layers=3, dropout=0.5)
    model.train()
    blocks = _random_blocks([(40, 90, 5), (15, 40, 6), (6, 15, 4)], seed=hidden)
    x = torch.randn(blocks[0].n_src, in_dim)
    with roofline.KernelTimer(model) as timer:
        model(blocks, x).square().sum().backward()
    shapes = [roofline.BlockShape.of(b) for b in blocks]
    assert timer.shapes == [shapes]
    counted = roofline.sage_batch_work(shapes, stack_widths(in_dim, hidden, classes, 3))
    gemm = {k: w.flops for k, w in counted.items() if not k[1].startswith("agg")}
    assert dict(timer.called_flops) == gemm
    timed = {k for k in timer.seconds if k[1] != "transpose"}
    assert timed == set(counted)
    # the wrappers are gone after the context
    assert roofline.fused_update.update_forward.__module__ == "distmb.nn.kernels.cpu_update"


def test_chung_lu_graph_keeps_hubs():
    nodes, degree = 20_000, 30.0
    graph = roofline.chung_lu_uncapped_graph(nodes=nodes, avg_degree=degree, feat_dim=8,
                                             classes=5)  # fmt: skip
    facts = roofline.degree_facts(graph)
    assert facts["mean"] == pytest.approx(degree, rel=0.01)
    # the built-in generator caps expected degrees at sqrt(n * d); these hubs go far beyond
    assert facts["max"] > 3 * math.sqrt(nodes * degree)
    assert graph.train_idx.size == nodes // 4


def test_parse_threads():
    assert roofline.parse_threads("1,2,all", 2) == [1, 2]
    assert roofline.parse_threads("16,1,all,4", 16) == [1, 4, 16]
    with pytest.raises(InputError, match="--threads '1,x'"):
        roofline.parse_threads("1,x", 2)
