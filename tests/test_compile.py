"""``--compile``: the Triton layers as custom operators (``distmb.nn.kernels.ops``) and the
compiled training forward (``distmb.engine.compiled``).

On CPU tensors under Triton's interpreter, traced with the ``aot_eager`` back end (the same
graphs as inductor's, no code generated, so the values are the eager ATen ops' and the
comparisons below are to float rounding at most; measured equal bit for bit): every built-in
model traces as one graph without a break (``fullgraph=True``), gives the eager Triton
path's logits and parameter gradients over batches of three different shapes, and compiles
once for them. Inductor's generated code is checked on a GPU (``pytest -m cuda``)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import require_triton
from test_device_path_budget import device_path_trainer
from test_nn import make_block

from distmb.config.train import TrainConfig, compile_problem
from distmb.core.errors import InputError
from distmb.engine import compiled
from distmb.engine.compiled import CompiledForward, compile_refusal
from distmb.nn.kernels import ops
from distmb.nn.kernels.dispatch import set_kernels
from distmb.nn.models import build_model

#: aot_eager runs the eager ATen ops and the same kernels: equal up to a decomposition's
#: float reassociation (measured: equal bit for bit).
RTOL, ATOL = 1e-6, 1e-6
#: Against PyTorch's ops (``--kernels torch``): float32 sums in another order.
TORCH_RTOL, TORCH_ATOL = 1e-5, 1e-5
#: ``(n_dst of the last block, of the first, n_src of the first)`` of three batches: every
#: size differs from batch to batch (one compiled graph must serve them all).
SHAPES = [(5, 12, 30), (7, 15, 33), (9, 20, 41)]
IN_DIM, HIDDEN, CLASSES = 6, 8, 3


def two_layer_blocks(seed: int, n_out: int, n_mid: int, n_in: int) -> list:
    """Blocks of a 2-layer batch: ``n_in`` sources -> ``n_mid`` -> ``n_out`` seeds, every
    destination with an edge (no size 0 or 1 anywhere, which PyTorch specialises)."""
    return [
        make_block(n_mid, n_in, 0, max_deg=4, seed=seed, zero_deg_frac=0.0),
        make_block(n_out, n_mid, 0, max_deg=4, seed=seed + 1, zero_deg_frac=0.0),
    ]


def model_of(name: str) -> torch.nn.Module:
    """``name`` with 2 layers (the first aggregates before its product, the second projects
    first), no dropout, GIN's eps learnt and non-zero."""
    torch.manual_seed(0)
    model = build_model(
        name, in_dim=IN_DIM, hidden=HIDDEN, num_classes=CLASSES, num_layers=2, heads=2,
        dropout=0.0, aggr="mean", gin_eps=0.25, gin_train_eps=True,
    )  # fmt: skip
    for name_, p in model.named_parameters():
        if name_.endswith("bias"):
            with torch.no_grad():
                p.normal_()  # zero at init; make it matter
    return model


def forward_and_grads(fn, model, blocks, x) -> tuple[torch.Tensor, list[torch.Tensor]]:  # noqa: ANN001
    out = fn(blocks, x)
    (out * torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


@pytest.mark.parametrize("name", ["sage", "gcn", "gin", "gat"])
def test_models_trace_as_one_graph_like_the_eager_path(triton_kernels, name):
    """No graph break (fullgraph), the eager path's logits and gradients, one compilation for
    three batches of different sizes."""
    require_triton("cpu")
    model = model_of(name)
    forward = CompiledForward(model, backend="aot_eager")
    for seed, shape in enumerate(SHAPES):
        blocks = two_layer_blocks(seed, *shape)
        x = torch.randn(blocks[0].n_src, IN_DIM, generator=torch.Generator().manual_seed(seed))
        got, got_grads = forward_and_grads(forward, model, blocks, x)
        want, want_grads = forward_and_grads(model, model, blocks, x)
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
        names = [n for n, _ in model.named_parameters()]
        for n, g, w in zip(names, got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL, msg=n)
        # An independent reference (PyTorch's ops, --kernels torch): the nodes' shared
        # forward and backward, which the eager path runs too, checked on the compiled path.
        set_kernels("torch")
        try:
            ref, ref_grads = forward_and_grads(model, model, blocks, x)
        finally:
            set_kernels("triton")
        torch.testing.assert_close(got, ref, rtol=TORCH_RTOL, atol=TORCH_ATOL)
        for n, g, r in zip(names, got_grads, ref_grads, strict=True):
            torch.testing.assert_close(g, r, rtol=TORCH_RTOL, atol=TORCH_ATOL, msg=n)
    assert forward.compiles == 1


def test_a_first_layer_that_projects_first_compiles(triton_kernels):
    """in_dim > hidden: the first layer projects before it aggregates and its features need
    no gradient, so only ``w_neigh``'s gradient needs the backward aggregation (the
    transposed CSR); the eager path's logits and gradients."""
    require_triton("cpu")
    torch.manual_seed(0)
    model = build_model("sage", in_dim=20, hidden=HIDDEN, num_classes=CLASSES, num_layers=2,
                        dropout=0.0)  # fmt: skip
    forward = CompiledForward(model, backend="aot_eager")
    blocks = two_layer_blocks(0, *SHAPES[0])
    x = torch.randn(blocks[0].n_src, 20, generator=torch.Generator().manual_seed(0))
    got, got_grads = forward_and_grads(forward, model, blocks, x)
    want, want_grads = forward_and_grads(model, model, blocks, x)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=RTOL, atol=ATOL)


def test_operators_pass_opcheck(triton_kernels):
    """``torch.library.opcheck``: schemas, fake implementations (shapes under symbolic
    sizes), autograd registrations, for each operator on a small block (x needs a gradient,
    so the backward operators run too)."""
    require_triton("cpu")
    block = make_block(6, 11, 0, max_deg=3, seed=4, zero_deg_frac=0.0)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(11, 5, generator=gen, requires_grad=True)
    t_indptr, t_dst = ops.transposed_csr(block)
    w = [torch.randn(shape, generator=gen, requires_grad=True) for shape in ((3, 5), (3, 5), (3,))]
    w_wide, b_wide = (
        torch.randn(shape, generator=gen, requires_grad=True) for shape in ((7, 5), (7,))
    )
    z = torch.randn(11, 2, 3, generator=gen, requires_grad=True)
    attn = [torch.randn(2, 3, generator=gen, requires_grad=True) for _ in range(2)]
    eps = torch.tensor([0.5], requires_grad=True)
    csr = (block.indptr, block.indices)
    cases = [
        (torch.ops.distmb.transposed_csr, (*csr, block.n_src)),
        (torch.ops.distmb.linear_aggregate, (x, *w, *csr, t_indptr, t_dst, "symmetric_self")),
        (
            torch.ops.distmb.linear_aggregate,
            (x, w_wide, None, b_wide, *csr, t_indptr, t_dst, "gcn"),
        ),
        (torch.ops.distmb.gin_aggregate, (x, eps, *csr, t_indptr, t_dst)),
        (torch.ops.distmb.gat_attention, (z, *attn, *csr, 0.2, True)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


#: The trainer's run: 60 training vertices in batches of 30 (2 iterations an epoch), 2
#: layers (the interpreter's kernels are slow: a small run).
GRAPH = "synthetic:nodes=200,feat_dim=8,classes=3,train_fraction=0.3,test_fraction=0.3"
SMALL_RUN = dict(
    layers=2, fanout=(4, 3), hidden=16, batch_size=30, lr=0.01, device_cache_mb=0.002,
    kernels="triton", dropout=0.0,
)  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh_compiler():
    """Each test compiles from scratch: compiled code is cached per Python function (every
    :class:`CompiledForward` traces the same one), recompilations for other models count
    against the compiler's limit."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_the_compiled_trainer_trains_like_the_eager_one_and_resumes(monkeypatch, tmp_path):
    """``--compile`` (aot_eager on the CPU): the eager run's epoch losses (Adam steps compound
    any difference), one compilation for both epochs, a checkpoint with the plain model's
    keys, and a resumed compiled run whose next epoch is the eager run's."""
    require_triton("cpu")
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    run = dict(SMALL_RUN, checkpoint_dir=str(tmp_path), epochs=3, compile=True)
    trainer = device_path_trainer(GRAPH, **run)
    eager = device_path_trainer(GRAPH, **SMALL_RUN, epochs=3)
    got = [trainer.train_epoch(epoch) for epoch in range(2)]
    want = [eager.train_epoch(epoch) for epoch in range(3)]
    assert trainer.compiled is not None and trainer.compiled.compiles == 1
    trainer._save(1)
    resumed = device_path_trainer(GRAPH, **run, resume=True)
    assert resumed.start_epoch == 2
    got.append(resumed.train_epoch(2))
    for g, w in zip(got, want, strict=True):
        assert g["iterations"] == w["iterations"] == 2
        assert math.isclose(g["loss"], w["loss"], rel_tol=1e-6), (g["loss"], w["loss"])
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["model"]
    assert list(saved) == list(eager.model.state_dict())  # no "_orig_mod." prefix


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(kernels="torch"), "--compile with --kernels torch"),
        (dict(kernels="fused"), "--compile with --kernels fused"),
        (dict(cuda_graphs=True), "--compile with --cuda-graphs"),
        (dict(precision="bf16"), "--compile with --precision bf16"),
        (dict(model="mypkg.models:Net"), "--compile with --model mypkg.models:Net"),
    ],
)
def test_options_that_do_not_trace_are_refused(options, message):
    config = {"compile": True, "sampler": "device", "kernels": "triton", **options}
    with pytest.raises(InputError, match=message):
        TrainConfig(**config)
    assert compile_problem(TrainConfig(sampler="device", kernels="triton")) is None


def test_runs_that_do_not_trace_are_refused():
    assert "one rank only, this run has 2" in compile_refusal(2, built_in=True)
    assert "built-in models only" in compile_refusal(1, built_in=False)
    assert compile_refusal(1, built_in=True) is None


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["sage", "gcn", "gin", "gat"])
def test_inductor_on_a_gpu_gives_the_eager_values(triton_kernels, name):
    """Inductor's generated code around the Triton operators on CUDA tensors: the eager
    path's logits and gradients (inductor may fuse and reorder the elementwise ops: float32
    rounding), one compilation for three batch shapes."""
    require_triton("cuda")
    model = model_of(name).cuda()
    forward = CompiledForward(model)  # inductor
    for seed, shape in enumerate(SHAPES):
        blocks = [b.to("cuda") for b in two_layer_blocks(seed, *shape)]
        x = torch.randn(blocks[0].n_src, IN_DIM, device="cuda")
        got, got_grads = forward_and_grads(forward, model, blocks, x)
        want, want_grads = forward_and_grads(model, model, blocks, x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert forward.compiles == 1
