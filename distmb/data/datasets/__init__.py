"""``--dataset SPEC`` parsing: one entry point from a spec string to a :class:`Graph`.

Specs (see docs/datasets.md):

- ``synthetic`` or ``synthetic:nodes=100000,avg_degree=50,...``: built-in generator.
- ``planetoid:DIR``: Planetoid ``ind.<name>.*`` files (Cora, CiteSeer, PubMed).
- ``npz:FILE``: GNN-benchmark ``.npz`` (``adj_*``, ``attr_*`` or ``attr_matrix``, ``labels``).
- ``ogb:DIR``: an OGB node-property-prediction directory as downloaded (no ``ogb`` package).
- ``edgelist:DIR``: ``edges.{npy,txt,csv}`` plus ``features.npy`` and ``labels.npy``.
- ``cora``: the Planetoid Cora files shipped inside the package (:data:`BUILTIN_DATASETS`).
"""

from __future__ import annotations

import os
from pathlib import Path

from distmb.core.errors import InputError
from distmb.data.graph import Graph

DATASET_KINDS = ("synthetic", "planetoid", "npz", "ogb", "edgelist")

#: Where the datasets shipped with the package live (``distmb/datasets/``).
BUILTIN_DATASET_DIR = Path(__file__).resolve().parents[2] / "datasets"
#: Named specs of the shipped datasets: name -> (kind, path), as ``KIND:PATH`` would give.
BUILTIN_DATASETS: dict[str, tuple[str, str]] = {
    "cora": ("planetoid", str(BUILTIN_DATASET_DIR / "cora")),
}


def parse_spec(spec: str) -> tuple[str, str]:
    """Split ``KIND[:ARG]`` into ``(kind, arg)``; a shipped dataset's name (``cora``) gives
    its kind and path. Raises :class:`InputError` for unknown kinds."""
    kind, _, arg = spec.partition(":")
    kind = kind.strip().lower()
    if kind in BUILTIN_DATASETS:
        if arg:
            raise InputError(f"--dataset {spec!r}: {kind} is a shipped dataset and takes no path")
        return BUILTIN_DATASETS[kind]
    if kind not in DATASET_KINDS:
        raise InputError(
            f"--dataset {spec!r}: unknown dataset kind {kind!r}; expected one of "
            + ", ".join(f"{k}:..." if k != "synthetic" else k for k in DATASET_KINDS)
            + ", or a shipped dataset: "
            + ", ".join(BUILTIN_DATASETS)
        )
    if kind != "synthetic" and not arg:
        raise InputError(f"--dataset {spec!r}: {kind} needs a path, as in {kind}:PATH")
    if kind != "synthetic":
        arg = os.path.expanduser(arg)  # the shell does not expand "~" after "ogb:"
    return kind, arg


def load_dataset(spec: str, *, symmetrize: bool = True, seed: int = 0) -> Graph:
    """Load the dataset named by ``spec`` (see the module docstring).

    Args:
        spec: dataset spec string.
        symmetrize: add every directed edge in reverse (the default; GNNs here train on
            undirected graphs). Ignored by ``synthetic``, which is undirected by construction.
        seed: seed of the stratified split of datasets that ship no split.
    """
    kind, arg = parse_spec(spec)
    if kind == "synthetic":
        from distmb.data.datasets.synthetic import SyntheticConfig, generate

        return generate(SyntheticConfig.from_spec(arg))
    if kind == "planetoid":
        from distmb.data.datasets.planetoid import load_planetoid

        return load_planetoid(arg, symmetrize=symmetrize)
    if kind == "npz":
        from distmb.data.datasets.npz import load_npz

        return load_npz(arg, symmetrize=symmetrize, seed=seed)
    if kind == "ogb":
        from distmb.data.datasets.ogb import load_ogb

        return load_ogb(arg, symmetrize=symmetrize)
    from distmb.data.datasets.edgelist import load_edgelist

    return load_edgelist(arg, symmetrize=symmetrize, seed=seed)
