"""GCN and GIN against independent dense float64 references, gradcheck, exact layer-wise
evaluation against a dense full-graph forward, and short training runs on Cora."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import random_graph
from test_nn import DTYPE, check_against, dense_adj, make_block, params, rand

from distmb.config.train import TrainConfig
from distmb.data import load_dataset
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.evaluate import layerwise_inference
from distmb.nn import GCN, GIN, GCNConv, GINConv, build_model
from distmb.nn.models import parameter_count
from distmb.pipeline.features.memory import ArrayFeatures
from distmb.pipeline.sample import Block, NeighborSampler

# --------------------------------------------------------------------------- references


def ref_gcn(conv: GCNConv, adj: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """D_in^-1/2 (A + [I 0]) D_out^-1/2 X W^T + b with degrees of the (dense) block."""
    n_dst = adj.shape[0]
    if conv.self_loops:
        adj = adj.clone()
        adj[:, :n_dst] += torch.eye(n_dst, dtype=adj.dtype)
    d_in = adj.sum(1).clamp(min=1)
    d_out = adj.sum(0).clamp(min=1)
    norm = adj / d_in.sqrt()[:, None] / d_out.sqrt()[None, :]
    h = norm @ x @ conv.fc.weight.T + conv.bias
    return torch.relu(h) if conv.activation else h


def ref_gin(conv: GINConv, adj: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """MLP((1 + eps) x_v + sum of neighbours) with the dense adjacency."""
    n_dst = adj.shape[0]
    z = (1 + conv.eps) * x[:n_dst] + adj @ x
    lin1, lin2 = conv.mlp[0], conv.mlp[2]
    h = torch.relu(z @ lin1.weight.T + lin1.bias) @ lin2.weight.T + lin2.bias
    return torch.relu(h) if conv.activation else h


SHAPES = [(1, 1, 0, 1), (1, 5, 2, 4), (6, 15, 4, 5), (20, 40, 10, 8)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("activation", [True, False])
@pytest.mark.parametrize("dims", [(3, 5), (6, 2)])  # aggregate first / project first
@pytest.mark.parametrize("self_loops", [True, False])
def test_gcn_conv_matches_dense(shape, activation, dims, self_loops):
    n_dst, n_src, n_halo, deg = shape
    block = make_block(n_dst, n_src, n_halo, deg, seed=n_src)
    torch.manual_seed(1)
    conv = GCNConv(*dims, activation=activation, self_loops=self_loops).to(DTYPE)
    with torch.no_grad():
        conv.bias.normal_()  # a zero bias would hide a misplaced bias
    x = rand(n_src, dims[0])
    adj = dense_adj(block)
    check_against(lambda: conv(block, x), lambda: ref_gcn(conv, adj, x), [x, *params(conv)])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("activation", [True, False])
@pytest.mark.parametrize(("eps", "train_eps"), [(0.0, False), (0.3, True), (-0.5, False)])
def test_gin_conv_matches_dense(shape, activation, eps, train_eps):
    n_dst, n_src, n_halo, deg = shape
    block = make_block(n_dst, n_src, n_halo, deg, seed=n_src + 1)
    torch.manual_seed(2)
    conv = GINConv(4, 3, eps=eps, train_eps=train_eps, activation=activation).to(DTYPE)
    x = rand(n_src, 4)
    adj = dense_adj(block)
    check_against(lambda: conv(block, x), lambda: ref_gin(conv, adj, x), [x, *params(conv)])
    assert ("eps" in dict(conv.named_parameters())) == train_eps
    assert conv.eps.item() == pytest.approx(eps, rel=1e-6)


def test_gin_eps_learns_and_fixed_eps_stays():
    block = make_block(5, 9, 0, 3, seed=4)
    for train_eps in (True, False):
        conv = GINConv(3, 2, eps=0.1, train_eps=train_eps, activation=False)
        opt = torch.optim.SGD(conv.parameters(), lr=0.1)
        conv(block, torch.randn(9, 3)).square().sum().backward()
        opt.step()
        assert (conv.eps.item() != pytest.approx(0.1)) == train_eps


def test_gcn_gin_gradcheck():
    torch.manual_seed(5)
    block = make_block(4, 7, 2, 3, seed=3)
    x = rand(7, 3)
    for conv in [
        GCNConv(3, 2),
        GCNConv(3, 4, activation=False, self_loops=False),
        GINConv(3, 2, eps=0.2, train_eps=True),
        GINConv(3, 4, activation=False),
    ]:
        conv = conv.to(DTYPE)
        assert torch.autograd.gradcheck(lambda t, *p, c=conv: c(block, t), (x, *params(conv)))


def test_float32_fused_matches_float64():
    """The float32 path (fused AGG kernels) agrees with the float64 (torch) path."""
    block = make_block(20, 40, 0, 8, seed=7)
    x = torch.randn(40, 6)
    for conv in (GCNConv(6, 5), GINConv(6, 5, eps=0.4)):
        conv.eval()
        want = conv.to(DTYPE)(block, x.to(DTYPE))
        got = conv.float()(block, x)
        torch.testing.assert_close(got.to(DTYPE), want, atol=1e-4, rtol=1e-4)


def test_models_factory_and_parameter_count():
    for name, cls in (("gcn", GCN), ("gin", GIN)):
        for layers in (1, 3):
            for train_eps in (False, True):
                model = build_model(name, 13, 8, 5, layers, gin_train_eps=train_eps)
                assert isinstance(model, cls)
                assert model.layer_dims() == [13] + [8] * (layers - 1)
                count = sum(p.numel() for p in model.parameters())
                assert parameter_count(name, 13, 8, 5, layers, gin_train_eps=train_eps) == count


# --------------------------------------------------------------------------- exact evaluation


def dense_full_graph(model, graph, x: torch.Tensor) -> torch.Tensor:
    """The model's layers applied to the whole graph densely, in float64."""
    n = graph.num_nodes
    adj = torch.zeros(n, n, dtype=DTYPE)
    dst = np.repeat(np.arange(n), np.diff(graph.indptr))
    adj[torch.from_numpy(dst), torch.from_numpy(graph.indices.astype(np.int64))] = 1.0
    h = x.to(DTYPE)
    for conv in model.layers:
        h = ref_gcn(conv, adj, h) if isinstance(conv, GCNConv) else ref_gin(conv, adj, h)
    return h


@pytest.mark.parametrize("name", ["gcn", "gin"])
def test_layerwise_evaluation_equals_full_graph(name):
    graph = random_graph(n=150, m=600, feat_dim=6, classes=3)
    torch.manual_seed(0)
    model = build_model(name, 6, 8, 3, 2, dropout=0.5, gin_eps=0.25)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))  # nonzero biases
    sampler = NeighborSampler(graph.indptr, graph.indices, 150, 150, [-1, -1], 0)
    features = ArrayFeatures(graph.features)
    want = dense_full_graph(model.to(DTYPE), graph, torch.from_numpy(graph.features)).float()
    model.float()
    whole = layerwise_inference(model, features, sampler, batch_size=150)
    torch.testing.assert_close(whole, want, atol=1e-4, rtol=1e-4)
    if name == "gin":  # no degree normalisation: the evaluation batches do not matter
        torch.testing.assert_close(
            layerwise_inference(model, features, sampler, 32), want, atol=1e-4, rtol=1e-4
        )
    assert model.training  # mode restored


def test_gcn_normalises_by_block_degrees():
    """By hand: dst 0 <- {1, 2}, dst 1 <- {2}. With the self loops the edges are
    dst 0 <- {1, 2, 0} and dst 1 <- {2, 1}: d_in = (3, 2) and source out-degrees (1, 2, 2),
    as DGL's GraphConv(norm="both") counts them on the MFG."""
    block = Block(2, 3, 0, torch.tensor([0, 2, 3]), torch.tensor([1, 2, 2]), torch.arange(3))
    conv = GCNConv(1, 1, activation=False).to(DTYPE)
    with torch.no_grad():
        conv.fc.weight.fill_(1.0)
        conv.bias.zero_()
    x = torch.tensor([[1.0], [10.0], [100.0]], dtype=DTYPE)
    s = 2**-0.5
    want = torch.tensor([[(1 + 10 * s + 100 * s) / 3**0.5], [(100 * s + 10 * s) * s]], dtype=DTYPE)
    torch.testing.assert_close(conv(block, x), want)


# --------------------------------------------------------------------------- training


@pytest.mark.parametrize(("name", "bound"), [("gcn", 0.77), ("gin", 0.72)])
def test_cora_training(cora_dir, name, bound):
    """Cora's recipe (README) with GCN / GIN, seed 0: measured 80.7 % and 76.3 %."""
    local = LocalGraph.from_graph(load_dataset(f"planetoid:{cora_dir}"))
    config = TrainConfig(
        model=name,
        layers=2,
        fanout=(10, 10),
        hidden=64,
        batch_size=20,
        lr=0.01,
        weight_decay=5e-4,
        epochs=30,
        progress=False,
        eval_every=30,
    )
    history = Trainer(local, config, log=lambda _: None).fit()
    assert history[-1]["test_acc"] >= bound, history[-1]["test_acc"]
    assert history[-1]["loss"] < history[0]["loss"]
