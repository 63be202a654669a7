"""The trace evaluator: the sizing rate and the screening window, screens that size
units, fleets of units, verification against `simulate`, the cache, configs that
reject the trace's longest request."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optimizer.config import InstanceConfig, ServingConfig
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.search.attainment import Load
from optimizer.search.evaluation import EvalSettings, EvalStage, EvalStatus
from optimizer.search.sizing import fleet_of, unit_of
from optimizer.search.space import config_key
from optimizer.search.trace_evaluator import TraceEvaluator
from optimizer.search.windows import busiest_start, peak_rate
from optimizer.sim import SLO, simulate
from optimizer.workload import FixedLength, LognormalLength, Workload, synthetic_workload

LAT = SingleLatencySource(LinearLatency(base_s=0.007, per_token_s=2.7e-5, per_kv_token_s=4e-8))
CFG = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_seqs=64))


def _workload():
    return synthetic_workload(
        200, 4.0, input_lengths=LognormalLength(800, 0.5, max_tokens=4000),
        output_lengths=FixedLength(60), seed=1,
    )  # fmt: skip


def _evaluator(**kw) -> TraceEvaluator:
    settings = dict(slo=SLO(2.0, 0.05), gpu_budget=4, screen_requests=100, seed=0)
    settings.update(kw)
    return TraceEvaluator.for_trace(_workload(), LAT, EvalSettings(**settings))


def test_peak_rate_and_busiest_window_by_hand():
    arrivals = np.array([0.0, 1.0, 2.0, 2.5, 2.6, 2.7, 10.0, 20.0])
    # [2.0, 3.0) holds 4 arrivals; [0, 10) holds 6 (10.0 excluded)
    assert peak_rate(arrivals, 1.0) == pytest.approx(4.0)
    assert peak_rate(arrivals, 10.0) == pytest.approx(0.6)
    # A window longer than the trace: its mean rate, as Workload.mean_rate counts it
    # (7 gaps over 20 s).
    assert peak_rate(arrivals, 60.0) == pytest.approx(7 / 20)
    # The 3 consecutive requests with the shortest span start at index 3 (2.5..2.7).
    assert busiest_start(arrivals, 3) == 3
    assert busiest_start(arrivals, 8) is None and busiest_start(arrivals, 0) is None


def test_fleet_of_multiplies_replicas_or_pd_groups():
    assert fleet_of(CFG, 3).num_replicas == 3 and fleet_of(CFG, 3).num_gpus == 3
    pd = ServingConfig.disaggregated(
        "llama-3.1-8b", InstanceConfig(), InstanceConfig(), num_prefill=1, num_decode=2
    )
    big = fleet_of(pd, 2)
    assert (big.num_prefill, big.num_decode, big.num_gpus) == (2, 4, 6)
    assert unit_of(big, 2) == pd and unit_of(fleet_of(CFG, 3), 3) == CFG
    with pytest.raises(ValueError, match="not 4 equal units"):
        unit_of(big, 4)


def test_the_sizing_rate_is_the_busiest_windows_rate_times_the_headroom():
    ev = _evaluator(peak_window_s=5.0, headroom=1.5)
    peak = peak_rate(ev.workload.arrival_s, 5.0)
    assert peak > ev.trace_rate
    assert ev.evaluated.sizing_rate == pytest.approx(peak * 1.5)
    assert ev.evaluated.trace.num_requests == 200
    assert ev.evaluated.screened.num_requests == 100
    assert "busiest 100 consecutive requests" in ev.evaluated.describe()


def test_the_screen_sizes_units_for_the_sizing_rate():
    ev = _evaluator()
    e = ev.evaluate(CFG)
    assert e.stage is EvalStage.SCREENED and e.unit_rate > 0
    assert e.num_units == math.ceil(ev.evaluated.sizing_rate / e.unit_rate - 1e-9)
    assert e.num_gpus == e.num_units * e.unit_gpus
    assert e.goodput_per_gpu == pytest.approx(e.unit_rate / e.unit_gpus)


def test_verify_reports_exactly_what_simulate_gives_for_the_fewest_units_that_meet():
    ev = _evaluator()
    slo = ev.settings.slo
    v = ev.verify(CFG, 4)
    n = v.evaluation.num_units
    assert v.evaluation.stage is EvalStage.VERIFIED and v.fleet == fleet_of(CFG, n)
    direct = simulate(_workload(), v.fleet, LAT, seed=0, slo=slo)
    assert v.evaluation.ttft_p90_ms == direct.ttft.p90 * 1e3
    assert v.evaluation.tpot_p99_ms == direct.tpot.p99 * 1e3
    assert v.evaluation.at(Load.TRACE).share == direct.attainment(slo)
    # It is the fewest: one unit fewer misses the target at the sizing rate.
    scale = ev.sizing_scale
    assert ev.simulate(fleet_of(CFG, n), scale).attainment(slo) >= 0.9
    if n > 1:
        assert ev.simulate(fleet_of(CFG, n - 1), scale).attainment(slo) < 0.9


def test_verify_is_infeasible_when_the_budget_does_not_reach():
    ev = _evaluator(slo=SLO(2.0, 0.006))  # TPOT below one decode step (7 ms) at any load
    v = ev.verify(CFG, 1)
    assert v.evaluation.status is EvalStatus.INFEASIBLE and v.evaluation.num_gpus == 4


def test_cache_returns_the_same_evaluation():
    ev = _evaluator()
    first = ev.evaluate(CFG)
    assert ev.evaluate(CFG) is first and ev.cache.hits == 1
    assert config_key(CFG) in ev.cache.entries


def test_configs_that_reject_the_traces_longest_request_are_invalid():
    wl = _workload()
    # One long prompt late in the trace, outside the 200-request evaluation window.
    long = Workload(
        arrival_s=np.append(wl.arrival_s, wl.arrival_s[-1] + 1.0),
        input_tokens=np.append(wl.input_tokens, 6000),
        output_tokens=np.append(wl.output_tokens, 100),
    )
    ev = TraceEvaluator.for_trace(long, LAT, EvalSettings(SLO(2.0, 0.05), max_requests=200))
    assert ev.longest_request_tokens == 6100
    unchunked = ServingConfig.colocated(
        "llama-3.1-8b", InstanceConfig(max_num_batched_tokens=4096, enable_chunked_prefill=False)
    )
    bad = ev.evaluate(unchunked)
    assert bad.status is EvalStatus.INVALID
    assert "6100" in bad.error and "4096" in bad.error
    chunked = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_batched_tokens=4096))
    assert ev.evaluate(chunked).status is not EvalStatus.INVALID
