"""distmb's Python API end to end: load a graph, bring your own model, train it with the
Trainer, evaluate it exactly, then train it further in your own loop over NeighborLoader.

    python examples/train_api.py                                        # small synthetic graph
    python examples/train_api.py --dataset cora --epochs 20

docs/api.md explains every step; tests/test_api.py runs this script.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import distmb
from distmb.nn import aggregate
from distmb.pipeline.sample import Block


class MeanConv(nn.Module):
    """``h_v = W_s x_v + W_n mean_{u -> v} x_u`` on one block: x_src float32[n_src, in_dim]
    -> float32[n_dst, out_dim]."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.self_fc = nn.Linear(in_dim, out_dim)
        self.neigh_fc = nn.Linear(in_dim, out_dim, bias=False)

    def forward(self, block: Block, x_src: Tensor) -> Tensor:
        return self.self_fc(x_src[: block.n_dst]) + self.neigh_fc(aggregate(block, x_src, "mean"))


class MyGNN(distmb.BlockModel):
    """Two MeanConv layers with ReLU and dropout between them. BlockModel supplies the layer
    loop (forward), forward_layer and layer_dims(): all the Trainer needs."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int, dropout: float = 0.5) -> None:
        super().__init__(layer_dims=[in_dim, hidden])  # each layer's input width
        self.layers.append(MeanConv(in_dim, hidden))
        self.layers.append(MeanConv(hidden, num_classes))
        self.dropout = nn.Dropout(dropout)

    def forward_layer(self, l: int, block: Block, x_src: Tensor) -> Tensor:
        h = self.layers[l](block, x_src)
        return h if l == self.num_layers - 1 else self.dropout(torch.relu(h))


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dataset", default="synthetic:nodes=3000,avg_degree=8,feat_dim=16,classes=4"
    )
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args(argv)

    graph = distmb.load_dataset(args.dataset)  # or distmb.data.from_pyg(data) / from_dgl(g)
    print(graph.summary())
    local = distmb.LocalGraph.from_graph(graph)

    # 1. The Trainer with your model and optimizer (sampling, prefetching, exact evaluation).
    config = distmb.TrainConfig(
        layers=2, fanout=(10, 10), batch_size=64, epochs=args.epochs, progress=False
    )
    torch.manual_seed(0)
    model = MyGNN(graph.feat_dim, 64, graph.num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    trainer = distmb.Trainer(local, config, model=model, optimizer=optimizer)
    history = trainer.fit()  # prints one line per epoch; returns the records
    print(f"Trainer: loss {history[0]['loss']:.3f} -> {history[-1]['loss']:.3f}")

    # 2. Your own loop over the same data path, DGL/PyG style: one epoch more.
    loader = distmb.NeighborLoader(
        graph, graph.train_idx, fanout=[10, 10], batch_size=64, shuffle=True, epoch=args.epochs
    )
    model.train()
    for batch in loader:  # MiniBatch: blocks, x (block 0's input rows), labels, seeds
        loss = F.cross_entropy(model(batch.blocks, batch.x), batch.labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    # 3. Exact evaluation: layer-wise full-neighbour inference over every vertex.
    result = trainer.evaluate()
    print(f"after one epoch of our own: val {result['val_acc']:.3f} test {result['test_acc']:.3f}")
    return {"first_loss": history[0]["loss"], "last_loss": history[-1]["loss"], **result}


if __name__ == "__main__":
    main()
