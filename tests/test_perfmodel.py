"""The scaling model (``distmb.engine.perfmodel``) on inputs with known answers: hand-counted work
of a GraphSAGE iteration, trends that recover the laws they were drawn from, the alpha-beta
collectives, calibration and the epoch projection."""

from __future__ import annotations

import math

import numpy as np
import pytest

from distmb.engine.perfmodel import (
    ComputeModel,
    CoreRates,
    IterationWork,
    LayerShape,
    Network,
    Socket,
    Trend,
    alltoall_seconds,
    calibrate,
    chain_blocks,
    fit_trend,
    iterations_per_epoch,
    project_epoch,
    ring_allreduce_seconds,
    sage_iteration_work,
    small_alltoall_seconds,
)

NET = Network("test", alpha_s=1e-6, link_bandwidth=10e9, ranks_per_node=2)
RATES = CoreRates(flop_rate=100e9, agg_bandwidth=5e9, copy_bandwidth=10e9)


def test_sage_work_counts_by_hand():
    """Two layers, 4 -> 8 -> 2. Layer 0 (8 >= 4: aggregate 4-wide, both weights on the 3
    destinations; forward + weight gradient only): GEMM 2 * (2 * 3 * 4 * 8) * 2 = 768; AGG
    forward 10 edges * (16 + 8) + 3 * 16 = 288. Layer 1 (2 < 8: project the 3 sources and
    the 1 destination, aggregate 2-wide; forward + both gradients): GEMM 2 * (3 + 1) * 8 * 2
    * 3 = 384; AGG forward 3 * (8 + 8) + 1 * 8 = 56, backward 3 * (8 + 12) + 3 * 8 = 84. HEC:
    5 rows of 8-wide layer-1 inputs = 5 * (8 + 32) bytes."""
    work = sage_iteration_work([4, 8, 2], [3, 1], [5, 3], [10, 3], hec_rows=[0, 5])
    assert work.gemm_flops == 768 + 384
    assert work.agg_bytes == 288 + 56 + 84
    assert work.hec_bytes == 5 * (8 + 4 * 8)
    # Layer 1 with halo leaves: its 3 x 8-wide input is concatenated (read and written).
    halo = sage_iteration_work([4, 8, 2], [3, 1], [5, 3], [10, 3], [0, 5], block_halo=[0, 1])
    assert halo.hec_bytes == 5 * (8 + 4 * 8) + 2 * 3 * 8 * 4
    assert work.memory_bytes == work.agg_bytes + work.hec_bytes
    with pytest.raises(ValueError, match="one per layer"):
        sage_iteration_work([4, 8, 2], [3], [5, 3], [10, 3])


def test_sage_work_matches_a_brute_force_count_of_the_model_layers():
    """The GEMM FLOPs of the default 3-layer model against an independent tally of each
    product's (rows x in x out) in the forward pass and which gradients exist."""
    dims = [100, 256, 256, 47]
    dst, src, edges = [900.0, 120.0, 10.0], [2000.0, 900.0, 120.0], [4500.0, 1200.0, 150.0]
    products = []  # (rows, in, out, backward multiplier)
    for layer in range(3):
        c, k = dims[layer], dims[layer + 1]
        grads = 1 if layer == 0 else 2  # weight gradient; input gradient past layer 0
        if k < c:
            products += [(src[layer], c, k, grads), (dst[layer], c, k, grads)]
        else:
            products += [(dst[layer], c, k, grads)] * 2
    want = sum(2 * n * c * k * (1 + g) for n, c, k, g in products)
    assert sage_iteration_work(dims, dst, src, edges).gemm_flops == pytest.approx(want)


@pytest.mark.parametrize("form", ["linear", "power"])
def test_fit_trend_recovers_the_law_it_was_drawn_from(form):
    ranks = [1, 2, 4, 8]
    if form == "linear":
        values = [0.2 + 0.05 * math.log2(p) for p in ranks]
    else:
        values = [3.0 * p**-0.4 for p in ranks]
    trend = fit_trend(ranks, values, form=form)
    if form == "linear":
        assert (trend.intercept, trend.slope) == pytest.approx((0.2, 0.05))
        assert trend(64) == pytest.approx(0.2 + 0.05 * 6)
    else:
        assert trend.slope == pytest.approx(-0.4) and 2**trend.intercept == pytest.approx(3.0)
        assert trend(64) == pytest.approx(3.0 * 64**-0.4)
    np.testing.assert_allclose(trend(np.array(ranks, float)), values)
    assert Trend.from_dict(trend.as_dict()) == trend


def test_fit_trend_least_squares_clipping_and_bad_input():
    # Noisy points: the slope is numpy's least squares in log2 P.
    ranks, values = [2, 4, 8], [0.30, 0.38, 0.40]
    slope, intercept = np.polyfit(np.log2(ranks), values, 1)
    trend = fit_trend(ranks, values, low=0, high=1)
    assert (trend.intercept, trend.slope) == pytest.approx((intercept, slope))
    assert fit_trend([2, 4], [0.5, 0.9], 0, 1)(64) == 1.0  # clipped
    assert fit_trend([2, 4], [0.5, 0.1], 0, 1)(64) == 0.0
    assert fit_trend([4, 4], [1.0, 3.0])(64) == 2.0  # one rank count: flat through the mean
    with pytest.raises(ValueError, match="values > 0"):
        fit_trend([1, 2], [1.0, 0.0], form="power")
    with pytest.raises(ValueError, match=">= 1"):
        fit_trend([0, 2], [1.0, 2.0])
    with pytest.raises(ValueError, match="form"):
        fit_trend([1, 2], [1.0, 2.0], form="cubic")
    with pytest.raises(ValueError, match="rank counts"):
        fit_trend([1, 2], [1.0])


def test_alpha_beta_collectives():
    assert ring_allreduce_seconds(1e6, 1, NET) == 0.0
    # P = 4: 6 steps of latency, 6/4 of the payload at 5 GB/s per rank (2 ranks per link).
    assert ring_allreduce_seconds(1e6, 4, NET) == pytest.approx(6e-6 + 1.5 * 1e6 / 5e9)
    assert alltoall_seconds(2e6, 8, NET) == pytest.approx(7e-6 + 2e6 / 5e9)
    assert alltoall_seconds(2e6, 1, NET) == 0.0
    assert small_alltoall_seconds(64, NET) == pytest.approx(6e-6)
    assert small_alltoall_seconds(5, NET) == pytest.approx(3e-6)


def test_each_layer_is_priced_at_its_widths_rate():
    rates = CoreRates(100e9, 5e9, 10e9, gemm_rates=((4, 8, 50e9),))
    work = sage_iteration_work([4, 8, 2], [3, 1], [5, 3], [10, 3])
    # layer 0 (4 -> 8, 768 FLOPs) at 50 GF/s, layer 1 (8 -> 2, 384 FLOPs) at the default
    assert rates.gemm_seconds(work) == pytest.approx(768 / 50e9 + 384 / 100e9)
    assert rates.gemm_rate(8, 2) == 100e9
    assert RATES.gemm_seconds(IterationWork(1e9, 0.0)) == pytest.approx(0.01)


def test_calibration_reproduces_its_run_and_prices_other_work():
    # priced: 2e9 / 100e9 + 1e8 / 5e9 = 0.04; overhead 0.004; the remaining 0.006 s are
    # passes over 1e7 input-gradient bytes at 5 GB/s (0.002 s each): 3 passes.
    work = IterationWork(gemm_flops=2e9, agg_bytes=1e8, grad_input_bytes=1e7)
    model = calibrate(RATES, work, measured_s=0.05, overhead_s=0.004)
    assert model.grad_passes == pytest.approx(3.0)
    assert model.seconds(work) == pytest.approx(0.05)
    other = IterationWork(gemm_flops=1e9, agg_bytes=0.0, hec_bytes=5e7, grad_input_bytes=5e6)
    assert model.seconds(other) == pytest.approx(0.01 + 0.01 + 3 * 5e6 / 5e9 + 0.004)
    # No input-gradient bytes: the remainder is overhead.
    flat = calibrate(RATES, IterationWork(2e9, 1e8), measured_s=0.05)
    assert flat.overhead_s == pytest.approx(0.01) and flat.grad_passes == 0.0


def test_sage_work_counts_input_gradient_buffers_past_the_first_layer():
    work = sage_iteration_work([4, 8, 2], [3, 1], [5, 3], [10, 3])
    assert work.grad_input_bytes == 3 * 8 * 4  # layer 1: 3 sources of width 8


def test_socket_scaling_caps_bandwidth_at_the_socket():
    socket = Socket("s", cores=40, parallel_efficiency=0.5, stream_bandwidth=100e9)
    assert socket.flop_scale == pytest.approx(20)
    slower = Socket("t", cores=40, parallel_efficiency=0.5, stream_bandwidth=100e9, core_speed=0.5)
    assert slower.flop_scale == pytest.approx(10)
    assert ComputeModel(RATES, 0.002).on_socket(IterationWork(0.0, 0.0), slower) == 0.004
    assert socket.bandwidth_scale(RATES) == pytest.approx(10.0)  # 100 GB/s over 10 per core
    wide = Socket("w", cores=4, parallel_efficiency=1.0, stream_bandwidth=100e9)
    assert wide.bandwidth_scale(RATES) == 4.0  # the cores' own, under the socket's cap
    model = ComputeModel(RATES, overhead_s=0.002, grad_passes=2.0)
    work = IterationWork(gemm_flops=4e10, agg_bytes=5e9, grad_input_bytes=1e9)
    # 4e10 / 2e12 + (5e9 + 2 * 1e9) / (5e9 * 10) + 0.002
    assert model.on_socket(work, socket) == pytest.approx(0.02 + 0.14 + 0.002)


def test_iterations_and_epoch_projection():
    assert iterations_per_epoch(1_207_179, 64, 1000, 1.0) == 19
    assert iterations_per_epoch(1_207_179, 64, 1000, 1.1) == 21
    assert iterations_per_epoch(10, 64, 1000, 1.0) == 1
    socket = Socket("s", cores=10, parallel_efficiency=1.0, stream_bandwidth=1e12)
    model = ComputeModel(RATES, overhead_s=0.0)
    work = IterationWork(gemm_flops=1e10, agg_bytes=0.0)  # 0.01 s on 10 cores
    proj = project_epoch(
        ranks=4,
        iterations=50,
        work=work,
        compute=model,
        socket=socket,
        net=NET,
        mbc_cpu_s=0.05,  # 0.005 s on 10 cores: hidden behind the compute
        allreduce_payload_bytes=1e6,
        push_bytes_per_layer=[0.0, 1e8, 1e6],  # layer 1's push outlasts the compute
        imbalance=1.2,
    )
    compute = 0.01 * 1.2
    push = (3e-6 + 1e8 / 5e9) + (3e-6 + 1e6 / 5e9)
    assert proj.compute_s == pytest.approx(compute)
    assert proj.mbc_s == pytest.approx(0.005)
    assert proj.push_s == pytest.approx(push)
    assert proj.push_exposed_s == pytest.approx(push - compute)
    assert proj.push_counts_s == pytest.approx(2 * 2e-6)
    want_iter = compute + ring_allreduce_seconds(1e6, 4, NET) + 4e-6 + (push - compute)
    assert proj.iteration_s == pytest.approx(want_iter)
    assert proj.epoch_s == pytest.approx(50 * want_iter)
    assert proj.as_dict()["epoch_s"] == pytest.approx(proj.epoch_s)


def test_chain_blocks_builds_a_batch_from_the_seeds_down():
    """Two layers, 10 seeds. Top layer: 4 edges per seed = 40, sources 0.5 * (10 + 40) = 25,
    a fifth of them halo (5), 30 of 40 edges kept; its 20 computed sources are layer 0's
    destinations: 2 edges each = 40, sources 0.75 * 60 = 45, no halo, every edge kept."""
    layers = [LayerShape(2.0, 0.75), LayerShape(4.0, 0.5, halo_fraction=0.2, edge_keep=0.75)]
    blocks = chain_blocks(layers, 10)
    assert blocks == {
        "dst": [20.0, 10.0],
        "src": [45.0, 25.0],
        "halo": [0.0, 5.0],
        "edges_sampled": [40.0, 40.0],
        "edges": [40.0, 30.0],
    }
