"""Shared fixtures: the Cora files, small hand-built graphs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from distmb.data import Graph
from distmb.data.datasets import BUILTIN_DATASETS
from distmb.data.datasets.planetoid import PLANETOID_SUFFIXES
from distmb.pipeline.sample import Block

# Triton kernels (distmb.cuda) run on CPU tensors under Triton's interpreter, which is chosen
# when a kernel is defined, i.e. before distmb.cuda imports Triton: set it here, where there
# is no GPU to compile them for (an explicit TRITON_INTERPRET is kept). No other code of the
# project, and nothing the tests run, uses Triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

#: A small, fast configuration of the built-in generator for behavioural training tests.
SMALL = "synthetic:nodes=3000,avg_degree=8,feat_dim=16,classes=4"
#: Trainer flags that keep those tests fast.
FAST_FLAGS = [
    "--layers", "2", "--fanout", "4,4", "--hidden", "16", "--batch-size", "100",
    "--no-progress",
]  # fmt: skip

#: Record keys that differ between identical runs: measured times and the run's identity.
TIMING_KEYS = {
    "epoch_time", "mbc", "load_wait", "fwd", "bwd", "ared", "opt", "samples_per_s",
    "eval_time", "comm_wait", "imbalance", "sample", "gather", "run_id", "started",
    "per_rank_time",
}  # fmt: skip


@pytest.fixture(autouse=True)
def _system_malloc_after_each_test():
    """A Trainer built in this process applies ``--malloc retain`` (process-wide); put glibc's
    defaults back after each test so that the next one, e.g. a test of memory being returned
    to the OS, starts from them."""
    yield
    from distmb.core.malloc import configure_malloc

    configure_malloc("system")


def _restore_kernel_selection() -> Iterator[None]:
    from distmb.nn.kernels.dispatch import get_kernels, set_kernels

    before = get_kernels()
    yield
    set_kernels(before)


#: A Trainer built in this process applies ``--kernels`` (process-wide, in
#: ``nn.kernels.dispatch``): the selection in force before each test, and before each module
#: (whose module-scoped fixtures may build Trainers), is put back after it, so that a later test
#: that assumes the default does not see an earlier one's choice.
_kernels_restored_after_each_test = pytest.fixture(autouse=True)(_restore_kernel_selection)
_kernels_restored_after_each_module = pytest.fixture(autouse=True, scope="module")(
    _restore_kernel_selection
)


#: The Planetoid Cora files shipped in the package (``--dataset cora``).
CORA_DIR = Path(BUILTIN_DATASETS["cora"][1])


@pytest.fixture(scope="session")
def cora_dir() -> Path:
    """The shipped Cora directory; a checkout always has it, so a missing file is an error."""
    missing = [s for s in PLANETOID_SUFFIXES if not (CORA_DIR / f"ind.cora.{s}").is_file()]
    assert not missing, f"shipped Cora files missing from {CORA_DIR}: {missing}"
    return CORA_DIR


def random_graph(
    n: int = 400,
    m: int = 2000,
    feat_dim: int = 5,
    classes: int = 3,
    seed: int = 0,
    symmetrize: bool = True,
) -> Graph:
    """A small random graph with a 20/20/20 % split, built through Graph.from_edges."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    features = rng.standard_normal((n, feat_dim)).astype(np.float32)
    labels = rng.integers(0, classes, n).astype(np.int64)
    perm = rng.permutation(n)
    k = n // 5
    return Graph.from_edges(
        "random",
        src,
        dst,
        n,
        features,
        labels,
        np.sort(perm[:k]),
        np.sort(perm[k : 2 * k]),
        np.sort(perm[2 * k : 3 * k]),
        classes,
        symmetrize=symmetrize,
    )


try:
    import kaminpar  # noqa: F401

    HAVE_KAMINPAR = True
except ImportError:
    HAVE_KAMINPAR = False

#: Marks a test that needs the optional KaMinPar bindings (installed by the Makefile's EXTRAS).
needs_kaminpar = pytest.mark.skipif(
    not HAVE_KAMINPAR, reason="optional: pip install 'distmb[kaminpar]'"
)
#: The min-cut engines: every format invariant holds for each.
ENGINES = ["metis", pytest.param("kaminpar", marks=needs_kaminpar)]


@pytest.fixture()
def one_thread():
    """One OpenMP (and so KaMinPar) thread for the test, the previous count restored after:
    KaMinPar is byte-deterministic for a seed only with one thread."""
    from distmb import _C

    before = _C.get_num_threads()
    _C.set_num_threads(1)
    yield
    _C.set_num_threads(before)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` skip, naming why, where torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    reason = f"no CUDA device (torch {torch.__version__}); run `pytest -m cuda` on a GPU node"
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


def compile_triton_in_subprocess(code: str) -> None:
    """Run ``code`` (which compiles Triton kernels for a GPU target, e.g. sm_90, with
    ``triton.compile``: no GPU needed) in a fresh interpreter without ``TRITON_INTERPRET``
    (kernels are bound to the interpreter when defined under it); skip where Triton's NVIDIA
    back end is missing, fail with the child's stderr otherwise."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(Path(__file__).parents[1])}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    if "No module named 'triton.backends.nvidia'" in out.stderr:
        pytest.skip("Triton's NVIDIA back end is not installed")
    assert out.returncode == 0, out.stderr[-3000:]


def run_cli(main, argv: list[str], capsys) -> tuple[int, str, str]:
    """A command's ``main(ARGV)`` in this process: (exit code, stdout, stderr)."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def run_train_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``python -m distmb.train ARGV`` in this process: (exit code, stdout, stderr)."""
    from distmb.cli.train import main as train_main

    return run_cli(train_main, argv, capsys)


#: C++ kernel thread counts the kernel tests run under (results must not depend on them).
KERNEL_THREADS = [1, 2]


@pytest.fixture(params=KERNEL_THREADS, ids=lambda t: f"threads{t}")
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """Run the test with the C++ kernels on this many OpenMP threads (restored after)."""
    from distmb import _C

    before = _C.get_num_threads()
    _C.set_num_threads(request.param)
    yield request.param
    _C.set_num_threads(before)


def make_block(n_dst: int, n_src: int, max_deg: int, seed: int, n_halo: int = 0) -> Block:
    """A random block: up to ``max_deg`` distinct sources per destination (seeded); the first
    ``n_dst`` sources are the destinations, the last ``n_halo`` halo leaves."""
    gen = torch.Generator().manual_seed(seed)
    deg = torch.randint(0, max_deg + 1, (n_dst,), generator=gen)
    indices = torch.cat([torch.randperm(n_src, generator=gen)[: int(d)] for d in deg])
    indptr = torch.zeros(n_dst + 1, dtype=torch.int64)
    torch.cumsum(deg, 0, out=indptr[1:])
    return Block(n_dst, n_src, n_halo, indptr, indices.to(torch.int64), torch.arange(n_src))


def held_elsewhere(lock) -> bool:  # noqa: ANN001 - a threading lock
    """Whether ``lock`` is held now by this thread or another, as another thread sees it
    (it tries to take it without waiting, and gives it back)."""
    import threading

    got: list[bool] = []

    def probe() -> None:
        ok = lock.acquire(blocking=False)
        if ok:
            lock.release()
        got.append(ok)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return not got[0]


def require_triton(device: str) -> None:
    """Skip, with the reason, where Triton's kernels cannot run on ``device`` (CPU tensors
    outside the interpreter, no Triton, no GPU)."""
    from distmb.nn.kernels import triton_aggregate

    ok, why = triton_aggregate.usable(torch.device(device))
    if not ok:
        pytest.skip(why)


@pytest.fixture
def triton_kernels() -> Iterator[None]:
    """``--kernels triton`` for the test (the previous selection restored after it)."""
    from distmb.nn.kernels.dispatch import get_kernels, set_kernels

    before = get_kernels()
    set_kernels("triton")
    yield
    set_kernels(before)
