"""Rows read in place (``distmb.pipeline.rows.IndexedRows``, ``--no-gather-in-place``): the kernels
that
read a feature table through row ids give exactly what they give on the gathered copy, bad ids
are refused, and training with and without the gather is bit-identical."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from conftest import make_block, random_graph
from torch import Tensor

from distmb import _C
from distmb.config.train import TrainConfig
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.halo import HaloScheme
from distmb.halo.hec.scheme import HistoricalEmbeddingScheme
from distmb.nn import GATConv, GraphSAGE, SAGEConv
from distmb.nn.kernels import cpu_aggregate as fused_aggregate
from distmb.nn.kernels import cpu_update as fused_update
from distmb.nn.kernels.dispatch import set_kernels
from distmb.pipeline.features import ArrayFeatures, NormalizedFeatures, PartFeatures
from distmb.pipeline.features.normalize import FeatureNormalization
from distmb.pipeline.rows import IndexedRows, materialized


@pytest.fixture
def fused() -> Iterator[None]:
    set_kernels("fused")
    yield
    set_kernels("fused")


def table_and_ids(n_table: int, n: int, dim: int, seed: int) -> tuple[Tensor, Tensor]:
    """A random float32 table and ``n`` distinct random row ids of it (a block's sources)."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(n_table, dim, generator=gen)
    ids = torch.randperm(n_table, generator=gen)[:n].contiguous()
    return table, ids


# ----------------------------------------------------------------------------- the class


def test_indexed_rows_views_and_materialize() -> None:
    table, ids = table_and_ids(50, 20, 7, 0)
    rows = IndexedRows(table, ids)
    assert rows.shape == (20, 7) and len(rows) == 20 and rows.dim() == 2
    assert rows.dtype == torch.float32 and rows.device.type == "cpu" and not rows.requires_grad
    assert torch.equal(rows.materialize(), table[ids])
    assert torch.equal(rows.prefix(5).materialize(), table[ids[:5]])
    assert rows.prefix(0).shape == (0, 7)
    assert torch.equal(materialized(rows), table[ids]) and materialized(table) is table
    kt, ki = rows.kernel_source()
    assert np.shares_memory(kt, table.numpy()) and np.array_equal(ki, ids.numpy())
    with pytest.raises(ValueError, match=r"prefix: n=21 outside \[0, 20\]"):
        rows.prefix(21)


def test_indexed_rows_with_a_gathered_head() -> None:
    table, ids = table_and_ids(50, 20, 7, 1)
    rows = IndexedRows(table, ids, table[ids[:8]].contiguous())
    assert torch.equal(rows.materialize(), table[ids])
    head = rows.prefix(5)  # inside the head: a tensor view, read in order
    assert isinstance(head, Tensor) and torch.equal(head, table[ids[:5]])
    assert rows.prefix(8).data_ptr() == rows.head.data_ptr()
    tail = rows.prefix(9)  # beyond it: still in place
    assert isinstance(tail, IndexedRows) and torch.equal(tail.materialize(), table[ids[:9]])
    for bad in (torch.zeros(21, 7), torch.zeros(3, 6), torch.zeros(3, 7, dtype=torch.float64)):
        with pytest.raises(ValueError, match="head must be a contiguous float32"):
            IndexedRows(table, ids, bad)


@pytest.mark.parametrize(
    "table, ids, match",
    [
        (torch.zeros(4, 3, dtype=torch.float64), torch.arange(2), "float32"),
        (torch.zeros(4), torch.arange(2), "float32"),
        (torch.zeros(3, 4).t(), torch.arange(2), "contiguous"),
        (torch.zeros(4, 3), torch.arange(2, dtype=torch.int32), "int64"),
        (torch.zeros(4, 3), torch.arange(4)[::2], "contiguous"),
        (torch.zeros(4, 3), torch.zeros(2, 1, dtype=torch.int64), "int64"),
    ],
)
def test_indexed_rows_refuses_bad_tensors(table: Tensor, ids: Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        IndexedRows(table, ids)


# ----------------------------------------------------------------------------- kernels


@pytest.mark.parametrize("c0, c1, k", [(100, 100, 256), (13, 7, 40), (5, 33, 16)])
@pytest.mark.parametrize("activation, p", [(True, 0.5), (True, 0.0), (False, 0.0)])
def test_update_through_ids_equals_gathered(
    threads: int, c0: int, c1: int, k: int, activation: bool, p: float
) -> None:
    """Forward values and gate bits, and every weight / bias gradient, bit for bit."""
    n = 301  # not a multiple of the row blocks or register tiles
    gen = torch.Generator().manual_seed(c0 + k)
    h = torch.randn(n, c0, generator=gen)
    table, ids = table_and_ids(900, n, c1, c1)
    rows = IndexedRows(table, ids)
    ws = [torch.randn(k, c0, generator=gen), torch.randn(k, c1, generator=gen)]
    bias = torch.randn(k, generator=gen)
    want, want_bits = fused_update.update_forward([h, table[ids]], ws, None, bias, activation, p, 3)
    got, got_bits = fused_update.update_forward([h, rows], ws, None, bias, activation, p, 3)
    assert torch.equal(got, want)
    assert (got_bits is None and want_bits is None) or torch.equal(got_bits, want_bits)
    grad_out = torch.randn(n, k, generator=gen)
    scale = fused_update.dropout_scale(p) if activation else 1.0
    args = ([True, False], [True, True], True, False)
    want_g = fused_update.update_backward(grad_out, want_bits, scale, [h, table[ids]], ws, *args)
    got_g = fused_update.update_backward(grad_out, got_bits, scale, [h, rows], ws, *args)
    assert torch.equal(got_g[1], want_g[1])  # bias
    assert torch.equal(got_g[2][0], want_g[2][0])  # the gathered source's input gradient
    for g, w in zip(got_g[3], want_g[3], strict=True):  # weights
        assert torch.equal(g, w)


def test_update_through_ids_refusals() -> None:
    table, ids = table_and_ids(10, 4, 3, 0)
    w, bias = torch.ones(2, 3), torch.zeros(2)
    bad = ids.clone()
    bad[2] = 10
    with pytest.raises(ValueError, match=r"rows\[2\] = 10 is outside the table's 10 rows"):
        fused_update.update_forward([IndexedRows(table, bad)], [w], None, bias, True, 0.0, 0)
    bad[2] = -1
    with pytest.raises(ValueError, match=r"rows\[2\] = -1"):
        fused_update.update_forward([IndexedRows(table, bad)], [w], None, bias, True, 0.0, 0)
    rows = IndexedRows(table, ids)
    with pytest.raises(ValueError, match="get no gradient"):
        fused_update.update_backward(
            torch.ones(4, 2), None, 1.0, [rows], [w], [True], [True], False, False
        )
    with pytest.raises(ValueError, match="no input gradient"):  # the kernel's own check
        _C.update_backward(
            np.ones((4, 2), np.float32), None, 1.0, [rows.kernel_source()], [w.numpy()],
            [np.empty((4, 3), np.float32)], [None], None, None,
        )  # fmt: skip


@pytest.mark.parametrize("kind", ["mean", "sum"])
def test_aggregate_through_ids_equals_gathered(threads: int, kind: str) -> None:
    block = make_block(60, 150, 12, 1)
    table, ids = table_and_ids(400, 150, 9, 2)
    got = fused_aggregate.aggregate_forward(block, IndexedRows(table, ids), kind)
    assert torch.equal(got, fused_aggregate.aggregate_forward(block, table[ids], kind))


def test_aggregate_through_ids_refusals() -> None:
    block = make_block(6, 15, 4, 1)
    table, ids = table_and_ids(40, 15, 3, 2)
    with pytest.raises(ValueError, match="gcn aggregator needs gathered rows"):
        fused_aggregate.aggregate_forward(block, IndexedRows(table, ids), "gcn")
    with pytest.raises(ValueError, match="14 rows but the block has n_src=15"):
        fused_aggregate.aggregate_forward(block, IndexedRows(table, ids[:14]), "mean")


# ----------------------------------------------------------------------------- layers, models


@pytest.mark.parametrize("in_dim, out_dim", [(12, 20), (30, 8)])  # aggregate / project first
@pytest.mark.parametrize("aggr", ["mean", "sum", "gcn"])
@pytest.mark.parametrize("kernels", ["fused", "torch"])
def test_sage_layer_in_place_equals_gathered(
    fused: None, in_dim: int, out_dim: int, aggr: str, kernels: str
) -> None:
    """Output and parameter gradients of a first layer bit for bit: through the ids (fused,
    not gcn), or gathered first (torch kernels, gcn)."""
    set_kernels(kernels)
    block = make_block(40, 90, 8, 3)
    table, ids = table_and_ids(300, 90, in_dim, 4)
    torch.manual_seed(0)
    conv = SAGEConv(in_dim, out_dim, aggr=aggr, dropout=0.5)
    results = []
    for x in (table[ids], IndexedRows(table, ids)):
        torch.manual_seed(5)  # the same dropout seed
        out = conv(block, x)
        grads = torch.autograd.grad(out.square().sum(), list(conv.parameters()))
        results.append((out, grads))
    (want, want_g), (got, got_g) = results
    assert torch.equal(got, want)
    for g, w in zip(got_g, want_g, strict=True):
        assert torch.equal(g, w)


def test_models_take_in_place_rows(fused: None) -> None:
    """GraphSAGE reads them in place (with or without a gathered head, fused pair or not);
    a model whose first layer cannot (GAT) gathers them."""
    block = make_block(30, 70, 6, 5)
    blocks = [block, make_block(10, 30, 5, 6)]
    table, ids = table_and_ids(200, 70, 6, 7)
    sage = GraphSAGE(6, 8, 3, num_layers=2)
    assert sage.reads_input_in_place
    torch.manual_seed(1)
    want = sage(blocks, table[ids])
    for head in (None, table[ids[:30]].contiguous(), table[ids[:12]].contiguous()):
        torch.manual_seed(1)
        assert torch.equal(sage(blocks, IndexedRows(table, ids, head)), want)
    gat = GATConv(6, 4, heads=2)
    assert not getattr(gat, "reads_in_place", False)
    assert not GraphSAGE(6, 8, 3, num_layers=2, aggr="gcn").reads_input_in_place


# ----------------------------------------------------------------------------- sources, loader


def test_feature_sources_rows_in_place() -> None:
    table = np.random.default_rng(0).standard_normal((30, 4)).astype(np.float32)
    ids = np.array([3, 0, 29, 7])
    source = ArrayFeatures(table)
    rows = source.rows_in_place(ids)
    assert rows is not None and np.array_equal(rows.materialize().numpy(), table[ids])
    assert np.shares_memory(rows.table.numpy(), table)  # no copy
    assert source.rows_served == 4 and source.bytes_read == 4 * 4 * 4
    with pytest.raises(IndexError, match=r"ids must be in \[0, 30\)"):
        source.rows_in_place(np.array([30]))
    part = PartFeatures(table, np.ones((5, 4), np.float32))
    assert part.rows_in_place(ids) is not None
    assert part.rows_in_place(np.array([1, 31])) is None  # a halo row: gather
    assert ArrayFeatures(table.astype(np.float64)).rows_in_place(ids) is None  # not float32
    norm = FeatureNormalization("standard", torch.zeros(4), torch.ones(4))
    assert NormalizedFeatures(source, norm).rows_in_place(ids) is None  # computed rows


def test_halo_schemes_declare_reading_input_rows() -> None:
    assert not HaloScheme.reads_input_rows
    assert HistoricalEmbeddingScheme.reads_input_rows  # pushes layer 0's rows to its peers


@pytest.mark.parametrize("model", ["sage", "gat"])
def test_training_in_place_is_bit_identical(model: str) -> None:
    graph = random_graph(n=500, m=4000, feat_dim=12, classes=4, seed=3)
    states, losses, flags = [], [], []
    for in_place in (True, False):
        config = TrainConfig(
            model=model, layers=2, fanout=(4, 6), hidden=16, heads=2, batch_size=40,
            dropout=0.5, threads=2, seed=0, epochs=2, eval_every=10**9, kernels="fused",
            prefetch=0, progress=False, gather_in_place=in_place,
        )  # fmt: skip
        trainer = Trainer(LocalGraph.from_graph(graph), config, log=lambda _: None)
        flags.append(trainer.loader.in_place)
        losses.append([trainer.train_epoch(e)["loss"] for e in range(2)])
        states.append([p.detach().clone() for p in trainer.model.parameters()])
    assert flags == ([True, False] if model == "sage" else [False, False])
    assert trainer.loader.in_place is False  # the last one built: --no-gather-in-place
    assert losses[0] == losses[1]
    for a, b in zip(*states, strict=True):
        assert torch.equal(a, b)


def test_loader_gathers_only_the_destinations_rows() -> None:
    graph = random_graph(n=300, m=2500, feat_dim=6, classes=3, seed=4)
    config = TrainConfig(
        model="sage", layers=2, fanout=(3, 5), hidden=8, batch_size=20, threads=1, seed=0,
        epochs=1, eval_every=10**9, kernels="fused", prefetch=0, progress=False,
    )  # fmt: skip
    trainer = Trainer(LocalGraph.from_graph(graph), config, log=lambda _: None)
    loader = trainer.loader
    plan = loader.plan(0, trainer.epoch_batches(0))
    batch = loader.make_batch(0, 0, plan.batches[0])
    first = batch.blocks[0]
    assert isinstance(batch.x, IndexedRows) and batch.x.head is not None
    ids = first.src_ids[: first.n_computed]
    assert torch.equal(batch.x.ids, ids)
    assert batch.x.head.shape == (first.n_dst, 6)
    features = torch.from_numpy(graph.features)
    assert torch.equal(batch.x.head, features[ids[: first.n_dst]])
    assert torch.equal(batch.x.materialize(), features[ids])
    assert torch.equal(batch.input_rows(), features[ids])
