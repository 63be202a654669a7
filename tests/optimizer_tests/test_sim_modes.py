"""Closed loop, capacity search, routing, trace acceptance, process-pool safety."""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from optimizer.closed_loop_workload import NO_FRONTEND, ClosedLoopWorkload
from optimizer.config import (
    InstanceConfig,
    RoutingPolicy,
    ServingConfig,
    SpecMethod,
    SpeculationConfig,
)
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.sim import SLO, max_sustainable_rate, simulate
from optimizer.sim.fleet import alpha_from_acceptance
from optimizer.workload import FixedLength, LognormalLength, Workload, synthetic_workload

C = 0.010
MODEL = "llama-3.1-8b"
CONST = SingleLatencySource(LinearLatency(base_s=C))
LINEAR = SingleLatencySource(LinearLatency(base_s=0.007, per_token_s=3e-5, per_kv_token_s=4e-8))


def test_closed_loop_clients_send_the_next_request_when_the_last_finishes():
    # 2 clients, 4 requests of (10 prompt, 3 output), think 0: each round takes 3 steps.
    c = ClosedLoopWorkload(2, np.full(4, 10), np.full(4, 3), frontend=NO_FRONTEND)
    res = simulate(c, ServingConfig.colocated(MODEL), CONST)
    np.testing.assert_allclose(res.arrival_s, [0, 0, 3 * C, 3 * C])
    np.testing.assert_allclose(res.e2e_s, [3 * C] * 4)


def test_closed_loop_think_time_delays_the_next_request():
    c = ClosedLoopWorkload(1, np.full(2, 10), np.full(2, 2), think_time_s=1.0,
                           frontend=NO_FRONTEND)  # fmt: skip
    res = simulate(c, ServingConfig.colocated(MODEL), CONST)
    np.testing.assert_allclose(res.arrival_s, [0, 2 * C + 1.0])


def test_least_outstanding_tokens_routes_away_from_a_loaded_replica():
    # r0 is huge; round robin would put r2 on replica 0 behind it, least-outstanding does not.
    w = Workload(np.array([0.0, 0.0, 0.001]), np.array([50, 10, 10]), np.array([400, 2, 2]))
    sync = "0.12.0"  # synchronous scheduling: r2 is admitted at the next step boundary
    rr = simulate(w, ServingConfig.colocated(MODEL, num_replicas=2, engine_version=sync), CONST)
    lot = simulate(
        w,
        ServingConfig.colocated(
            MODEL,
            num_replicas=2,
            routing=RoutingPolicy.LEAST_OUTSTANDING_TOKENS,
            engine_version=sync,
        ),
        CONST,
    )
    # round robin: replica 1 serves r1 only (prefill + 1 decode); least outstanding sends r2
    # there too (12 tokens outstanding vs 450), and r2 rides along from step 2
    assert [s.num_steps for s in rr.instances] == [400, 2]
    assert [s.num_steps for s in lot.instances] == [400, 3]


def test_acceptance_alpha_inverts_the_expected_tokens_per_step():
    k = 4
    alpha = np.array([0.0, 0.3, 0.7, 0.95, 1.0])
    length = np.where(
        alpha < 1, (1 - alpha ** (k + 1)) / (1 - np.where(alpha < 1, alpha, 0)), k + 1
    )
    np.testing.assert_allclose(alpha_from_acceptance(length, k), alpha, atol=1e-9)


def test_trace_acceptance_lengths_drive_speculation():
    n = 200
    base = dict(arrival_s=np.arange(n) * 1.0, input_tokens=np.full(n, 50),
                output_tokens=np.full(n, 101))  # fmt: skip
    spec = SpeculationConfig(SpecMethod.EAGLE, 4, 0.0, use_trace_acceptance=True,
                             draft_relative_cost=0.0)  # fmt: skip
    cfg = ServingConfig.colocated(MODEL, speculation=spec)
    full = simulate(Workload(**base, acceptance_length=np.full(n, 5.0)), cfg, CONST)
    none = simulate(Workload(**base, acceptance_length=np.full(n, np.nan)), cfg, CONST)
    assert full.tpot.p50 == pytest.approx(C / 5)  # 5 tokens per step
    assert none.tpot.p50 == pytest.approx(C)  # unknown -> config alpha 0 -> 1 per step


def test_max_sustainable_rate_brackets_the_attainment_target():
    w = synthetic_workload(
        300, 2.0, input_lengths=LognormalLength(400, 0.5), output_lengths=FixedLength(50), seed=1
    )
    cfg = ServingConfig.colocated(MODEL, InstanceConfig(max_num_batched_tokens=1024))
    slo = SLO(ttft_s=0.5, tpot_s=0.03)
    cap = max_sustainable_rate(w, cfg, LINEAR, slo, attainment=0.9, rel_tol=0.05)
    assert cap.attainment >= 0.9 and cap.bounded
    assert cap.request_rate == pytest.approx(w.mean_rate * cap.rate_scale)
    assert cap.request_rate_per_gpu == pytest.approx(cap.request_rate / 1)
    above = simulate(w.rate_scaled(cap.rate_scale * 1.1), cfg, LINEAR)
    assert above.attainment(slo) < 0.9  # beyond the bracket's upper end


def _run(args):
    w, cfg = args
    return simulate(w, cfg, LINEAR, seed=3).e2e_s


def test_inputs_pickle_and_runs_in_a_process_pool_are_deterministic():
    w = synthetic_workload(
        200, 5.0, input_lengths=LognormalLength(300), output_lengths=LognormalLength(60), seed=2
    )
    cfg = ServingConfig.disaggregated(MODEL, num_prefill=1, num_decode=2)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    local = _run((w, cfg))
    with ProcessPoolExecutor(max_workers=2) as pool:
        remote = list(pool.map(_run, [(w, cfg), (w, cfg)]))
    for r in remote:
        np.testing.assert_array_equal(r, local)


def test_result_reports_throughput_slo_and_phase_breakdown():
    w = synthetic_workload(
        300, 8.0, input_lengths=LognormalLength(800), output_lengths=LognormalLength(100), seed=4
    )
    cfg = ServingConfig.colocated(MODEL, InstanceConfig(max_num_batched_tokens=512))
    slo = SLO(ttft_s=0.3, tpot_s=0.02)
    res = simulate(w, cfg, LINEAR, slo=slo)
    assert res.slo_attainment == pytest.approx(res.attainment(slo))
    assert res.goodput == pytest.approx(res.meets(slo).sum() / res.makespan_s)
    assert res.output_token_throughput == pytest.approx(w.total_output_tokens / res.makespan_s)
    ph = res.phases
    assert ph.num_mixed_steps > 0 and ph.decode_tokens_in_mixed_steps > 0
    busy = sum(s.busy_s for s in res.instances)
    assert ph.prefill_only_gpu_s + ph.decode_only_gpu_s + ph.mixed_gpu_s == pytest.approx(busy)
    assert res.ttft.p50 <= res.ttft.p90 <= res.ttft.p99 <= res.ttft.max
    assert res.itl.p50 > 0 and res.latency_is_estimate


def test_capacity_of_a_short_trace_never_exceeds_saturation_throughput():
    # 40 requests and a loose TTFT SLO: compressing the trace would let the whole
    # burst be absorbed by the queue, so only the saturation cap keeps the answer
    # physical (DistServe's capacity is a sustainable rate, not a one-off burst).
    w = synthetic_workload(
        40, 1.0, input_lengths=FixedLength(200), output_lengths=FixedLength(20), seed=4
    )
    cfg = ServingConfig.colocated(MODEL, InstanceConfig(max_num_batched_tokens=2048))
    slo = SLO(ttft_s=30.0, tpot_s=1.0)
    cap = max_sustainable_rate(w, cfg, LINEAR, slo, attainment=0.9, rel_tol=0.05)
    assert cap.bounded and cap.attainment >= 0.9
    assert 0 < cap.request_rate <= cap.saturation_rate * (1 + 1e-9)
    burst = simulate(w.time_scaled(1e-6), cfg, LINEAR)
    assert cap.saturation_rate == pytest.approx(burst.request_throughput)


def test_capacity_is_zero_when_even_a_trickle_misses_the_slo():
    w = synthetic_workload(
        30, 1.0, input_lengths=FixedLength(200), output_lengths=FixedLength(20), seed=5
    )
    cfg = ServingConfig.colocated(MODEL)
    slo = SLO(ttft_s=1e-6, tpot_s=1e-6)  # faster than any step
    cap = max_sustainable_rate(w, cfg, LINEAR, slo)
    assert cap.rate_scale == 0.0 and cap.request_rate == 0.0
    assert cap.attainment == 0.0
