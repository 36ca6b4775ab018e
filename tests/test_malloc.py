"""--malloc: glibc keeps a batch's freed buffers for the next batch (distmb/core/malloc.py).

Checked by what the kernel counts: the minor page faults of allocating, writing and freeing
the same large torch buffer again and again, in a fresh process per policy."""

from __future__ import annotations

import dataclasses
import importlib
import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST_FLAGS, SMALL, random_graph, run_train_cli

from distmb.config.train import TrainConfig
from distmb.core import malloc

#: Bytes of the buffer the probe allocates (well above glibc's 32 MiB mmap-threshold cap).
PROBE_BYTES = 64 << 20
PAGE_BYTES = 4096

PROBE = """
import json, resource, sys
import torch
from distmb.core.malloc import configure_malloc
note = configure_malloc(sys.argv[1])
floats = int(sys.argv[2]) // 4
# glibc settles on where in its heap the buffer goes within a few rounds (an aligned
# request does not fit the hole its predecessor left at first): warm up, then count.
for _ in range(20):
    torch.empty(floats).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    torch.empty(floats).fill_(1.0)
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5
print(json.dumps({"note": note, "faults_per_buffer": faults}))
"""

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="needs glibc"
)


def _faults(policy: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, policy, str(PROBE_BYTES)],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _thp_always() -> bool:
    """Transparent huge pages for every mapping: then fresh mappings fault per 2 MiB."""
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return path.exists() and "[always]" in path.read_text()


@glibc_only
def test_retain_reuses_the_pages_of_freed_buffers():
    retain, system = _faults("retain"), _faults("system")
    assert retain["note"] is None and system["note"] is None
    pages = PROBE_BYTES // PAGE_BYTES
    # retain: the buffer comes back from the heap already mapped (a few faults at most).
    assert retain["faults_per_buffer"] < pages / 50, retain
    if not _thp_always():
        # system: a fresh mmap per buffer, one fault per page written.
        assert system["faults_per_buffer"] > pages / 2, system


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="--malloc must be one of"):
        malloc.configure_malloc("jemalloc")


def test_other_c_libraries_get_a_note_not_an_error(monkeypatch):
    monkeypatch.setattr(malloc.platform, "libc_ver", lambda: ("", ""))
    note = malloc.configure_malloc("retain")
    assert note is not None and "needs glibc" in note
    assert malloc.configure_malloc("system") is None


def test_system_policy_calls_nothing(monkeypatch):
    calls = []
    monkeypatch.setattr(malloc, "_glibc_mallopt", lambda: calls.append(1))
    assert malloc.configure_malloc("system") is None
    assert calls == []


def test_refused_setting_is_reported(monkeypatch):
    monkeypatch.setattr(malloc, "_glibc_mallopt", lambda: lambda param, value: 0)
    assert "refused" in malloc.configure_malloc("retain")


def test_system_puts_back_glibc_defaults_after_retain(monkeypatch):
    calls = []
    monkeypatch.setattr(malloc, "_retained", False)
    monkeypatch.setattr(malloc, "_glibc_mallopt", lambda: lambda p, v: calls.append((p, v)) or 1)
    assert malloc.configure_malloc("retain") is None
    assert calls == [(malloc.M_TRIM_THRESHOLD, malloc.C_INT_MAX), (malloc.M_MMAP_MAX, 0)]
    calls.clear()
    malloc.configure_malloc("system")
    assert calls == list(malloc.GLIBC_DEFAULTS.items())
    calls.clear()
    malloc.configure_malloc("system")  # nothing left to undo
    assert calls == []


def test_trainer_applies_its_config(monkeypatch):
    from distmb.data.local import LocalGraph
    from distmb.engine import Trainer

    asked = []
    monkeypatch.setattr("distmb.engine.build.runtime.configure_malloc", lambda p: asked.append(p))
    config = TrainConfig(layers=1, fanout=(2,), hidden=4, epochs=1, progress=False)
    for policy in malloc.MALLOC_POLICIES:
        Trainer(LocalGraph.from_graph(random_graph()), dataclasses.replace(config, malloc=policy))
    assert asked == list(malloc.MALLOC_POLICIES)


def test_trainer_logs_a_note_where_retain_cannot_apply(monkeypatch):
    from distmb.data.local import LocalGraph
    from distmb.engine import Trainer

    monkeypatch.setattr(malloc.platform, "libc_ver", lambda: ("", ""))
    lines = []
    config = TrainConfig(layers=1, fanout=(2,), hidden=4, epochs=1, progress=False)
    Trainer(LocalGraph.from_graph(random_graph()), config, log=lines.append)
    assert any("--malloc retain: not applied" in line for line in lines)


@pytest.mark.parametrize("policy", malloc.MALLOC_POLICIES)
def test_predict_applies_its_flag(monkeypatch, tmp_path, capsys, policy):
    predict_module = importlib.import_module("distmb.cli.predict")  # the command's flags

    code, _, err = run_train_cli(
        ["--dataset", SMALL, *FAST_FLAGS, "--epochs", "1", "--checkpoint-dir", str(tmp_path)],
        capsys,
    )
    assert code == 0, err
    assert (
        predict_module.build_parser()
        .parse_args(["--checkpoint", str(tmp_path), "--out", "o", "--malloc", policy])
        .malloc
        == policy
    )
    asked = []
    monkeypatch.setattr("distmb.engine.predict.configure_malloc", lambda p: asked.append(p))
    predict = importlib.import_module("distmb.engine.predict").predict
    result = predict(tmp_path, malloc=policy, log=lambda _: None)
    assert asked == [policy]
    assert result.predictions is not None and result.predictions.shape == (result.num_nodes,)
