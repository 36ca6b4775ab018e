"""The datasets shipped in the package: ``--dataset cora`` is the Planetoid loader on the
shipped files, and no documented command points outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from distmb.core.errors import InputError
from distmb.data import load_dataset, parse_spec
from distmb.data.datasets import BUILTIN_DATASETS
from distmb.data.datasets.planetoid import load_planetoid

ROOT = Path(__file__).resolve().parents[1]


def test_cora_spec_is_the_shipped_planetoid_files(cora_dir):
    kind, path = parse_spec("cora")
    assert kind == "planetoid" and Path(path) == cora_dir
    assert parse_spec("CORA") == (kind, path)
    named, direct = load_dataset("cora"), load_planetoid(str(cora_dir))
    assert (named.num_nodes, named.num_edges) == (2708, 10556)  # PyG's Cora after symmetrising
    np.testing.assert_array_equal(named.indptr, direct.indptr)
    np.testing.assert_array_equal(named.indices, direct.indices)
    np.testing.assert_array_equal(named.features, direct.features)
    np.testing.assert_array_equal(named.test_idx, direct.test_idx)


def test_shipped_dataset_refuses_a_path():
    with pytest.raises(InputError, match="cora is a shipped dataset and takes no path"):
        parse_spec("cora:/tmp/x")


def test_unknown_kind_lists_the_shipped_datasets():
    with pytest.raises(InputError, match="or a shipped dataset: cora"):
        parse_spec("citeseer")


def test_shipped_files_are_package_data():
    """setup.cfg's package_data names every shipped file (an installed distmb has them)."""
    setup = (ROOT / "setup.cfg").read_text()
    for _kind, path in BUILTIN_DATASETS.values():
        for f in Path(path).iterdir():
            pattern = f"datasets/{Path(path).name}/"
            globs = re.findall(re.escape(pattern) + r"[^,\s]+", setup)
            assert any(Path(f.name).match(g[len(pattern) :]) for g in globs), f


@pytest.mark.parametrize(
    "folder", ["README.md", "docs", "tests", "benchmarks", "slurm", "results/README.md"]
)
def test_no_paths_outside_the_repository(folder):
    """A fresh clone has no ../shared: documented commands and tests use the shipped copy."""
    target = ROOT / folder
    files = [target] if target.is_file() else sorted(p for p in target.rglob("*") if p.is_file())
    # Virtual environments are not the repository's (benchmarks/peers/.venv-dgl, git-ignored).
    files = [f for f in files if not any(p.startswith(".venv") for p in f.relative_to(ROOT).parts)]
    for f in files:
        if f == Path(__file__).resolve():
            continue  # it names the strings it looks for
        if f.suffix in (".md", ".py", ".sbatch", ".sh", ""):
            assert "../shared" not in f.read_text(errors="replace"), f
            assert "shared/datasets" not in f.read_text(errors="replace"), f
