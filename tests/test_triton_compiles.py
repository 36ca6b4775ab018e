"""Every Triton kernel that a GPU run launches compiles for a GPU (sm_90), with the signature
of the launch.

CI runs the kernels under Triton's interpreter (``TRITON_INTERPRET=1``), which accepts code
that the GPU compiler rejects (a ``tl.where`` of mismatched types, a loop-carried variable
that changes dtype, Python the code generator does not support ...). Here one training epoch
of the GPU configuration on CPU tensors (the Triton back ends forced on, as
``tests/test_device_path_budget.py`` counts it) per :data:`RUNS` records every launch with the
types, specialisations and constexprs a GPU would compile it for
(:mod:`triton_launches`), and the distinct ones are compiled to a cubin in one subprocess
without the interpreter. Every ``@triton.jit`` function of the package must be compiled so
(launched, or called by a launched kernel) or be in :data:`NOT_LAUNCHED` with the reason: a
new kernel that no run reaches fails here until a run launches it or it is listed.

The per-kernel tests (``tests/test_<kernel>*.py``) keep their own compiles where they assert
a property of the generated code (no atomics, ``rem.u64``, rounded divisions ...) or cover
what no CPU run launches (fp16's and bf16's variants of every kernel, sizes of 2**31 and
more).
"""

from __future__ import annotations

import ast
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_device_path_budget import device_path_trainer
from triton_launches import Launch, LaunchRecorder, compile_for_gpu

import distmb

#: The recording runs' graph: tiny (the interpreter is slow), one mini-batch an epoch.
GRAPH = "synthetic:nodes=60,avg_degree=4,classes=3,feat_dim=4,train_fraction=0.1,test_fraction=0.4"
#: The runs' architecture: 2 layers, 2 GAT heads of 4 features.
ARCH = dict(layers=2, fanout=(2, 2), hidden=8, heads=2, batch_size=8, epochs=1)
#: The recorded runs, per built-in model: float32 eagerly, and ``--precision bf16`` (the
#: layers' kernels on bf16 inputs where autocast gives them) with ``--cuda-graphs`` (the
#: padded blocks' refill kernels). They record the same signatures as float32 and bf16 each
#: eager and graphed (the graphed step launches the eager one's layer kernels), in half the
#: time. Evaluation (layer-wise inference) launches the training's kernels with no other
#: signature, so it is not run.
RUNS = [
    dict(model=model, **flags)
    for model in ("sage", "gcn", "gin", "gat")
    for flags in ({}, {"precision": "bf16", "cuda_graphs": True})
]
#: Block shapes follow the widths (the gather's rows x columns, the aggregation's feature
#: tile): the benchmark's widths (100 features, 256 hidden) once, float32 eagerly. (Triton
#: 3.6 failed to compile the gather for sm_90 at 64-128 columns only.)
WIDE_GRAPH = GRAPH.replace("feat_dim=4", "feat_dim=100")
WIDE_RUNS = [dict(model="sage", hidden=256), dict(model="gat", hidden=64)]
#: ``@triton.jit`` functions of the package that no run of :data:`RUNS` compiles, as
#: ``module.name``, with the reason (e.g. a kernel only multi-GPU runs launch).
NOT_LAUNCHED: dict[str, str] = {
    "distmb.pipeline.features.gather_triton._gather_kernel_looped": (
        "the feature gather with its grid capped (DeviceFeatures.gather_programs), which no "
        "training option sets (benchmarks/gpu.py does); tests/test_device_gather_sync_free.py "
        "runs it and compiles it for sm_90"
    ),
}
#: The kernels' dtype under ``--precision fp16`` (a GPU only: CUDA autocast with a gradient
#: scaler) where ``--precision bf16`` gives them ``*bf16``: compiled as such too.
GPU_ONLY_TWINS = {"*bf16": "*fp16"}
#: A ``@triton.jit`` decorator's line, as the text has it.
JIT_LINE = re.compile(r"^\s*@triton\.jit\b", re.MULTILINE)


def jit_functions(root: Path) -> set[str]:
    """``module.name`` of every function under ``root`` (the package) decorated with
    ``@triton.jit`` or ``@triton.jit(...)``."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                ast.unparse(d.func if isinstance(d, ast.Call) else d) == "triton.jit"
                for d in node.decorator_list
            ):
                found.add(f"{module}.{node.name}")
    return found


def twins(launches: list[Launch]) -> list[Launch]:
    """The launches of ``launches`` that have a :data:`GPU_ONLY_TWINS` pointer type, with
    it replaced."""
    out = []
    for launch in launches:
        signature = tuple((p, GPU_ONLY_TWINS.get(t, t)) for p, t in launch.signature)
        if signature != launch.signature:
            out.append(Launch(**{**vars(launch), "signature": signature}))
    return out


def aligned(launches: list[Launch]) -> list[Launch]:
    """Each of ``launches`` with every pointer and specialised int divisible by 16, where
    it was not recorded so: the other extreme of what a GPU run specialises on (its row
    strides and sizes), which the tiny runs rarely reach. (Triton 3.6 failed to lay out a
    select of the gather kernel for sm_90 only when the host row stride was a multiple of
    16.)"""
    divisible = (("tt.divisibility", 16),)
    out = []
    for launch in launches:
        attrs = tuple(
            (path, divisible if launch.signature[path[0]][1] != "constexpr" else given)
            for path, given in launch.attrs
        )
        if attrs != launch.attrs:
            out.append(Launch(**{**vars(launch), "attrs": attrs}))
    return out


@pytest.fixture(scope="module")
def recorded() -> Iterator[LaunchRecorder]:
    """The launches of one epoch of each of :data:`RUNS`."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton's NVIDIA back end")
    from distmb.engine.build import device_stages
    from distmb.pipeline.sample import idmap_triton

    if not idmap_triton.usable(torch.device("cpu"))[0]:
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1, set by conftest)")
    recorder = LaunchRecorder()
    start = time.perf_counter()
    with pytest.MonkeyPatch.context() as patch, recorder.recording():
        patch.setattr(device_stages, "kernel_backend", lambda device: "triton")
        for graph, runs in ((GRAPH, RUNS), (WIDE_GRAPH, WIDE_RUNS)):
            for run in runs:
                trainer = device_path_trainer(
                    graph, kernels="triton", device_cache_mb=0.01, **{**ARCH, **run}
                )
                trainer.train_epoch(0)
    print(f"recorded {sum(recorder.launches.values())} launches of "
          f"{len(RUNS) + len(WIDE_RUNS)} runs in "
          f"{time.perf_counter() - start:.1f} s")  # fmt: skip
    yield recorder


def test_every_launch_compiles_for_hopper(recorded: LaunchRecorder) -> None:
    """Each distinct (kernel, signature, constexprs, options) of the runs, its fp16 twin, and
    each of those with every pointer and specialised int divisible by 16 compiles to a cubin
    for sm_90."""
    launches = recorded.distinct()
    launches += twins(launches)
    launches += aligned(launches)
    report = compile_for_gpu(launches)
    kernels = {(launch.module, launch.name) for launch in launches}
    print(f"compiled {report['compiled']} signatures of {len(kernels)} kernels for sm_90 in "
          f"{report['seconds']} s")  # fmt: skip
    if report["failures"]:
        failures = "\n".join(report["failures"])
        pytest.fail(f"the GPU compiler rejects what the interpreter ran:\n{failures}", False)
    assert report["compiled"] == len(launches) > 0


def test_every_kernel_is_compiled_or_listed(recorded: LaunchRecorder) -> None:
    """Every ``@triton.jit`` function of the package is launched by a run, or called by a
    launched kernel (compiled inside it), or in :data:`NOT_LAUNCHED`; and every entry of
    :data:`NOT_LAUNCHED` is still a kernel that no run reaches."""
    package = Path(distmb.__file__).parent
    defined = jit_functions(package)
    decorators = sum(len(JIT_LINE.findall(p.read_text())) for p in package.rglob("*.py"))
    assert len(defined) == decorators > 0, "the scan must find every @triton.jit of the text"
    reached = {f"{launch.module}.{launch.name}" for launch in recorded.launches}
    reached |= {f"{m}.{n}" for m, n in recorded.called}
    missing = sorted(defined - reached - NOT_LAUNCHED.keys())
    assert not missing, (
        f"@triton.jit functions that no run of RUNS compiles: {missing}; launch them in a run "
        "of tests/test_triton_compiles.py::RUNS, or list them in NOT_LAUNCHED with the reason"
    )
    stale = sorted(name for name in NOT_LAUNCHED if name not in defined or name in reached)
    assert not stale, f"NOT_LAUNCHED entries that are gone or now compiled: {stale}"
