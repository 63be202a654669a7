"""The answer agrees with its own figures and explains itself: every attainment is stated
with the traffic it was measured at (the deciding one first), the fleet the verdict names
is a row of the table, the defaults are named so however they were found, every trial's
fate and deciding constraint are kept, and what would change the answer is computed from
the runs themselves."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optimizer.config import InstanceConfig, RejectReason, ServingConfig
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.search.attainment import Load, slo_thresholds
from optimizer.search.evaluation import EvalStatus
from optimizer.search.outcome import LatencyInfo, TuneOutcome, build_outcome
from optimizer.search.recommend import TrialOutcome, baseline_config
from optimizer.search.request import TuneRequest
from optimizer.search.study import (
    Objective,
    open_study,
    rejected_trials,
    run_trials,
    trial_outcomes,
)
from optimizer.search.trace_evaluator import TraceEvaluator
from optimizer.search.trials import TrialFate
from optimizer.sim import SLO, max_sustainable_rate
from optimizer.workload import FixedLength, LognormalLength, Workload, synthetic_workload

LAT = SingleLatencySource(LinearLatency(base_s=0.007, per_token_s=2.7e-5, per_kv_token_s=4e-8))


def _bursty() -> Workload:
    """Ten quiet minutes at 1 req/s with one busy minute at 8 more: sized for the busy
    minute (9.2 req/s), one GPU meets the SLOs at the trace's own rate and misses them at
    the sizing rate."""
    rng = np.random.default_rng(0)
    arrivals = np.sort(np.concatenate([rng.uniform(0, 600, 600), rng.uniform(300, 360, 480)]))
    n = len(arrivals)
    return Workload(arrivals, np.full(n, 1500), np.full(n, 60))


def _request(**kw) -> TuneRequest:
    fields = dict(
        trace_id=1, model="llama-3.1-8b", gpu_types=("h100",), gpu_budget=1,
        slo_ttft_ms=1000, slo_tpot_ms=30, screen_requests=200, search_space={"tp": [1]},
    )  # fmt: skip
    fields.update(kw)
    return TuneRequest(**fields)


def _outcome(wl: Workload, req: TuneRequest, trials=(), rejected=()) -> TuneOutcome:
    ev = TraceEvaluator.for_trace(wl, LAT, req.eval_settings())
    return build_outcome(
        req, req.space(), list(trials), ev, study_name="t",
        num_trials=len(trials) + len(rejected), latency=LatencyInfo("linear", True),
        rejected=rejected,
    )  # fmt: skip


def test_a_fleet_that_passes_at_the_mean_and_fails_at_the_peak_is_said_to_miss_at_the_peak():
    out = _outcome(_bursty(), _request())
    base = out.baseline.predicted
    sizing, trace = base.at(Load.SIZING), base.at(Load.TRACE)
    # The case the issue found: fine at the trace's own rate, failing at the sizing rate.
    assert trace.share >= 0.9 > sizing.share and base.status is EvalStatus.INFEASIBLE
    assert base.attainment == sizing  # the deciding figure is the failing one
    assert sizing.rate == pytest.approx(out.evaluated.sizing_rate)
    assert trace.rate == pytest.approx(out.evaluated.trace.mean_rate)
    deciding = f"{sizing.share:.1%} at {sizing.rate:,.2f} req/s (its busiest 60 s, the sizing rate)"
    v = out.verdict
    # Baseline: "misses", the deciding figure first, the other with its own traffic.
    assert "misses the SLOs even with 1 GPU: " + deciding in v.baseline
    assert v.baseline.index(deciding) < v.baseline.index(f"{trace.share:.1%} at")
    # The verdict cites that same figure for the closest fleet, never the mean-rate one.
    assert "No fleet within 1 GPU meets" in v.headline
    assert f"Closest: vLLM's defaults on 1 GPU, {deciding}" in v.headline
    assert f"{trace.share:.1%}" not in v.headline
    # The diagnosis states the same figure.
    assert deciding in out.diagnosis.account[0]
    # The closest named is a row of the table (and of the plot, which draws the same rows).
    assert [(p.defaults, p.predicted.attainment) for p in out.pareto] == [(True, sizing)]


def test_the_outcome_json_keeps_each_attainment_with_its_load_and_rate():
    out = _outcome(_bursty(), _request())
    doc = out.to_dict()
    assert doc["schema_version"] == 5
    figures = doc["baseline"]["predicted"]
    assert [a["load"] for a in figures["attainments"]] == ["sizing", "trace"]
    assert figures["attainment"]["load"] == "sizing"  # derived: the deciding one
    assert "sizing_attainment" not in figures and "shortfall" not in doc
    assert TuneOutcome.from_dict(doc).to_dict() == doc


def test_the_defaults_are_named_the_defaults_whether_or_not_a_trial_screened_them():
    wl = synthetic_workload(
        400, 5.0, input_lengths=LognormalLength(1500, 0.8, max_tokens=8000),
        output_lengths=FixedLength(60), seed=1,
    )  # fmt: skip
    req = _request(gpu_budget=8, slo_ttft_ms=2000, slo_tpot_ms=20)
    ev = TraceEvaluator.for_trace(wl, LAT, req.eval_settings())
    base = baseline_config(req.space())
    alone = _outcome(wl, req)
    screened = _outcome(wl, req, [TrialOutcome(20, base, ev.evaluate(base))])
    for out in (alone, screened):
        rec = out.recommendation
        assert rec.defaults and out.verdict.headline.startswith("Recommendation (vLLM's defaults)")
        assert [p.defaults for p in out.pareto if p.config == rec.config] == [True]
    assert (alone.recommendation.trial, screened.recommendation.trial) == (None, 20)


def test_slo_thresholds_are_worked_from_the_runs_own_requests():
    class Run:  # the per-request arrays `slo_thresholds` reads
        ttft_s = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
        tpot_s = np.array([0.01, 0.02, 0.03, 0.04, math.nan])  # the last has one token
        e2e_s = np.array([1.0, 2.0, 3.0, 4.0, 0.5])

    ttft, tpot = slo_thresholds(Run(), SLO(0.35, 0.025), 0.8)
    # TTFT: TPOT <= 25 ms keeps 3 of 5 (the one-token request counts): 60% < 80%.
    assert (ttft.metric, ttft.value_ms, ttft.others_share) == ("TTFT", None, 0.6)
    # TPOT: TTFT <= 350 ms keeps 3 of 5: no TPOT SLO reaches 4 of 5 either.
    assert (tpot.value_ms, tpot.others_share) == (None, 0.6)
    ttft, tpot = slo_thresholds(Run(), SLO(0.45, 0.025), 0.6)
    # 3 of 5 needed; among those meeting TPOT (0.1, 0.2, 0.5 s) the 3rd TTFT is 500 ms.
    assert ttft.value_ms == pytest.approx(500.0)
    # Among those meeting TTFT <= 450 ms (the first four) the 3rd TPOT is 30 ms.
    assert tpot.value_ms == pytest.approx(30.0)


def test_a_capacity_search_keeps_the_run_that_limits_it():
    wl = _bursty()
    unit = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(accelerator="h100"))
    slo = SLO(1.0, 0.03)
    cap = max_sustainable_rate(wl, unit, LAT, slo, attainment=0.9, rel_tol=0.05)
    assert cap.limit is not None and cap.limit_rate > cap.request_rate
    assert cap.limit.attainment(slo) < 0.9 <= cap.attainment
    assert cap.result_rate == pytest.approx(cap.request_rate)


def test_every_trial_is_kept_with_its_fate_and_what_decided_it():
    wl = synthetic_workload(
        300, 6.0, input_lengths=LognormalLength(1500, 0.8, max_tokens=8000),
        output_lengths=FixedLength(60), seed=1,
    )  # fmt: skip
    req = _request(
        gpu_budget=2, slo_ttft_ms=2000, slo_tpot_ms=25, num_trials=12,
        search_space={"tp": [1], "max_num_batched_tokens": [256, 2048, 8192],
                      "max_num_seqs": [64, 512], "modes": ["colocated"]},
    )  # fmt: skip
    ev = TraceEvaluator.for_trace(wl, LAT, req.eval_settings())
    study = open_study("answer", None, seed=1, n_startup_trials=12)
    run_trials(study, Objective(req.space(), ev), 12)
    rejected = rejected_trials(study)
    out = _outcome(wl, req, trial_outcomes(study), rejected)
    t = out.trials
    assert t.num_trials == 12
    # 256 batched tokens < 512 seqs breaks vLLM's rule: those trials are counted by reason.
    rules = [g for g in t.lost if g.fate is TrialFate.INVALID and g.reason is RejectReason.RULE]
    assert rejected and rules and rules[0].count == len(rejected)
    assert "max_num_seqs" in rules[0].example
    # Each row says what decided it, with figures; the recommendation leads.
    assert t.rows[0].fate is TrialFate.RECOMMENDED
    assert all(r.deciding and r.detail for r in t.rows)
    numbers = [n for r in t.rows for n in (r.trial, *r.also) if n is not None]
    counted = [n for g in t.lost for n in g.trials]
    assert len(set(numbers) | set(counted)) <= 12
    v = out.verdict
    assert v.runner_up and any(w.startswith("Tighter SLOs") for w in v.what_ifs)


def test_a_baseline_that_cannot_be_deployed_is_a_row_of_the_answer_not_a_failure():
    wl = synthetic_workload(100, 1.0, input_lengths=FixedLength(500),
                            output_lengths=FixedLength(20), seed=0)  # fmt: skip
    req = _request(model="deepseek-ai/DeepSeek-V3", gpu_budget=16, search_space={})
    out = _outcome(wl, req)
    b = out.baseline
    assert b.config is None and b.predicted.status is EvalStatus.INVALID
    assert b.predicted.reject is RejectReason.MEMORY
    assert "cannot be deployed: vLLM's defaults do not fit on h100 within one node" in (
        out.verdict.baseline
    )
    row = out.trials.rows[0]
    assert row.defaults and row.fate is TrialFate.INVALID and row.deciding == "memory"
    assert out.recommendation is None and "No config tried is valid" in out.verdict.headline
