"""The public Python API: ``import distmb`` exports, Trainer(model=, optimizer=) and the
model contract, ``--model package.module:Class``, NeighborLoader, from_pyg / from_dgl, and
the example script of docs/api.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import SMALL, run_train_cli
from torch import nn

import distmb
from distmb.config.train import TrainConfig
from distmb.core.errors import InputError
from distmb.data import Graph, from_dgl, from_pyg, load_dataset
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.checkpoint import CHECKPOINT_FILE
from distmb.nn import BlockModel, aggregate

ROOT = Path(__file__).resolve().parents[1]
#: A small, fast run (2 layers) on :data:`SMALL`.
FAST = dict(layers=2, fanout=(4, 4), hidden=16, batch_size=100, progress=False)


@pytest.fixture(scope="module")
def small() -> Graph:
    return load_dataset(SMALL)


# --------------------------------------------------------------------------- import distmb


def test_public_names_resolve_lazily():
    code = (
        "import sys, distmb; assert 'torch' not in sys.modules, 'import distmb loaded torch'; "
        "from distmb import Trainer, NeighborLoader; assert 'torch' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    for name in distmb.__all__:
        assert getattr(distmb, name) is not None, name
    assert distmb.Trainer is Trainer and distmb.from_pyg is from_pyg
    assert callable(distmb.NeighborLoader) and callable(distmb.partition_graph)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        distmb.nope  # noqa: B018


# --------------------------------------------------------------------------- your own model


class MeanConv(nn.Module):
    """An independent layer: W_s x_v + W_n mean of in-neighbours."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.self_fc = nn.Linear(d_in, d_out)
        self.neigh_fc = nn.Linear(d_in, d_out, bias=False)

    def forward(self, block, x_src):
        return self.self_fc(x_src[: block.n_dst]) + self.neigh_fc(aggregate(block, x_src, "mean"))


class TwoLayer(BlockModel):
    def __init__(self, in_dim: int, hidden: int, num_classes: int, **_: object) -> None:
        super().__init__([in_dim, hidden])
        self.layers.append(MeanConv(in_dim, hidden))
        self.layers.append(MeanConv(hidden, num_classes))

    def forward_layer(self, l, block, x_src):
        h = self.layers[l](block, x_src)
        return torch.relu(h) if l == 0 else h


def test_own_model_and_optimizer_train(small):
    local = LocalGraph.from_graph(small)
    torch.manual_seed(0)
    model = TwoLayer(small.feat_dim, 16, small.num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    config = TrainConfig(**{**FAST, "batch_size": 50}, epochs=4)
    trainer = Trainer(local, config, model=model, optimizer=optimizer, log=lambda _: None)
    assert trainer.model is model and trainer.optimizer is optimizer
    history = trainer.fit()
    assert all("momentum_buffer" in optimizer.state[p] for p in model.parameters())
    assert history[-1]["loss"] < history[0]["loss"]
    assert history[-1]["test_acc"] >= 0.5  # chance: 0.25; measured 0.64
    assert trainer.model_spec == "test_api:TwoLayer"


def _trainer(model, optimizer=None, small_graph=None, **config):
    graph = small_graph or load_dataset(SMALL)
    return Trainer(
        LocalGraph.from_graph(graph),
        TrainConfig(**{**FAST, **config}),
        model=model,
        optimizer=optimizer,
        log=lambda _: None,
    )


class NoHook(nn.Module):
    num_layers = 2

    def layer_dims(self):
        return [16, 16]

    def forward_layer(self, l, block, x):
        return x

    def forward(self, blocks, x):
        return x


class WrongWidth(TwoLayer):
    def forward_layer(self, l, block, x_src):
        h = super().forward_layer(l, block, x_src)
        return h if l == 0 else h[:, :2]


class SkipsHook(TwoLayer):
    def forward(self, blocks, x, halo_inputs=None, *, layer_input=None):
        return super().forward(blocks, x)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: "sage", "expected a torch.nn.Module, got str"),
        (lambda: nn.Linear(16, 4), "lacks num_layers, layer_dims, forward_layer"),
        (lambda: NoHook(), "forward does not take layer_input="),
        (lambda: TwoLayer(16, 8, 4).__class__(17, 8, 4), "layer_dims()[0] is 17"),
        (lambda: WrongWidth(16, 8, 4), "returned (2, 2) for 2 seeds, expected (2, 4)"),
        (lambda: SkipsHook(16, 8, 4), "called layer_input for layers [], expected [0, 1]"),
        (lambda: GraphSAGE3(), "has 3 layers but --fanout lists 2"),
    ],
)
def test_model_contract_errors_at_construction(small, make, message):
    with pytest.raises(InputError) as info:
        _trainer(make(), small_graph=small)
    assert message in str(info.value) and "\n" not in str(info.value)


def GraphSAGE3() -> BlockModel:  # noqa: N802 - a factory named after what it builds
    from distmb.nn import GraphSAGE

    return GraphSAGE(16, 8, 4, num_layers=3)


def test_optimizer_of_another_model_is_refused(small):
    model = TwoLayer(16, 8, 4)
    other = torch.optim.Adam(TwoLayer(16, 8, 4).parameters())
    with pytest.raises(InputError, match="must update the model's parameters"):
        _trainer(model, other, small_graph=small)
    with pytest.raises(InputError, match="must update the model's parameters"):
        _trainer(None, other, small_graph=small)  # the built-in model's parameters differ


def test_contract_check_leaves_rng_and_mode_alone(small):
    model = TwoLayer(16, 8, 4)
    model.train()
    torch.manual_seed(3)
    before = torch.get_rng_state()
    from distmb.nn.user import check_block_model

    check_block_model(model, 16, 4, 2)
    assert torch.equal(torch.get_rng_state(), before) and model.training


# --------------------------------------------------------------------------- --model spec

USER_MODULE = """
import torch
from distmb.nn import BlockModel, SAGEConv


class Sage(BlockModel):
    def __init__(self, in_dim, hidden, num_classes, num_layers, dropout):
        super().__init__([in_dim] + [hidden] * (num_layers - 1))
        dims = self._dims + [num_classes]
        for l in range(num_layers):
            last = l == num_layers - 1
            self.layers.append(SAGEConv(dims[l], dims[l + 1], activation=not last,
                                        dropout=dropout))


class NeedsDepth(Sage):
    def __init__(self, in_dim, depth):
        super().__init__(in_dim, 8, 4, depth, 0.0)


class Broken(Sage):
    def __init__(self, in_dim, hidden, num_classes):
        raise RuntimeError("no GPU")


NOT_A_CLASS = 3
"""


#: ``python -m distmb.train ARGV`` in this process: (exit code, stdout, stderr).
run_cli = run_train_cli


CLI_FAST = ["--dataset", SMALL, "--layers", "2", "--fanout", "4,4", "--hidden", "16",
            "--batch-size", "100", "--no-progress"]  # fmt: skip


def test_cli_user_model_trains_and_checkpoint_records_the_spec(tmp_path, capsys, monkeypatch):
    (tmp_path / "my_models.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    ckpt = tmp_path / "ckpt"
    argv = [*CLI_FAST, "--model", "my_models:Sage", "--epochs", "2", "--checkpoint-dir", str(ckpt)]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "training my_models:Sage" in out and "final: epoch" in out
    state = torch.load(ckpt / CHECKPOINT_FILE, weights_only=True)
    assert state["args"]["model"] == "my_models:Sage" and state["model_spec"] == "my_models:Sage"
    assert state["args"]["lr"] == 0.003  # the documented default of a user's model
    # Same run, built by hand: the CLI passed in_dim, hidden, num_classes, num_layers, dropout.
    import my_models

    torch.manual_seed(0)
    model = my_models.Sage(16, 16, 4, 2, 0.5)
    assert {k: v.shape for k, v in model.state_dict().items()} == {
        k: v.shape for k, v in state["model"].items()
    }
    code, out, err = run_cli([*argv[:-2], "--checkpoint-dir", str(ckpt), "--resume",
                              "--epochs", "3"], capsys)  # fmt: skip
    assert code == 0 and "resumed" in out, err


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz:Model", "cannot import module 'no_such_module_xyz'"),
        ("my_models2:Nope", "module 'my_models2' has no 'Nope'"),
        ("my_models2:NOT_A_CLASS", "'NOT_A_CLASS' is not a torch.nn.Module class"),
        ("my_models2:NeedsDepth", "__init__ requires depth, which distmb does not pass"),
        ("my_models2:Broken", "failed: RuntimeError: no GPU"),
        ("gcnii", "--model must be one of sage, gat, gcn, gin or package.module:Class"),
    ],
)
def test_cli_user_model_errors(tmp_path, capsys, monkeypatch, spec, message):
    (tmp_path / "my_models2.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run_cli([*CLI_FAST, "--model", spec, "--epochs", "1"], capsys)
    assert code == 2
    assert message in err and "Traceback" not in err and err.count("\n") == 1, err


# --------------------------------------------------------------------------- NeighborLoader


def test_neighbor_loader_batches(small):
    seeds = small.train_idx
    loader = distmb.NeighborLoader(small, seeds, fanout=[3, 5], batch_size=64, shuffle=True,
                                   seed=7, prefetch=1)  # fmt: skip
    assert len(loader) == -(-seeds.size // 64) and loader.num_layers == 2
    epochs = []
    for _ in range(2):
        batches = list(loader)
        assert len(batches) == len(loader)
        got = np.concatenate([b.seeds for b in batches])
        assert np.array_equal(np.sort(got), np.sort(seeds))  # every seed once per epoch
        assert max(b.size for b in batches) <= 64
        for b in batches:
            assert np.array_equal(b.blocks[-1].dst_ids.numpy(), b.seeds)
            assert torch.equal(b.labels, torch.from_numpy(small.labels[b.seeds]))
            src = b.blocks[0].src_ids.numpy()
            assert torch.equal(b.x, torch.from_numpy(small.features[src]))
            assert b.blocks[1].n_src == b.blocks[0].n_dst
            # Sampled edges are graph edges: block 1's edges into its destinations.
            blk = b.blocks[1]
            for v in range(min(blk.n_dst, 5)):
                nbrs = blk.src_ids[blk.indices[blk.indptr[v] : blk.indptr[v + 1]]].numpy()
                vid = int(blk.dst_ids[v])
                row = small.indices[small.indptr[vid] : small.indptr[vid + 1]]
                assert set(nbrs) <= set(row) and len(nbrs) == min(5, len(row))
        epochs.append(got)
    assert not np.array_equal(epochs[0], epochs[1])  # reshuffled
    # The trainer's batches for the same seed and epoch (one place for the split).
    trainer = Trainer(LocalGraph.from_graph(small), TrainConfig(**{**FAST, "batch_size": 64},
                      seed=7), log=lambda _: None)  # fmt: skip
    loader.set_epoch(1)
    for mine, theirs in zip(loader.batches(1), trainer.epoch_batches(1), strict=True):
        assert np.array_equal(mine, theirs)
    # Same arguments, same batches (blocks included).
    again = distmb.NeighborLoader(small, seeds, [3, 5], 64, shuffle=True, seed=7, prefetch=0)
    first, repeat = next(iter(again)), list(distmb.NeighborLoader(small, seeds, [3, 5], 64,
                                            shuffle=True, seed=7))[0]  # fmt: skip
    assert torch.equal(first.blocks[0].indices, repeat.blocks[0].indices)


def test_neighbor_loader_mask_order_and_errors(small):
    mask = np.zeros(small.num_nodes, dtype=bool)
    mask[[5, 3, 9]] = True
    batches = list(distmb.NeighborLoader(small, torch.from_numpy(mask), [2], batch_size=2))
    assert [b.seeds.tolist() for b in batches] == [[3, 5], [9]]
    n = small.num_nodes
    for seeds, message in [
        (np.array([1, 1]), "repeated"),
        (np.array([n]), f"in [0, {n})"),
        (np.array([], dtype=np.int64), "no seeds"),
        (np.ones(3, dtype=bool), f"bool[{n}]"),
        (np.array([0.5]), "integer"),
    ]:
        with pytest.raises(InputError, match=message.replace("[", r"\[").replace(")", r"\)")):
            distmb.NeighborLoader(small, seeds, [2], batch_size=2)
    with pytest.raises(InputError, match="batch_size"):
        distmb.NeighborLoader(small, [0], [2], batch_size=0)
    with pytest.raises(InputError, match="fan-out"):
        distmb.NeighborLoader(small, [0], [0], batch_size=1)


# --------------------------------------------------------------------------- from_pyg / from_dgl

#: A hand-built graph: 5 vertices, directed edges (source -> target).
EDGES = [(0, 1), (1, 2), (2, 0), (3, 4), (1, 1), (0, 1)]  # a self loop and a duplicate
#: Its in-edge CSR once symmetrised, self loop and duplicate removed, by hand.
IN_NEIGHBOURS = {0: [1, 2], 1: [0, 2], 2: [0, 1], 3: [4], 4: [3]}
#: Without symmetrising: the sources of the edges into each vertex.
IN_DIRECTED = {0: [2], 1: [0], 2: [1], 3: [], 4: [3]}


def _fields():
    x = torch.arange(10, dtype=torch.float32).view(5, 2)
    y = torch.tensor([0, 1, 2, 1, -1])
    masks = [torch.tensor(m, dtype=torch.bool) for m in
             ([1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0])]  # fmt: skip
    return x, y, masks


def pyg_standin(**drop):
    x, y, (tr, va, te) = _fields()
    edge_index = torch.tensor(EDGES).T.contiguous()
    fields = dict(x=x, y=y, edge_index=edge_index, train_mask=tr, val_mask=va, test_mask=te)
    return SimpleNamespace(**{k: v for k, v in fields.items() if k not in drop})


class DGLStandIn:
    ntypes = ["_N"]
    canonical_etypes = [("_N", "_E", "_N")]

    def __init__(self, **drop):
        x, y, (tr, va, te) = _fields()
        data = dict(feat=x, label=y, train_mask=tr, val_mask=va, test_mask=te)
        self.ndata = {k: v for k, v in data.items() if k not in drop}
        self._src, self._dst = torch.tensor(EDGES).T

    def edges(self):
        return self._src, self._dst

    def num_nodes(self):
        return 5


def expected_csr(neighbours):
    indptr = np.cumsum([0] + [len(neighbours[v]) for v in range(5)])
    return indptr, np.concatenate([sorted(neighbours[v]) for v in range(5)])


def check_graph(graph: Graph, neighbours=IN_NEIGHBOURS):
    indptr, indices = expected_csr(neighbours)
    assert np.array_equal(graph.indptr, indptr) and np.array_equal(graph.indices, indices)
    assert np.array_equal(graph.features, np.arange(10, dtype=np.float32).reshape(5, 2))
    assert graph.labels.tolist() == [0, 1, 2, 1, -1] and graph.num_classes == 3
    assert graph.train_idx.tolist() == [0, 1] and graph.val_idx.tolist() == [2]
    assert graph.test_idx.tolist() == [3]


def test_from_pyg_and_from_dgl_standins():
    check_graph(from_pyg(pyg_standin()))
    check_graph(from_dgl(DGLStandIn()))
    check_graph(from_pyg(pyg_standin(), symmetrize=False), IN_DIRECTED)
    check_graph(from_dgl(DGLStandIn(), symmetrize=False), IN_DIRECTED)


@pytest.mark.parametrize("field", ["x", "y", "edge_index", "train_mask", "val_mask", "test_mask"])
def test_from_pyg_missing_field(field):
    with pytest.raises(InputError, match=f"from_pyg: the data has no '{field}'"):
        from_pyg(pyg_standin(**{field: True}))


@pytest.mark.parametrize("field", ["feat", "label", "train_mask", "test_mask"])
def test_from_dgl_missing_field(field):
    with pytest.raises(InputError, match=f"from_dgl: ndata has no '{field}'"):
        from_dgl(DGLStandIn(**{field: True}))


def test_interop_malformed_fields():
    data = pyg_standin()
    data.edge_index = data.edge_index.T
    with pytest.raises(InputError, match=r"edge_index must be int\[2, E\]"):
        from_pyg(data)
    data = pyg_standin()
    data.y = torch.zeros(5, 3)
    with pytest.raises(InputError, match="multi-label"):
        from_pyg(data)
    data = pyg_standin()
    data.train_mask = torch.zeros(5, 4, dtype=torch.bool)
    with pytest.raises(InputError, match="one split"):
        from_pyg(data)
    hetero = DGLStandIn()
    hetero.ntypes = ["a", "b"]
    with pytest.raises(InputError, match="heterogeneous"):
        from_dgl(hetero)
    with pytest.raises(InputError, match="expected a DGLGraph"):
        from_dgl(pyg_standin())


def test_from_pyg_real_data_trains_and_partitions(tmp_path, small):
    pyg = pytest.importorskip("torch_geometric.data", reason="torch_geometric is not installed")
    x, y, (tr, va, te) = _fields()
    data = pyg.Data(x=x, y=y, edge_index=torch.tensor(EDGES).T, train_mask=tr, val_mask=va,
                    test_mask=te)  # fmt: skip
    check_graph(from_pyg(data))
    # A larger graph through PyG's Data: trains and partitions with no files in between.
    data = pyg.Data(
        x=torch.from_numpy(small.features),
        y=torch.from_numpy(small.labels),
        edge_index=torch.from_numpy(
            np.stack([small.indices, np.repeat(np.arange(small.num_nodes),
                                               np.diff(small.indptr))]).astype(np.int64)
        ),  # fmt: skip
        **{f"{s}_mask": torch.from_numpy(np.isin(np.arange(small.num_nodes), idx))
           for s, idx in zip(("train", "val", "test"),
                             (small.train_idx, small.val_idx, small.test_idx), strict=True)},
    )  # fmt: skip
    graph = from_pyg(data, name="small-pyg")
    assert np.array_equal(graph.indptr, small.indptr) and np.array_equal(
        graph.indices, small.indices
    )
    # Training on it repeats training on the original graph exactly.
    runs = [
        Trainer(LocalGraph.from_graph(g), TrainConfig(**FAST, epochs=1), log=lambda _: None).fit()
        for g in (graph, small)
    ]
    for key in ("loss", "train_acc", "val_acc", "test_acc"):
        assert runs[0][0][key] == runs[1][0][key], key
    distmb.partition_graph(graph, parts=2, out_dir=str(tmp_path / "parts"), seed=0)
    from distmb.data import PartitionStore

    assert PartitionStore(str(tmp_path / "parts"), part=1).num_parts == 2


# --------------------------------------------------------------------------- the example


def test_example_script_runs():
    """examples/train_api.py as docs/api.md shows it (CI runs it through this test)."""
    script = ROOT / "examples" / "train_api.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--dataset",
         "synthetic:nodes=1000,avg_degree=8,feat_dim=16,classes=4", "--epochs", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Trainer: loss" in proc.stdout and "after one epoch of our own: val" in proc.stdout


# --------------------------------------------------------------------------- several ranks


def test_user_model_spec_trains_on_two_ranks_with_the_cache(tmp_path, small):
    """``--model package.module:Class`` under a real ``mpiexec -n 2`` with the historical
    embedding cache: the layer_input hook of the contract carries the halo rows (hits > 0)."""
    from test_distributed import mpirun

    parts = tmp_path / "parts"
    distmb.partition_graph(small, parts=2, out_dir=str(parts), seed=0)
    results = tmp_path / "run.jsonl"
    argv = ["-m", "distmb.train", "--part-dir", str(parts), "--model", "distmb.nn.models:GraphSAGE",
            "--layers", "2", "--fanout", "4,4", "--hidden", "16", "--batch-size", "50",
            "--lr", "0.01", "--epochs", "3", "--threads", "1", "--no-progress",
            "--results", str(results)]  # fmt: skip
    proc = mpirun(2, argv, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [__import__("json").loads(line) for line in results.read_text().splitlines()]
    assert [r["model"] for r in records] == ["distmb.nn.models:GraphSAGE"] * 3
    losses = [r["loss"] for r in records]
    assert losses == sorted(losses, reverse=True), losses
    assert records[-1]["test_acc"] >= 0.35  # chance: 0.25; measured 0.435
    assert records[-1]["hec_hit_rate"][1] > 0, records[-1]  # layer 1's halo rows: the cache
