"""The device path (``--sampler device``, here on CPU tensors) trains every configuration the
C++ path trains: a configuration matrix, docs/cuda.md "What the device path trains".

Every value of every dimension of :data:`DIMENSIONS` meets every value of every other
dimension in at least one cell (pairwise coverage; :func:`all_pairs` generates the cells
deterministically and :func:`test_cells_cover_every_pair` checks the property by brute
force). Each cell trains on the device path and on the C++ path, on the same partition
with the same seed, and must:

- train, or, for the combinations of :data:`REFUSED` only, be refused with a one-line
  error that docs/cuda.md lists;
- land within :data:`ACC_NOISE` of the C++ path's validation and test accuracy;
- give the same blocks on every rank: with every neighbour taken (``--fanout=-1,-1``) both
  samplers take all edges, so every layer's destination, source, halo-leaf and sampled-edge
  counts are equal, and so are the edges kept after the halo scheme wherever it keeps them
  alike (``--no-hec``, ``--exact-remote``, and layer 0 when the partition replicates halo
  features); with sampling, the top layer's counts, which the seeds alone fix (every seed
  takes ``min(degree, fan-out)`` edges);
- with ``resume``, a run stopped after epoch 1 and resumed from its checkpoint ends with the
  uninterrupted run's record.

The cells of one rank count run in one launch (``mpi_scripts/train_runs.py``).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import TIMING_KEYS
from test_distributed import SCRIPTS, mpiexec

from distmb.data.datasets import load_dataset
from distmb.partition.pipeline import partition_graph

#: A tiny graph that two epochs learn well above chance (3 classes).
DATASET = (
    "synthetic:nodes=300,avg_degree=6,classes=3,feat_dim=8,homophily=0.9,feature_signal=3,"
    "train_fraction=0.5,val_fraction=0.25,test_fraction=0.25"
)
#: Flags of every run: 2 layers, 2 epochs of 3-8 iterations per rank, one thread, no
#: dropout (the paths' only differences are then the sampler's draws and the HEC's hits).
COMMON = ["--layers", "2", "--hidden", "16", "--batch-size", "20", "--epochs", "2",
          "--eval-every", "1", "--dropout", "0", "--seed", "0", "--threads", "1",
          "--no-progress"]  # fmt: skip
#: Learning rates that two epochs converge with (GIN's sums need a smaller one); default 0.05.
LEARNING_RATE = {"gin": 0.01}
#: Fan-outs of the ``sampled`` cells: rows above 5 in-neighbours (37 % of them, up to 40)
#: are sampled, the others taken whole.
SAMPLED_FANOUT = "5,5"
#: Accuracy (of 75 validation or test vertices) the device path may differ from the C++
#: path by: with every neighbour taken the paths train on the same blocks (measured: equal
#: accuracy); sampled, on other draws of the same distribution (measured up to 0.05: GIN on
#: one rank over seeds 0-2; 2 epochs of a tiny graph are far from converged).
ACC_NOISE = {"all": 0.02, "sampled": 0.1}

#: The dimensions of the matrix and their values.
DIMENSIONS: dict[str, tuple] = {
    "ranks": (1, 2, 3),
    "halo_features": ("replicated", "fetched"),
    "halo": ("hec", "exact", "drop"),
    "prefetch": (0, 2),
    "model": ("sage", "gat", "gcn", "gin", "user"),
    "features": ("memory", "mmap", "ooc"),
    "fanout": ("all", "sampled"),
    "precision": ("fp32", "bf16"),
    "graph_placement": ("device", "host"),
    "match_reorder": (False, True),
    "resume": (False, True),
}
#: Dimensions that mean nothing on one rank (no halo leaves): their pairs with ``ranks=1``
#: are not required.
MULTI_RANK_ONLY = ("halo_features", "halo")
#: The combinations the device path refuses, with a one-line error that docs/cuda.md lists
#: (on several ranks: on one, ``--exact-remote`` is not given).
REFUSED: tuple[dict[str, object], ...] = ({"halo": "exact", "match_reorder": True},)

Cell = dict[str, object]
Pair = tuple[tuple[int, int], tuple[int, int]]  # ((dimension, value), (dimension, value)) indices

#: A user's model written from the model contract alone (docs/api.md), not a BlockModel:
#: mean of the in-neighbours next to the vertex's own row, then a linear map.
USER_MODULE = """
import torch


class MeanModel(torch.nn.Module):
    def __init__(self, in_dim, hidden, num_classes, num_layers, dropout):
        super().__init__()
        self.num_layers = num_layers
        self.dims = [in_dim] + [hidden] * (num_layers - 1)
        outs = self.dims[1:] + [num_classes]
        self.linears = torch.nn.ModuleList(
            torch.nn.Linear(2 * i, o) for i, o in zip(self.dims, outs)
        )

    def layer_dims(self):
        return list(self.dims)

    def forward_layer(self, layer, block, x_src):
        deg = torch.diff(block.indptr)
        dst = torch.repeat_interleave(torch.arange(block.n_dst, device=x_src.device), deg)
        total = torch.zeros((block.n_dst, x_src.shape[1]), dtype=x_src.dtype,
                            device=x_src.device)
        total.index_add_(0, dst, x_src[block.indices])
        mean = total / deg.clamp(min=1).unsqueeze(1).to(x_src.dtype)
        h = self.linears[layer](torch.cat([x_src[: block.n_dst], mean], 1))
        return h if layer == self.num_layers - 1 else torch.relu(h)

    def forward(self, blocks, x, *, layer_input=None):
        h = x
        for layer, block in enumerate(blocks):
            if layer_input is not None:
                h = layer_input(layer, block, h)
            h = self.forward_layer(layer, block, h)
        return h
"""
USER_MODEL = "matrix_user_model:MeanModel"


# ---- the cells -----------------------------------------------------------------------------


def inert(cell: dict[int, int], dim: int) -> bool:
    """Whether dimension ``dim``'s value means nothing in ``cell`` (a possibly partial cell,
    dimension index -> value index): one of :data:`MULTI_RANK_ONLY` on one rank."""
    names = list(DIMENSIONS)
    one_rank = cell.get(names.index("ranks")) == DIMENSIONS["ranks"].index(1)
    return one_rank and names[dim] in MULTI_RANK_ONLY


def refused(cell: Cell) -> bool:
    """Whether the device path refuses ``cell`` (a possibly partial ``{dimension: value}``):
    it holds a combination of :data:`REFUSED`, not on one rank."""
    if cell.get("ranks") == 1:
        return False
    return any(
        all(dim in cell and cell[dim] == value for dim, value in combination.items())
        for combination in REFUSED
    )


def holds(cell: dict[int, int], pair: Pair) -> bool:
    """Whether ``cell`` (dimension index -> value index) trains (is not :func:`refused`)
    and holds both values of ``pair``, neither of them inert."""
    names = list(DIMENSIONS)
    if refused({names[d]: DIMENSIONS[names[d]][v] for d, v in cell.items()}):
        return False
    return all(cell.get(dim) == value and not inert(cell, dim) for dim, value in pair)


def all_pairs(
    sizes: list[int], holds: Callable[[dict[int, int], Pair], bool] = holds
) -> list[tuple[int, ...]]:
    """Cells (one value index per dimension of ``sizes``) such that every pair of values of
    two dimensions that a cell can hold (``holds``) is held by one: greedily, the first
    pair not yet held fixed, then every other dimension in order given the value under which
    the cell holds the most pairs not yet held (ties: the lowest index), among the values
    that keep the fixed pair held. Deterministic."""
    full = range(len(sizes))
    pairs = {
        ((i, a), (j, b))
        for i, j in itertools.combinations(full, 2)
        for a in range(sizes[i])
        for b in range(sizes[j])
    }
    # Required: the pairs that a cell of their two values alone holds.
    uncovered = {p for p in pairs if holds(dict(p), p)}
    cells = []
    while uncovered:
        first = min(uncovered)
        chosen = dict(first)
        for dim in full:
            if dim in chosen:
                continue
            options = [v for v in range(sizes[dim]) if holds({**chosen, dim: v}, first)]

            def gain(value: int, dim: int = dim) -> int:
                trial = {**chosen, dim: value}  # noqa: B023 - called in this iteration only
                return sum(holds(trial, p) for p in uncovered)  # noqa: B023

            chosen[dim] = max(options, key=lambda v: (gain(v), -v))
        cells.append(tuple(chosen[d] for d in full))
        uncovered = {p for p in uncovered if not holds(chosen, p)}
    return cells


def matrix() -> list[Cell]:
    """The cells, as ``{dimension: value}``: the pairwise cells that train, then one cell per
    :data:`REFUSED` combination (the first two-rank cell with that combination)."""
    names = list(DIMENSIONS)
    cells = all_pairs([len(DIMENSIONS[n]) for n in names])
    trained = [{n: DIMENSIONS[n][c[k]] for k, n in enumerate(names)} for c in cells]
    two_ranks = next(c for c in trained if c["ranks"] == 2)
    return trained + [{**two_ranks, **combination} for combination in REFUSED]


def test_cells_cover_every_pair():
    """Brute force: every value of a dimension meets every value of every other one in some
    cell that trains (on several ranks for the halo dimensions), every refused combination
    has its cell, and the generator is deterministic."""
    cells = matrix()
    assert cells == matrix()
    trained = [c for c in cells if not refused(c)]
    names = list(DIMENSIONS)
    for a, b in itertools.combinations(names, 2):
        multi_rank = a in MULTI_RANK_ONLY or b in MULTI_RANK_ONLY
        for va, vb in itertools.product(DIMENSIONS[a], DIMENSIONS[b]):
            if multi_rank and ("ranks", 1) in ((a, va), (b, vb)):
                continue  # no such run: one rank has no halo leaves
            if refused({a: va, b: vb}):
                continue
            found = [
                c
                for c in trained
                if c[a] == va and c[b] == vb and (c["ranks"] > 1 or not multi_rank)
            ]
            assert found, f"no cell with {a}={va!r} and {b}={vb!r}"
    for combination in REFUSED:
        assert any(refused(c) and combination.items() <= c.items() for c in cells)
    assert len(trained) <= 30, len(trained)  # a pairwise set, not the product


def test_pair_generator_on_a_known_case():
    """Three binary dimensions: four cells suffice (the product has eight) and cover every
    pair; an unrequired pair need not occur."""

    def plain(cell: dict[int, int], pair: Pair) -> bool:
        return all(cell.get(dim) == value for dim, value in pair)

    cells = all_pairs([2, 2, 2], plain)
    assert len(cells) == 4
    for i, j in itertools.combinations(range(3), 2):
        assert {(c[i], c[j]) for c in cells} == {(0, 0), (0, 1), (1, 0), (1, 1)}

    def second_inert_when_first_is_1(cell: dict[int, int], pair: Pair) -> bool:
        return plain(cell, pair) and not (cell.get(0) == 1 and 1 in dict(pair))

    cells = all_pairs([2, 2, 2], second_inert_when_first_is_1)
    pairs_12 = {(c[1], c[2]) for c in cells if c[0] == 0}  # held only where the first is 0
    assert pairs_12 == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert {(c[0], c[2]) for c in cells} == {(0, 0), (0, 1), (1, 0), (1, 1)}


# ---- the runs --------------------------------------------------------------------------------


def part_key(cell: Cell) -> tuple[int, bool, str]:
    """The partition ``cell`` trains on: parts, replicated halo features, feature layout."""
    replicated = cell["ranks"] > 1 and cell["halo_features"] == "replicated"
    return cell["ranks"], replicated, "ooc" if cell["features"] == "ooc" else "npy"


def part_dir(root: Path, key: tuple[int, bool, str]) -> Path:
    ranks, replicated, layout = key
    return root / f"p{ranks}{'r' if replicated else ''}_{layout}"


def cell_flags(cell: Cell, device_path: bool) -> list[str]:
    """The flags of ``cell``'s run on the device path or on the C++ path (which takes no
    device-path flag)."""
    flags = ["--sampler", "device" if device_path else "cpp", "--prefetch", str(cell["prefetch"])]
    flags += ["--fanout=-1,-1"] if cell["fanout"] == "all" else ["--fanout", SAMPLED_FANOUT]
    flags += {"hec": [], "exact": ["--exact-remote"], "drop": ["--no-hec"]}[cell["halo"]]
    flags += {"user": ["--model", USER_MODEL], "gat": ["--model", "gat", "--heads", "2"]}.get(
        cell["model"], ["--model", str(cell["model"])]
    )
    flags += ["--lr", str(LEARNING_RATE.get(str(cell["model"]), 0.05))]
    flags += ["--features", str(cell["features"])]
    if cell["precision"] == "bf16":
        flags += ["--precision", "bf16", "--kernels", "torch"]  # bf16 on the CPU: torch ops
    if device_path:
        flags += ["--graph-placement", str(cell["graph_placement"])]
        flags += ["--match-reorder"] if cell["match_reorder"] else []
    if cell["ranks"] == 1:
        flags = [f for f in flags if f not in ("--exact-remote", "--no-hec")]
    return flags


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """The partitions every cell needs (by :func:`part_key`) and the user's model module."""
    root = tmp_path_factory.mktemp("matrix")
    graph = load_dataset(DATASET)
    for ranks, replicated, layout in sorted({part_key(c) for c in matrix()}):
        partition_graph(
            graph,
            ranks,
            part_dir(root, (ranks, replicated, layout)),
            seed=0,
            replicate_halo_features=replicated,
            features_layout=layout,
        )
    (root / "matrix_user_model.py").write_text(USER_MODULE)
    return root


def launch(ranks: int, runs: list[dict], root: Path, name: str) -> dict[str, dict]:
    """Run ``runs`` in one launch of ``ranks`` ranks; their status by name."""
    runs_file = root / f"{name}.json"
    runs_file.write_text(json.dumps(runs))
    script = [sys.executable, str(SCRIPTS / "train_runs.py"), str(runs_file)]
    command = script if ranks == 1 else [mpiexec(), "-n", str(ranks), *script]
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(Path(f"{runs_file}.status").read_text())


def records(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def refusal_listed(error: str | None) -> bool:
    """Whether ``error`` is one line whose subject (before its first ``:`` after the
    program's prefix) docs/cuda.md lists."""
    if not error or "\n" in error:
        return False
    subject = error.removeprefix("distmb.train: error: ").split(":")[0]
    docs = (Path(__file__).parents[1] / "docs" / "cuda.md").read_text()
    return bool(subject) and subject in docs


#: Block counters (per rank, int per layer) and when the two paths must agree on them.
ALWAYS_EQUAL = ("block_dst", "block_src", "block_halo", "block_edges_sampled")


def compare_blocks(cell: Cell, dev: dict, cpp: dict) -> list[str]:
    """Differences between the paths' per-rank block counts of one epoch record."""
    problems = []
    layers = len(cpp["per_rank"][0]["block_dst"])
    for rank, (d, c) in enumerate(zip(dev["per_rank"], cpp["per_rank"], strict=True)):
        if cell["fanout"] == "all":
            keys = [(k, layer) for k in ALWAYS_EQUAL for layer in range(layers)]
            if cell["ranks"] == 1 or cell["halo"] in ("exact", "drop"):
                keys += [("block_edges", layer) for layer in range(layers)]
            elif cell["halo_features"] == "replicated":
                keys += [("block_edges", 0)]  # layer 0 reads the replicated rows: no drop
        else:
            top = layers - 1
            keys = [("block_dst", top), ("block_edges_sampled", top)]
        for key, layer in keys:
            if d[key][layer] != c[key][layer]:
                problems.append(
                    f"rank {rank} {key}[{layer}]: device {d[key][layer]}, C++ {c[key][layer]}"
                )
        for layer in range(layers):  # invariants of every record
            if not d["block_edges"][layer] <= d["block_edges_sampled"][layer]:
                problems.append(f"rank {rank} layer {layer}: more edges kept than sampled")
            if not d["block_halo"][layer] <= d["block_src"][layer] - d["block_dst"][layer]:
                problems.append(f"rank {rank} layer {layer}: halo leaves beyond the sources")
    return problems


@pytest.mark.parametrize("ranks", DIMENSIONS["ranks"])
def test_device_path_trains_every_cell_like_the_cpp_path(workspace, ranks):
    cells = [(i, c) for i, c in enumerate(matrix()) if c["ranks"] == ranks]
    assert cells
    runs, out = [], {}
    for i, cell in cells:
        base = ["--part-dir", str(part_dir(workspace, part_key(cell))), *COMMON]
        for path in ("device",) if refused(cell) else ("device", "cpp"):
            out[i, path] = workspace / f"c{i}_{path}.jsonl"
            argv = [*base, *cell_flags(cell, path == "device"), "--results", str(out[i, path])]
            runs.append({"name": f"c{i}_{path}", "argv": argv})
        if cell["resume"] and not refused(cell):
            ckpt = workspace / f"c{i}_ckpt"
            flags = [*base, *cell_flags(cell, True), "--checkpoint-dir", str(ckpt)]
            out[i, "resumed"] = workspace / f"c{i}_resumed.jsonl"
            runs.append({"name": f"c{i}_first", "argv": [*flags, "--epochs", "1"]})
            runs.append(
                {
                    "name": f"c{i}_resumed",
                    "argv": [*flags, "--resume", "--results", str(out[i, "resumed"])],
                }
            )
    status = launch(ranks, runs, workspace, f"ranks{ranks}")

    problems = []
    for i, cell in cells:
        where = f"cell {i} {cell}"
        dev = status[f"c{i}_device"]
        if refused(cell):
            if dev["ok"] or not refusal_listed(dev["error"]):
                problems.append(f"{where}: not refused with a listed error: {dev['error']}")
            continue
        cpp = status[f"c{i}_cpp"]
        assert cpp["ok"], f"{where}: the C++ path failed: {cpp['error']}"
        if not dev["ok"]:
            problems.append(f"{where}: refused: {dev['error']}")
            continue
        dev_rows, cpp_rows = records(out[i, "device"]), records(out[i, "cpp"])
        for key in ("val_acc", "test_acc"):
            a, b = dev_rows[-1][key], cpp_rows[-1][key]
            if abs(a - b) > ACC_NOISE[str(cell["fanout"])]:
                problems.append(f"{where}: {key} device {a:.3f}, C++ {b:.3f}")
        for dev_row, cpp_row in zip(dev_rows, cpp_rows, strict=True):
            problems += [f"{where}: {p}" for p in compare_blocks(cell, dev_row, cpp_row)]
        if cell["resume"]:
            resumed = records(out[i, "resumed"])
            if resumed[-1] != dev_rows[-1]:
                problems.append(f"{where}: resumed {resumed[-1]} != straight {dev_rows[-1]}")
    assert not problems, "\n".join(problems)
