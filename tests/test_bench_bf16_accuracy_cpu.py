"""benchmarks/bf16_accuracy_cpu.py and the study it shares with tf32_emulated.py
(benchmarks/precision_accuracy.py): the summary against hand-built runs, and the smoke run
(one seed, one epoch of a tiny products-shaped graph) and a GAT run against a spy on the
fused C++ kernels' calls (which ran, and whether on bfloat16 products)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from distmb.engine.trainer import Trainer
from distmb.nn.kernels import cpu_update

REPO = Path(__file__).resolve().parents[1]
#: The fused kernels' entry points that run matrix products (each takes ``bf16=``).
PRODUCTS = {"update_forward", "update_backward", "update_backward_aggregated",
            "gat_projection_forward", "gat_projection_backward"}  # fmt: skip


@pytest.fixture
def bf16(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import bf16_accuracy_cpu

    return bf16_accuracy_cpu


@pytest.fixture
def study(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import precision_accuracy

    return precision_accuracy


class KernelSpy:
    """Stands in for ``cpu_update._C``: counts every product call of the fused kernels as
    ``(run's --precision, phase, entry point, its bf16 flag)``, the run and the phase set by
    the Trainer wrappers of :func:`spy`: ``"setup"`` (the Trainer's construction, which
    checks the model), ``"step"`` (a training step) or ``"other"`` (evaluation)."""

    def __init__(self, real: Any) -> None:  # noqa: ANN401 (the extension module)
        self.real = real
        self.calls: Counter[tuple[str, str, str, bool]] = Counter()
        self.run, self.phase = "none", "other"

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401
        target = getattr(self.real, name)
        if name not in PRODUCTS:
            return target

        def counted(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
            self.calls[self.run, self.phase, name, kwargs["bf16"]] += 1
            return target(*args, **kwargs)

        return counted

    def count(self, run: str, phase: str, bf16: bool, name: str | None = None) -> int:
        """Calls of ``run`` in ``phase`` with that ``bf16`` flag (of entry point ``name``)."""
        return sum(n for (r, p, e, b), n in self.calls.items()
                   if (r, p, b) == (run, phase, bf16) and name in (None, e))  # fmt: skip


@pytest.fixture
def spy(monkeypatch) -> KernelSpy:
    spy = KernelSpy(cpu_update._C)
    monkeypatch.setattr(cpu_update, "_C", spy)
    init, step = Trainer.__init__, Trainer._train_step

    def spied_init(self, local, config, **kwargs):
        spy.run, spy.phase = config.precision, "setup"
        try:
            return init(self, local, config, **kwargs)
        finally:
            spy.phase = "other"

    def spied_step(self, *args, **kwargs):
        spy.phase = "step"
        try:
            return step(self, *args, **kwargs)
        finally:
            spy.phase = "other"

    monkeypatch.setattr(Trainer, "__init__", spied_init)
    monkeypatch.setattr(Trainer, "_train_step", spied_step)
    return spy


def run(precision: str, seed: int, loss: list[float], test: float, best: float) -> dict:
    """A hand-built run record (only what the summary reads)."""
    return {"precision": precision, "seed": seed, "loss_per_epoch": loss, "loss": loss[-1],
            "test_acc": test, "best_test_acc": best, "best_epoch": len(loss) - 1,
            "epochs_run": len(loss)}  # fmt: skip


def test_summary_against_hand_built_runs(study):
    # Baseline "ref" over --seeds 2, 0, 1 (seed 1 stopped early, after 2 epochs), "low" per
    # seed; every value a binary fraction, so that the differences are exact.
    runs = [
        run("low", 0, [1.0, 0.875, 0.625], test=0.875, best=0.625),
        run("ref", 0, [1.0, 0.75, 0.5], test=0.75, best=0.625),
        run("ref", 1, [1.5, 0.5], test=0.5, best=0.75),
        run("ref", 2, [1.125, 0.625, 0.25], test=0.625, best=0.6875),
        run("low", 2, [1.125, 0.375, 0.125], test=0.625, best=0.6875),
        run("low", 1, [2.0, 0.625], test=0.125, best=0.625),
    ]
    out = study.summarize(runs, [2, 0, 1], ("ref", "low"))
    low, ref = out["low"], out["ref"]
    assert list(out) == ["ref", "low"]
    assert ref["test_acc_last_epoch"] == {"median": 0.625, "per_seed": [0.625, 0.75, 0.5],
                                          "range": 0.25}  # fmt: skip
    assert ref["test_acc_best_val_epoch"]["range"] == 0.125
    assert low["loss_last_epoch"]["per_seed"] == [0.125, 0.625, 0.625]
    diffs = low["diff_vs_ref_per_seed"]  # keys named after the baseline
    assert diffs == {"test_acc": [0.0, 0.125, -0.375], "best_test_acc": [0.0, 0.0, -0.125],
                     "loss": [-0.125, 0.125, 0.125]}  # fmt: skip
    assert low["diff_vs_ref_median"] == {"test_acc": 0.0, "best_test_acc": 0.0, "loss": 0.125}
    assert ref["diff_vs_ref_per_seed"]["loss"] == [0.0, 0.0, 0.0]
    # ref's ranges: test 0.25 (|-0.375| beyond), best 0.125 (|-0.125| equal: not beyond),
    # loss 0.5 - 0.25 = 0.25 (0.125 within).
    assert low["beyond_ref_seed_range"] == {"test_acc": True, "best_test_acc": False,
                                            "loss": False}  # fmt: skip
    assert ref["beyond_ref_seed_range"] == {"test_acc": False, "best_test_acc": False,
                                            "loss": False}  # fmt: skip
    # Largest per-epoch loss difference, over the epochs both runs of a seed trained.
    assert low["loss_per_epoch_max_abs_diff"] == [0.25, 0.125, 0.5]
    assert low["epochs_run"] == [3, 3, 2] and low["best_epoch"] == [2, 2, 1]
    # ref's per-epoch ranges over the seeds: 0.5, 0.25, then 0.25 of the two seeds that
    # trained a third epoch: median 0.25.
    assert ref["loss_per_epoch_seed_range_median"] == 0.25
    assert "loss_per_epoch_seed_range_median" not in low


def test_history_record_takes_the_last_and_the_best_epoch(study):
    history = [
        {"loss": 2.0, "val_acc": 0.5, "test_acc": 0.4, "best_epoch": 0, "best_test_acc": 0.4},
        {"loss": 1.0, "val_acc": 0.7, "test_acc": 0.6, "best_epoch": 1, "best_test_acc": 0.6},
        {"loss": 0.5, "val_acc": 0.6, "test_acc": 0.65, "best_epoch": 1, "best_test_acc": 0.6},
    ]
    record = study.history_record("bf16", 3, history, seconds=1.234)
    assert record == {
        "precision": "bf16", "seed": 3, "epochs_run": 3, "loss_per_epoch": [2.0, 1.0, 0.5],
        "val_acc_per_epoch": [0.5, 0.7, 0.6], "test_acc_per_epoch": [0.4, 0.6, 0.65],
        "loss": 0.5, "test_acc": 0.65, "best_test_acc": 0.6, "best_epoch": 1, "seconds": 1.23,
    }  # fmt: skip


def test_study_needs_a_baseline_and_labels(study, bf16):
    with pytest.raises(ValueError, match="baseline"):
        study.Study(("float32",), ("float32",), bf16.train)
    with pytest.raises(ValueError, match="label"):
        study.Study(("float32", "bf16"), ("float32",), bf16.train)


def test_quick_run_trains_bf16_products_only_in_the_bf16_steps(bf16, spy, tmp_path):
    out = tmp_path / "bf16_accuracy_cpu.json"
    assert bf16.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert result["command"] == f"python benchmarks/bf16_accuracy_cpu.py --quick --out {out}"
    native = cpu_update.bf16_native()
    assert result["machine"]["bf16_native"] is native
    assert (result["kernels"], result["sampler"]) == ("fused", "cpp")
    data = result["datasets"]["products"]
    runs = {r["precision"]: r for r in data["runs"]}
    assert list(runs) == ["float32", "bf16"]
    assert runs["float32"]["fused_bf16_products"] is False
    assert runs["float32"]["precision_note"] is None
    assert runs["bf16"]["fused_bf16_products"] is True
    assert ("(AVX512-BF16)" if native else "portable C++") in runs["bf16"]["precision_note"]
    # The kernels: float32 everywhere in the fp32 run; in the bf16 run bfloat16 products in
    # every training step (forward and backward), float32 in evaluation.
    for name in ("update_forward", "update_backward"):
        assert spy.count("fp32", "step", False, name) > 0
        assert spy.count("bf16", "step", True, name) == spy.count("fp32", "step", False, name)
    assert spy.count("fp32", "step", True) == spy.count("fp32", "other", True) == 0
    assert spy.count("bf16", "step", False) == spy.count("bf16", "other", True) == 0
    assert spy.count("bf16", "other", False) == spy.count("fp32", "other", False) > 0
    assert spy.count("bf16", "setup", True) == spy.count("fp32", "setup", True) == 0
    # The summary: one seed, its differences those of the two runs; the products moved the loss.
    diff = runs["bf16"]["loss"] - runs["float32"]["loss"]
    assert diff != 0.0
    summary = data["summary"]
    assert set(summary) == {"float32", "bf16"}
    for precision, entry in summary.items():
        for raw, key in (("test_acc", "test_acc_last_epoch"), ("loss", "loss_last_epoch"),
                         ("best_test_acc", "test_acc_best_val_epoch")):  # fmt: skip
            assert entry[key]["per_seed"] == [runs[precision][raw]]
    assert summary["bf16"]["diff_vs_float32_per_seed"]["loss"] == [diff]
    assert summary["bf16"]["loss_per_epoch_max_abs_diff"] == [abs(diff)]
    assert summary["bf16"]["beyond_float32_seed_range"]["loss"] is True  # one seed: range 0
    assert summary["float32"]["beyond_float32_seed_range"]["loss"] is False


def test_gat_projection_products_go_bf16(bf16, spy):
    """GAT's fused projection takes bfloat16 products in the bf16 run's steps only; two
    float32 runs of a seed train alike (so a seed's difference is the products'); a run's
    record agrees with its per-epoch numbers."""
    args = bf16.parse_args(["--quick", "--nodes", "500", "--epochs", "3"])
    _, graph, recipe = bf16.precision_accuracy.dataset("products", args)
    recipe = {**recipe, "model": "gat", "hidden": 4, "heads": 2}
    plain = bf16.train(graph, recipe, "float32", 0)
    again = bf16.train(graph, recipe, "float32", 0)
    low = bf16.train(graph, recipe, "bf16", 0)
    assert again["loss_per_epoch"] == plain["loss_per_epoch"]
    assert low["loss_per_epoch"] != plain["loss_per_epoch"]
    for name in ("gat_projection_forward", "gat_projection_backward"):
        assert spy.count("bf16", "step", True, name) > 0
        assert spy.count("bf16", "step", False, name) == 0
        assert spy.count("fp32", "step", True, name) == 0
    for record in (plain, low):
        val, test = record["val_acc_per_epoch"], record["test_acc_per_epoch"]
        best = val.index(max(val))  # the first best validation epoch
        assert record["epochs_run"] == len(val) == 3
        assert (record["best_epoch"], record["best_test_acc"]) == (best, test[best])
        assert (record["loss"], record["test_acc"]) == (record["loss_per_epoch"][-1], test[-1])
