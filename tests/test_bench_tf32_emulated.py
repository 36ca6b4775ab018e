"""benchmarks/tf32_emulated.py: ``to_tf32`` against a float64 reference (round to nearest,
ties to even, at TF32's quantum), the dispatch mode's products against products of operands
rounded by that reference (forward and backward), and the smoke run (one seed, one epoch of a
tiny products-shaped graph) against a dispatch logger of its training steps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from distmb.engine.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
#: float32's largest finite value and TF32's unit in the last place at exponent e: 2**(e-10).
FLOAT32_MAX = float(np.finfo(np.float32).max)
TF32_MANTISSA_BITS, FLOAT32_MIN_EXPONENT = 10, -126
#: A float32 pattern's bits TF32 drops (the low 13 of the mantissa).
DROPPED = (1 << 13) - 1


@pytest.fixture
def tf32(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import tf32_emulated

    return tf32_emulated


def reference_tf32(x: np.ndarray) -> np.ndarray:
    """float32 -> float32: each finite value rounded in float64 to a multiple of TF32's
    quantum at its exponent (``np.round``: half to even), past float32's range infinity;
    NaN and infinities passed through."""
    out = x.astype(np.float64)
    finite = np.isfinite(out) & (out != 0)
    _, e = np.frexp(out[finite])  # |x| = m * 2**e, 0.5 <= m < 1: x's exponent is e - 1
    quantum = np.exp2(np.maximum(e - 1, FLOAT32_MIN_EXPONENT) - TF32_MANTISSA_BITS)
    rounded = np.round(out[finite] / quantum) * quantum
    out[finite] = np.where(np.abs(rounded) > FLOAT32_MAX, np.copysign(np.inf, rounded), rounded)
    return out.astype(np.float32)


def patterns(values: list[int]) -> np.ndarray:
    """float32 values of the given bit patterns (unsigned 32-bit ints)."""
    return np.array(values, dtype=np.uint32).view(np.float32)


#: Bit patterns where rounding is decided: ties to an even and to an odd kept mantissa,
#: either side of a tie, subnormals (one rounding up into the normals), float32's largest
#: value (up to infinity), the largest that stays finite, zeros, infinities.
EDGES = [
    0x3F801000, 0x3F803000, 0x3F800FFF, 0x3F801001, 0x3F802FFF, 0x3F803001, 0x3F7FF000,
    0x00000001, 0x00001000, 0x00003000, 0x00002FFF, 0x007FF000, 0x007FFFFF, 0x00400000,
    0x7F7FFFFF, 0x7F7FF000, 0x7F7FEFFF, 0x7F7FE000, 0x00000000, 0x7F800000,
]  # fmt: skip
NANS = [0x7FC00000, 0x7F800001, 0x7F801000, 0x7FFFFFFF, 0x7F802000]


def test_to_tf32_matches_the_float64_reference(tf32):
    rng = np.random.default_rng(0)
    random_bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    edges = np.array(EDGES, dtype=np.uint32)
    values = np.concatenate([random_bits.view(np.float32), patterns(EDGES),
                             patterns((edges | 0x80000000).tolist())])  # fmt: skip
    values = values[~np.isnan(values)]
    got = tf32.to_tf32(torch.from_numpy(values.copy())).numpy()
    expected = reference_tf32(values)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    assert not (got.view(np.uint32) & DROPPED).any()  # TF32-representable
    # The edges' own outcomes, by hand: a tie to even stays, to odd rounds up; overflow.
    assert got[-40:-20].view(np.uint32)[[0, 1, 14, 15]].tolist() == [
        0x3F800000, 0x3F804000, 0x7F800000, 0x7F800000
    ]  # fmt: skip


def test_to_tf32_keeps_nan_a_nan_of_its_sign(tf32):
    nans = np.array(NANS + [n | 0x80000000 for n in NANS], dtype=np.uint32)
    x = torch.from_numpy(nans.view(np.float32).copy())
    got = tf32.to_tf32(torch.cat([x, torch.ones(3)])).numpy()[: len(nans)]
    assert np.isnan(got).all()
    assert ((got.view(np.uint32) >> 31) == (nans >> 31)).all()
    assert not (got.view(np.uint32) & DROPPED).any()
    with pytest.raises(TypeError, match="float32"):
        tf32.to_tf32(torch.ones(2, dtype=torch.float64))


def rounded64(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded by :func:`reference_tf32`, in float64."""
    return torch.from_numpy(reference_tf32(t.detach().numpy())).double()


def close_to(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: ``got`` (float32) within float32 accumulation error of
    ``rounded(a) @ rounded(b)`` (float64): ``k * 2**-24 * (|a| @ |b|)``."""
    ra, rb = rounded64(a), rounded64(b)
    bound = a.shape[-1] * 2.0**-24 * (ra.abs() @ rb.abs())
    return (got.double() - ra @ rb).abs() <= bound


def test_mode_rounds_both_operands_of_dense_products(tf32):
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(40, 32, generator=gen), torch.randn(32, 24, generator=gen)
    bias = torch.full((24,), 1 + 2.0**-20)  # changed by TF32 rounding: must not be
    with tf32.TF32Products() as mode:
        product = a @ b
        batched = torch.matmul(a.expand(3, 40, 32), b.expand(3, 32, 24))
        addmm = torch.addmm(bias, torch.zeros(40, 32), b)
    assert close_to(product, a, b).all()
    assert close_to(batched, a, b).all()
    assert not close_to(a @ b, a, b).all()  # the plain float32 product is not
    assert torch.equal(addmm, bias.expand(40, 24))
    assert mode.rounded == 3 and mode.float32 == 0


def test_mode_leaves_sparse_products_in_float32(tf32):
    gen = torch.Generator().manual_seed(1)
    dense = torch.randn(6, 5, generator=gen)
    sparse = (torch.rand(4, 6, generator=gen) < 0.5).float().to_sparse_csr()
    with tf32.TF32Products() as mode:
        got = sparse @ dense
    assert torch.equal(got, sparse @ dense)
    assert mode.rounded == 0 and mode.float32 == 1


def test_backward_products_are_rounded(tf32):
    gen = torch.Generator().manual_seed(2)
    layer = torch.nn.Linear(16, 8, bias=False)
    x = torch.randn(30, 16, generator=gen, requires_grad=True)
    g = torch.randn(30, 8, generator=gen)  # the output's gradient
    with tf32.TF32Products() as mode:
        (layer(x) * g).sum().backward()
    assert mode.rounded == 3  # forward, weight gradient, input gradient
    assert close_to(layer.weight.grad, g.t(), x).all()
    assert close_to(x.grad, g, layer.weight).all()
    assert not close_to(g.t() @ x, g.t(), x).all()


class StepLogger(torch.utils._python_dispatch.TorchDispatchMode):
    """Every ``*mm`` ATen op of a training step: per step, the products whose last two
    positional tensors (the multiplied ones) are dense float32 and whether all those were
    TF32-representable; and the products with a sparse operand."""

    def __init__(self) -> None:
        super().__init__()
        self.dense: list[int] = []
        self.sparse = 0
        self.representable = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func.overloadpacket.__name__.rstrip("_").endswith("mm"):
            pair = [a for a in args if isinstance(a, torch.Tensor)][-2:]
            if all(t.layout == torch.strided for t in pair):
                self.dense[-1] += 1
                bits = [t.contiguous().view(torch.int32) & DROPPED for t in pair]
                self.representable &= not any(bool(b.any()) for b in bits)
            else:
                self.sparse += 1
        return func(*args, **(kwargs or {}))


def test_quick_run_rounds_every_product_a_logger_sees(tf32, tmp_path, monkeypatch):
    loggers: dict[str, StepLogger] = {}
    step = Trainer._train_step

    def logged(self, *args, **kwargs):
        emulated = isinstance(self.precision, tf32.EmulatedTF32)
        logger = loggers.setdefault("tf32_emulated" if emulated else "float32", StepLogger())
        logger.dense.append(0)
        with logger:  # below the emulation's mode: sees the operands as rounded
            return step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "_train_step", logged)
    out = tmp_path / "tf32_emulated.json"
    assert tf32.main(["--quick", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert result["command"] == f"python benchmarks/tf32_emulated.py --quick --out {out}"
    assert result["label"].startswith("TF32 emulated on the CPU")
    assert result["machine"]["cpus"] >= 1 and result["kernels"] == "torch"
    data = result["datasets"]["products"]
    runs = {r["precision"]: r for r in data["runs"]}
    assert list(runs) == ["float32", "tf32_emulated"]
    emulated, logger = runs["tf32_emulated"], loggers["tf32_emulated"]
    assert emulated["products_rounded_first_iteration"] == logger.dense[0] > 0
    assert emulated["products_rounded_per_epoch"] == [sum(logger.dense)]
    assert emulated["products_float32"] == logger.sparse > 0
    assert logger.representable  # every dense product's operands were TF32 values
    assert not loggers["float32"].representable  # ... which plain float32's are not
    assert loggers["float32"].dense == logger.dense
    for run in runs.values():
        assert run["epochs_run"] == 1 and len(run["loss_per_epoch"]) == 1
    summary = data["summary"]
    assert set(summary) == {"float32", "tf32_emulated"}
    for precision, entry in summary.items():
        for key in ("test_acc_last_epoch", "test_acc_best_val_epoch", "loss_last_epoch"):
            assert entry[key]["per_seed"] == [entry[key]["median"]]
        diff = runs[precision]["loss"] - runs["float32"]["loss"]
        assert entry["diff_vs_float32_per_seed"]["loss"] == [diff]
        assert entry["loss_per_epoch_max_abs_diff"] == [abs(diff)]  # one epoch: its loss
    assert summary["float32"]["beyond_float32_seed_range"]["loss"] is False
    assert summary["float32"]["loss_per_epoch_seed_range_median"] == 0.0  # one seed


def test_mode_without_rounding_trains_as_float32(tf32, monkeypatch):
    """Only the rounding moves the numbers: the mode with ``to_tf32`` a no-op reproduces
    float32's run exactly."""
    args = tf32.parse_args(["--quick", "--nodes", "500", "--epochs", "2"])
    _, graph, recipe = tf32.dataset("products", args)
    plain = tf32.train(graph, recipe, "float32", 0)
    monkeypatch.setattr(tf32, "to_tf32", lambda x: x)
    unrounded = tf32.train(graph, recipe, "tf32_emulated", 0)
    assert unrounded["products_rounded_first_iteration"] > 0
    for key in ("loss_per_epoch", "val_acc_per_epoch", "test_acc_per_epoch"):
        assert unrounded[key] == plain[key]
