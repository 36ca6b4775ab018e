"""Fused-Map (distmb.pipeline.sample.idmap): the Triton hash-table kernel (under the interpreter on
CPU) and the torch-ops version against a Python-dict reference of unique + first-seen relabel,
with the destination count on the host or as a device scalar (no host read)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import compile_triton_in_subprocess

from distmb.core.host_reads import HOST_READS
from distmb.pipeline.sample import idmap_triton
from distmb.pipeline.sample.idmap import (
    RepeatedDestinationError,
    fused_map,
    raise_map_errors,
    resolve_backend,
    start_map,
)

#: Devices every test runs on: CPU here, CUDA under ``pytest -m cuda`` on a GPU node.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
BACKENDS = ["torch", "triton"]
INT64_MAX = 2**63 - 1


def require(backend: str, device: str) -> None:
    """Skip, saying why, where ``backend`` cannot run on ``device``."""
    if backend == "triton":
        ok, why = idmap_triton.usable(torch.device(device))
        if not ok:
            pytest.skip(why)


def reference_map(keys: list[int], n_dst: int, n_solid: int | None) -> tuple[list, list, int]:
    """Python dict: (src_ids, local, n_halo): destinations, then new keys in first-seen order,
    solid (< n_solid) before halo."""
    order = list(keys[:n_dst])
    seen = set(order)
    solid, halo = [], []
    for k in keys[n_dst:]:
        if k not in seen:
            seen.add(k)
            (solid if n_solid is None or k < n_solid else halo).append(k)
    src = order + solid + halo
    position = {k: i for i, k in enumerate(src)}
    return src, [position[k] for k in keys], len(halo)


def check(keys: list[int], n_dst: int, n_solid: int | None, backend: str, device: str,
          capacity: int | None = None) -> None:  # fmt: skip
    require(backend, device)
    t = torch.tensor(keys, dtype=torch.int64, device=device)
    got = fused_map(t, n_dst, n_solid, backend=backend, capacity=capacity)  # type: ignore[arg-type]
    src, local, n_halo = reference_map(keys, n_dst, n_solid)
    assert got.src_ids.device.type == device and got.local.device.type == device
    assert got.src_ids.dtype == torch.int64 and got.local.dtype == torch.int64
    assert got.src_ids.cpu().tolist() == src
    assert got.local.cpu().tolist() == local
    assert got.n_halo == n_halo


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_solid", [None, 300])
def test_random_keys_with_duplicates(backend: str, device: str, n_solid: int | None) -> None:
    rng = np.random.default_rng(0)
    dst = rng.choice(400, 50, replace=False).tolist()
    keys = dst + rng.integers(0, 400, 1500).tolist()  # ~4 occurrences per id
    check(keys, len(dst), n_solid, backend, device)


@pytest.mark.parametrize("device", DEVICES)
def test_one_key_repeated_across_many_programs(device: str) -> None:
    """Thousands of copies of a few keys (a hub's; the one-read sampler's unused rows repeat
    ``dst[0]``) over 24 programs, among distinct keys: each copy finds its key's slot (most
    by reading it, not claiming it) and the first position wins, as the reference says."""
    rng = np.random.default_rng(2)
    dst = rng.choice(10**5, 40, replace=False).tolist()
    hub = 10**5 + 7  # first seen at one position in the middle, not among the destinations
    rest = rng.integers(0, 10**5, 6000)
    rest[rng.random(6000) < 0.5] = dst[0]
    rest[3000] = hub
    rest[3001:][rng.random(2999) < 0.3] = hub
    check(dst + rest.tolist(), len(dst), None, "triton", device)


@pytest.mark.parametrize("device", DEVICES)
def test_full_table_forces_long_probe_chains(device: str) -> None:
    # As many distinct keys as slots: every insert after the first collides until it finds
    # the last free slots, probing wraps around the end of the table.
    rng = np.random.default_rng(1)
    distinct = rng.choice(10**6, 64, replace=False).tolist()
    keys = distinct + distinct[::-1]
    check(keys[:128], 5, 500_000, "triton", device, capacity=128)
    check(distinct, 0, None, "triton", device, capacity=64)
    # Keys that are equal modulo the table size collide under a mod hash too.
    check([k * 1024 for k in range(32)] * 2, 3, None, "triton", device, capacity=64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_ids_near_the_integer_limits(backend: str, device: str) -> None:
    big = [INT64_MAX, INT64_MAX - 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 0, 1]
    keys = [2**31, 0] + big + big[::-1] + [INT64_MAX]
    check(keys, 2, None, backend, device)
    check(keys, 2, 2**32, backend, device)  # halo split in the upper range
    check(keys, 0, INT64_MAX, backend, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_and_all_destinations(backend: str, device: str) -> None:
    check([], 0, None, backend, device)
    check([7, 3, 9], 3, 5, backend, device)  # only destinations: they keep their order
    check([7], 0, 5, backend, device)  # a single halo key


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_errors(backend: str, device: str) -> None:
    require(backend, device)
    with pytest.raises(RepeatedDestinationError, match="id 4 occurs more than once") as info:
        fused_map(torch.tensor([4, 2, 4, 1], device=device), 3, backend=backend)  # type: ignore[arg-type]
    assert info.value.key == 4
    with pytest.raises(ValueError, match=r"non-negative \(got -3\)"):
        fused_map(torch.tensor([1, -3, 1], device=device), 1, backend=backend)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="1-D int64"):
        fused_map(torch.tensor([1.0, 2.0], device=device), 0)
    with pytest.raises(ValueError, match=r"n_dst=4 is outside \[0, len\(keys\)=3\]"):
        fused_map(torch.tensor([1, 2, 3], device=device), 4)
    with pytest.raises(ValueError, match="expected one of"):
        fused_map(torch.tensor([1], device=device), 0, backend="cuckoo")  # type: ignore[arg-type]


def map_on_device(keys: list[int], n_dst: int, n_solid: int | None, backend: str,
                  device: str) -> tuple[list[int], list[int], list[int], int]:  # fmt: skip
    """Fused-Map with ``n_dst`` as a device scalar, relabelled without a host read:
    (sources, local, counts, n_computed), read back after; checks the outputs' sizes."""
    t = torch.tensor(keys, dtype=torch.int64, device=device)
    before = HOST_READS.snapshot()[0]
    pending = start_map(t, torch.tensor(n_dst, device=device), n_solid, backend)  # type: ignore[arg-type]
    mapped = pending.finish_on_device()
    assert HOST_READS.snapshot()[0] == before, "no host read before the caller's"
    m = len(keys)
    assert mapped.src_ids.shape == (m + 1,) and mapped.local.shape == (m,)
    counts = mapped.counts.cpu().tolist()
    n_src = n_dst + counts[0] + counts[1]
    src = mapped.src_ids[:n_src].cpu().tolist()
    return src, mapped.local.cpu().tolist(), counts, int(mapped.n_computed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_solid", [None, 300])
def test_device_destination_count(backend: str, device: str, n_solid: int | None) -> None:
    """``n_dst`` as a device scalar: the reference's sources (in the first ``n_src`` of
    ``m + 1`` slots), positions and counts, for counts that put the boundary between a
    destination and a later key equal to it (that key is no repeat) and for the keys of a
    bounded sampler layer (padding ``keys[0]`` past the destinations)."""
    require(backend, device)
    rng = np.random.default_rng(2)
    dst = rng.choice(400, 30, replace=False).tolist()
    others = rng.integers(0, 400, 300).tolist()
    for n_dst in (1, 12, 30):
        padded = dst[:n_dst] + [dst[0]] * (30 - n_dst) + others  # a bounded layer's layout
        boundary = dst[:n_dst] + dst[n_dst - 1 : n_dst] + others  # a repeat right after
        for keys in (padded, boundary):
            src, local, counts, n_computed = map_on_device(keys, n_dst, n_solid, backend, device)
            want_src, want_local, want_halo = reference_map(keys, n_dst, n_solid)
            assert src == want_src and local == want_local
            assert counts == [len(want_src) - n_dst - want_halo, want_halo, 0, 0]
            assert n_computed == n_dst + counts[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_device_destination_count_errors(backend: str, device: str) -> None:
    """Repeated destinations are counted below the device ``n_dst`` only, negative keys
    anywhere; :func:`raise_map_errors` names them as :func:`fused_map` does."""
    require(backend, device)
    keys = [4, 2, 4, 1, 2, 2, 9]
    for n_dst, repeated in ((2, 0), (3, 1), (6, 3)):
        _, _, counts, _ = map_on_device(keys, n_dst, None, backend, device)
        assert counts[2:] == [repeated, 0]
    t = torch.tensor(keys, device=device)
    pending = start_map(t, torch.tensor(6, device=device), None, backend)  # type: ignore[arg-type]
    with pytest.raises(RepeatedDestinationError, match="id 4 occurs more than once"):
        raise_map_errors(t, pending.first, 6, *pending.counts.cpu().tolist()[2:])
    _, _, counts, _ = map_on_device([3, -2, 5, -7], 1, None, "torch", device)
    assert counts[3] == 2
    with pytest.raises(ValueError, match=r"non-negative \(got -2\)"):
        raise_map_errors(torch.tensor([3, -2, 5], device=device), t[:3] > 0, 1, 0, 2)
    with pytest.raises(ValueError, match="one int64 value on the keys' device"):
        start_map(t, torch.tensor([1, 2], device=device), None, backend)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="finish needs n_dst on the host"):
        pending.finish([0, 0, 0, 0])


def test_bad_capacity() -> None:
    with pytest.raises(ValueError, match="power of two >= the 5 keys"):
        idmap_triton.table_capacity(5, 4)
    with pytest.raises(ValueError, match="power of two"):
        idmap_triton.table_capacity(5, 12)
    assert idmap_triton.table_capacity(5) == 16 and idmap_triton.table_capacity(0) == 2


def test_backend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert resolve_backend("auto", cpu) == "torch"
    with pytest.raises(ValueError, match="'triton' cannot run on cpu"):
        resolve_backend("triton", cpu)
    monkeypatch.setattr(idmap_triton, "triton", None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="Triton is not installed"):
        resolve_backend("triton", cpu)
    assert resolve_backend("auto", cpu) == "torch"


def test_kernel_compiles_for_hopper() -> None:
    """The interpreter accepts Python the compiler rejects (e.g. non-constexpr globals):
    compile the kernel to a cubin for sm_90 (no GPU needed) and check its atomics."""
    code = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from distmb.pipeline.sample.idmap_triton import BLOCK, _insert_kernel
sig = {n: "*i64" for n in ("keys_ptr", "table_keys_ptr", "table_pos_ptr", "slot_of_ptr")}
sig.update(m="i64", mask="i64", BLOCK="constexpr")
src = ASTSource(_insert_kernel, sig, constexprs={"BLOCK": BLOCK})
kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32))
ptx = kernel.asm["ptx"]
assert "atom.global.acq_rel.gpu.cas.b64" in ptx and "min.s64" in ptx, ptx
assert len(kernel.asm["cubin"]) > 0
"""
    compile_triton_in_subprocess(code)
