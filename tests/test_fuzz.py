"""Random corruptions of every partition file and of a checkpoint: each gives a clear
one-line error (PartitionError / InputError) or an identical result, never another exception
and never a silently different model or partition."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import random_graph

from distmb.config.train import TrainConfig
from distmb.core.errors import InputError, PartitionError
from distmb.data import PartitionStore
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.engine.checkpoint import CHECKPOINT_FILE, load_checkpoint, state_digest
from distmb.partition import partition_graph

CASES = 12


def corrupt(data: bytes, rng: np.random.Generator) -> bytes:
    """One random corruption: flipped bytes, a truncation, a zeroed range, or garbage
    appended."""
    kind = int(rng.integers(4))
    out = bytearray(data)
    if kind == 0:
        for pos in rng.integers(0, len(out), size=int(rng.integers(1, 5))):
            out[pos] ^= int(rng.integers(1, 256))
    elif kind == 1:
        out = out[: int(rng.integers(0, len(out)))]
    elif kind == 2:
        start = int(rng.integers(0, len(out)))
        out[start : start + int(rng.integers(1, 64))] = bytes(min(64, len(out) - start))
    else:
        out += rng.bytes(int(rng.integers(1, 32)))
    return bytes(out)


@pytest.fixture(scope="module")
def partition(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fuzz") / "p"
    partition_graph(random_graph(n=300, m=1500), 2, out, replicate_halo_features=True)
    return out


def _arrays(store: PartitionStore) -> dict[str, np.ndarray]:
    return {
        name: np.array(getattr(store, name))
        for name in ("indptr", "indices", "orig_ids", "features", "labels", "send_ids")
    }


def test_partition_corruptions_are_caught(partition, tmp_path):
    reference = _arrays(PartitionStore(partition, 0, verify="always"))
    files = sorted(
        p.relative_to(partition).as_posix()
        for p in partition.rglob("*")
        if p.is_file() and p.name != ".verified.json" and not p.parts[-2].endswith("part-1")
    )
    rng = np.random.default_rng(0)
    caught = 0
    for rel in files:
        for case in range(CASES):
            work = tmp_path / f"w{case}"
            shutil.copytree(partition, work, dirs_exist_ok=True)
            (work / rel).write_bytes(corrupt((partition / rel).read_bytes(), rng))
            try:
                store = PartitionStore(work, 0)
                store.node_part()
            except (PartitionError, InputError) as exc:
                assert "\n" not in str(exc) and str(exc)
                caught += 1
            else:  # then nothing that matters changed
                got = _arrays(store)
                for name, array in reference.items():
                    np.testing.assert_array_equal(got[name], array, err_msg=f"{rel}: {name}")
            shutil.rmtree(work)
    assert caught > len(files) * CASES * 0.8, caught


def test_checkpoint_corruptions_are_caught(tmp_path):
    graph = random_graph(n=200, m=1000)
    config = TrainConfig(
        layers=2, fanout=(3, 3), hidden=8, batch_size=40, epochs=1, progress=False,
        checkpoint_dir=str(tmp_path / "ckpt"),
    )  # fmt: skip
    trainer = Trainer(LocalGraph.from_graph(graph), config, log=lambda _: None)
    trainer.fit()
    path = tmp_path / "ckpt" / CHECKPOINT_FILE
    original = path.read_bytes()
    expected = state_digest(torch.load(path, weights_only=True))
    identity, args = trainer.local.identity, config.as_dict()
    rng = np.random.default_rng(1)
    caught = 0
    for _ in range(40):
        path.write_bytes(corrupt(original, rng))
        try:
            state = load_checkpoint(tmp_path / "ckpt", identity=identity, args=args)
        except InputError as exc:
            assert "\n" not in str(exc)
            caught += 1
        else:
            assert state_digest(state) == expected  # identical contents, or caught above
    assert caught >= 20, caught  # the rest (padding, appended bytes) load identically
    # A forged checksum does not help a NaN weight or an absurd epoch through.
    path.write_bytes(original)
    state = torch.load(path, weights_only=True)
    name = next(iter(state["model"]))
    state["model"][name] = state["model"][name].clone().fill_(float("nan"))
    state["sha256"] = state_digest(state)
    torch.save(state, path)
    with pytest.raises(InputError, match=f"weight {name} holds NaN"):
        load_checkpoint(tmp_path / "ckpt", identity=identity, args=args)
    state = torch.load(path, weights_only=True)
    state["model"][name] = torch.zeros_like(state["model"][name])
    state["epoch"] = -3
    state["sha256"] = state_digest(state)
    torch.save(state, path)
    with pytest.raises(InputError, match="records epoch -3"):
        load_checkpoint(tmp_path / "ckpt", identity=identity, args=args)
    assert json.dumps(args)  # the args stay plain JSON
