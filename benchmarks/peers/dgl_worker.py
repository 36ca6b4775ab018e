"""DGL's side of ``benchmarks/peers/dgl_vs_distmb.py``: runs in the DGL virtual environment
(``benchmarks/peers/setup_dgl.sh``), never imports distmb.

The coordinator starts it as ``.venv-dgl/bin/python dgl_worker.py`` and drives it with one
JSON command per line on stdin; every reply is one line on stdout that starts with
:data:`REPLY_PREFIX` (anything else a library prints is not a reply). Commands:

- ``{"cmd": "setup", "graph": PATH, "model": "sage"|"gat", "fanout": [5, 10, 15],
  "hidden": 256, "heads": 4, "batch_size": 1000, "dropout": 0.5, "lr": 0.003, "seed": 0,
  "threads": 2, "eval_batch_size": 4096, "gat_variant": "dgl"|"paper", "num_workers": 0}``:
  loads the graph file
  (:mod:`peer_graph`), builds DGL's ``NeighborSampler``/``DataLoader`` and the model, replies
  with the versions and the load time;
- ``{"cmd": "epoch", "epoch": E}``: one training epoch, reply with its timings (seconds):
  ``epoch_time``, ``epoch_cpu`` (CPU seconds of all the process's threads; not of the
  DataLoader's worker processes with ``num_workers`` > 0), ``sample`` (``next()`` of the
  DataLoader: DGL's neighbour sampling and block construction, or the wait for a worker's),
  ``gather`` (feature and label rows of the batch), ``mbc`` (their sum), ``fwd`` (model and
  loss), ``bwd`` (``zero_grad`` and ``backward``), ``opt`` (``optimizer.step``), the loss,
  the training accuracy and the mean block sizes per layer;
- ``{"cmd": "evaluate"}``: exact val/test accuracy by layer-wise full-neighbour inference;
- ``{"cmd": "quit"}``.

The phase boundaries are distmb's Trainer's (``distmb.engine.trainer``): FWD includes the
loss, BWD the ``zero_grad``, and the loop's bookkeeping (``loss.item()``, accuracy) is in
the epoch time only. An error replies ``{"error": traceback}`` and the worker goes on.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

import dgl
import numpy as np
import peer_graph
import torch
import torch.nn.functional as F
from dgl.nn import GATConv, SAGEConv
from dgl.nn.functional import edge_softmax
from torch import nn

#: Every reply line starts with this (the coordinator ignores other stdout lines).
REPLY_PREFIX = "@@dgl-worker "

#: Gain of the Xavier initialisation DGL's SAGEConv/GATConv use (ReLU's), as in distmb.
RELU_GAIN = nn.init.calculate_gain("relu")
#: LeakyReLU slope on the attention logits (DGL's, PyG's and distmb's default).
GAT_NEGATIVE_SLOPE = 0.2
#: ``gat_variant`` of the setup command: DGL's ``GATConv``, or distmb's equation on DGL ops.
GAT_VARIANTS = ("dgl", "paper")


class SAGE(nn.Module):
    """GraphSAGE as distmb's ``GraphSAGE``: ``SAGEConv(mean)`` layers ``in -> hidden -> ...
    -> classes``, ReLU and dropout after every layer but the last (DGL's example model)."""

    def __init__(self, in_dim: int, hidden: int, classes: int, layers: int, dropout: float) -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [classes]
        self.layers = nn.ModuleList(SAGEConv(dims[l], dims[l + 1], "mean") for l in range(layers))
        self.dropout = nn.Dropout(dropout)

    def layer(self, l: int, block: Any, h: torch.Tensor) -> torch.Tensor:
        """Layer ``l`` on one block: float[n_src, width] -> float[n_dst, next width]."""
        h = self.layers[l](block, h)
        if l != len(self.layers) - 1:
            h = self.dropout(torch.relu(h))
        return h

    def forward(self, blocks: list[Any], x: torch.Tensor) -> torch.Tensor:
        h = x
        for l, block in enumerate(blocks):
            h = self.layer(l, block, h)
        return h


class PaperGATConv(nn.Module):
    """distmb's ``GATConv`` (equation 2 of DistGNN-MB) on DGL's message passing: ``z =
    act(W x + b)`` on every source, then the attention and aggregation of DGL's ``GATConv``
    (the same built-in ``u_add_v``, ``edge_softmax`` and ``u_mul_e``/``sum`` kernels). DGL's
    ``GATConv`` applies the bias and the activation after the aggregation instead.

    Output: float[n_dst, heads, out_dim]."""

    def __init__(self, in_dim: int, out_dim: int, heads: int, activation: bool) -> None:
        super().__init__()
        self.heads, self.out_dim, self.activation = heads, out_dim, activation
        self.fc = nn.Linear(in_dim, heads * out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(heads * out_dim))
        self.attn_l = nn.Parameter(torch.empty(1, heads, out_dim))
        self.attn_r = nn.Parameter(torch.empty(1, heads, out_dim))
        nn.init.xavier_normal_(self.fc.weight, gain=RELU_GAIN)  # as DGL's GATConv
        nn.init.xavier_normal_(self.attn_l, gain=RELU_GAIN)
        nn.init.xavier_normal_(self.attn_r, gain=RELU_GAIN)

    def forward(self, block: Any, x: torch.Tensor) -> torch.Tensor:
        with block.local_scope():
            z = self.fc(x) + self.bias
            if self.activation:
                z = torch.relu(z)
            z = z.view(-1, self.heads, self.out_dim)
            n_dst = block.num_dst_nodes()
            el = (z * self.attn_l).sum(-1, keepdim=True)
            er = (z[:n_dst] * self.attn_r).sum(-1, keepdim=True)
            block.srcdata.update({"ft": z, "el": el})
            block.dstdata["er"] = er
            block.apply_edges(dgl.function.u_add_v("el", "er", "e"))
            scores = F.leaky_relu(block.edata.pop("e"), GAT_NEGATIVE_SLOPE)
            block.edata["a"] = edge_softmax(block, scores)
            block.update_all(dgl.function.u_mul_e("ft", "a", "m"), dgl.function.sum("m", "ft"))
            return block.dstdata["ft"]


class GAT(nn.Module):
    """GAT with distmb's widths: hidden layers ``heads`` heads of ``hidden`` each,
    concatenated, dropout on the output; the last layer ``heads`` heads of ``classes``,
    averaged. ``variant="dgl"``: DGL's own ``GATConv`` with ReLU (bias and activation after
    the aggregation); ``variant="paper"``: :class:`PaperGATConv`, distmb's equation (bias and
    ReLU before the attention). The same products, softmax and aggregation either way."""

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        classes: int,
        layers: int,
        heads: int,
        dropout: float,
        variant: str,
    ) -> None:
        super().__init__()
        if variant not in GAT_VARIANTS:
            raise ValueError(f"unknown GAT variant {variant!r}; expected one of {GAT_VARIANTS}")
        dims = [in_dim] + [hidden * heads] * (layers - 1)
        convs = []
        for l in range(layers):
            last = l == layers - 1
            width = classes if last else hidden
            if variant == "dgl":
                conv: nn.Module = GATConv(
                    dims[l],
                    width,
                    heads,
                    negative_slope=GAT_NEGATIVE_SLOPE,
                    activation=None if last else torch.relu,
                    allow_zero_in_degree=True,
                )
            else:
                conv = PaperGATConv(dims[l], width, heads, activation=not last)
            convs.append(conv)
        self.layers = nn.ModuleList(convs)
        self.dropout = nn.Dropout(dropout)

    def layer(self, l: int, block: Any, h: torch.Tensor) -> torch.Tensor:
        """Layer ``l`` on one block: float[n_src, width] -> float[n_dst, next width]."""
        h = self.layers[l](block, h)  # [n_dst, heads, width]
        if l == len(self.layers) - 1:
            return h.mean(1)
        return self.dropout(h.flatten(1))

    def forward(self, blocks: list[Any], x: torch.Tensor) -> torch.Tensor:
        h = x
        for l, block in enumerate(blocks):
            h = self.layer(l, block, h)
        return h


class Worker:
    """The DGL side's state between commands."""

    def __init__(self) -> None:
        self.ready = False

    def setup(self, cmd: dict[str, Any]) -> dict[str, Any]:
        start = time.perf_counter()
        torch.set_num_threads(int(cmd["threads"]))
        torch.manual_seed(int(cmd["seed"]))
        dgl.seed(int(cmd["seed"]))
        arrays = peer_graph.load_graph_arrays(cmd["graph"])
        src, dst = peer_graph.edge_list(arrays)
        num_nodes = arrays["indptr"].size - 1
        self.graph = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=num_nodes)
        self.features = torch.from_numpy(arrays["features"])
        self.labels = torch.from_numpy(arrays["labels"])
        self.splits = {k: torch.from_numpy(arrays[k]) for k in peer_graph.SPLITS}
        classes = int(arrays["num_classes"])
        fanout = [int(f) for f in cmd["fanout"]]  # input layer first, as distmb's --fanout
        layers = len(fanout)
        if cmd["model"] == "sage":
            self.model: nn.Module = SAGE(
                self.features.shape[1], cmd["hidden"], classes, layers, cmd["dropout"]
            )
        elif cmd["model"] == "gat":
            self.model = GAT(
                self.features.shape[1],
                cmd["hidden"],
                classes,
                layers,
                cmd["heads"],
                cmd["dropout"],
                cmd["gat_variant"],
            )
        else:
            raise ValueError(f"unknown model {cmd['model']!r}; expected sage or gat")
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=float(cmd["lr"]))
        # DGL's NeighborSampler lists fan-outs per GNN layer, input layer first, and samples
        # from the seeds with the last one: [5, 10, 15] gives the seeds 15 neighbours.
        sampler = dgl.dataloading.NeighborSampler(fanout)
        workers = int(cmd.get("num_workers", 0))
        self.loader = dgl.dataloading.DataLoader(
            self.graph,
            self.splits["train_idx"],
            sampler,
            batch_size=int(cmd["batch_size"]),
            shuffle=True,
            drop_last=False,
            # Worker processes make batches ahead (kept across epochs, so no epoch pays for
            # starting them); 0: in next() on this process.
            num_workers=workers,
            persistent_workers=workers > 0,
        )
        self.eval_batch_size = int(cmd["eval_batch_size"])
        self.ready = True
        return {
            "load_s": round(time.perf_counter() - start, 3),
            "versions": {
                "dgl": dgl.__version__,
                "torch": torch.__version__,
                "numpy": np.__version__,
                "python": sys.version.split()[0],
            },
            "torch_threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", ""),
            "num_nodes": num_nodes,
            "num_edges": int(self.graph.num_edges()),
            "parameters": sum(p.numel() for p in self.model.parameters()),
        }

    def epoch(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.model.train()
        seconds = dict.fromkeys(("sample", "gather", "fwd", "bwd", "opt"), 0.0)
        total_loss, correct, seen, iterations = 0.0, 0, 0, 0
        layer_sizes: list[np.ndarray] = []  # per batch: [layers, 3] (n_src, n_dst, edges)
        clock = time.perf_counter
        cpu = time.process_time()  # every thread of this process
        start = clock()
        batches = iter(self.loader)
        while True:
            t0 = clock()
            try:
                input_nodes, output_nodes, blocks = next(batches)
            except StopIteration:
                seconds["sample"] += clock() - t0
                break
            t1 = clock()
            x = self.features.index_select(0, input_nodes)
            y = self.labels.index_select(0, output_nodes)
            t2 = clock()
            logits = self.model(blocks, x)
            loss = F.cross_entropy(logits, y)
            t3 = clock()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            t4 = clock()
            self.optimizer.step()
            t5 = clock()
            seconds["sample"] += t1 - t0
            seconds["gather"] += t2 - t1
            seconds["fwd"] += t3 - t2
            seconds["bwd"] += t4 - t3
            seconds["opt"] += t5 - t4
            total_loss += loss.item() * y.shape[0]
            correct += int((logits.argmax(1) == y).sum())
            seen += y.shape[0]
            iterations += 1
            layer_sizes.append(
                np.array([[b.num_src_nodes(), b.num_dst_nodes(), b.num_edges()] for b in blocks])
            )
        epoch_time = clock() - start
        epoch_cpu = time.process_time() - cpu
        sizes = np.mean(layer_sizes, axis=0)
        return {
            "epoch": int(cmd["epoch"]),
            "iterations": iterations,
            "loss": total_loss / max(seen, 1),
            "train_acc": correct / max(seen, 1),
            "epoch_time": epoch_time,
            "epoch_cpu": epoch_cpu,
            "mbc": seconds["sample"] + seconds["gather"],
            **seconds,
            "blocks": [
                {"n_src": float(s), "n_dst": float(d), "edges": float(e)} for s, d, e in sizes
            ],
        }

    @torch.no_grad()
    def evaluate(self, _cmd: dict[str, Any]) -> dict[str, Any]:
        """Exact accuracy: every layer over all vertices with all in-neighbours (DGL's
        layer-wise inference), as distmb's ``layerwise_inference``."""
        start = time.perf_counter()
        self.model.eval()
        sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1)
        loader = dgl.dataloading.DataLoader(
            self.graph,
            torch.arange(self.graph.num_nodes()),
            sampler,
            batch_size=self.eval_batch_size,
            shuffle=False,
            drop_last=False,
            num_workers=0,
        )
        h = self.features
        for l in range(len(self.model.layers)):
            out = None
            for input_nodes, output_nodes, blocks in loader:
                y = self.model.layer(l, blocks[0], h.index_select(0, input_nodes))
                if out is None:
                    out = torch.empty(self.graph.num_nodes(), y.shape[1])
                out[output_nodes] = y
            h = out
        pred = h.argmax(1)
        acc = {
            split: float((pred[ids] == self.labels[ids]).float().mean()) if ids.numel() else 0.0
            for split, ids in (("val", self.splits["val_idx"]), ("test", self.splits["test_idx"]))
        }
        return {
            "val_acc": acc["val"],
            "test_acc": acc["test"],
            "eval_time": round(time.perf_counter() - start, 3),
        }


def reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(REPLY_PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    worker = Worker()
    handlers = {"setup": worker.setup, "epoch": worker.epoch, "evaluate": worker.evaluate}
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            cmd = json.loads(line)
            name = cmd.get("cmd")
            if name == "quit":
                reply({"ok": True})
                return
            if name not in handlers:
                raise ValueError(f"unknown command {name!r}; expected {sorted(handlers)} or quit")
            if name != "setup" and not worker.ready:
                raise ValueError(f"command {name!r} before setup")
            reply({"ok": True, **handlers[name](cmd)})
        except Exception:  # every failure goes back to the coordinator as a reply
            reply({"ok": False, "error": traceback.format_exc()})


if __name__ == "__main__":
    main()
