"""Tuning a closed loop (`vllm bench serve --max-concurrency`): fleets sized for the
clients, figures exactly those `simulate` gives, the request carrying the benchmark."""

from __future__ import annotations

import pytest

from optimizer.bench_serve import BenchServeSpec
from optimizer.config import InstanceConfig, ServingConfig
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.search.attainment import Load
from optimizer.search.closed_loop import ClosedLoopEvaluator
from optimizer.search.evaluation import EvalSettings, EvalStage, EvalStatus
from optimizer.search.outcome import LatencyInfo, TuneOutcome, build_outcome
from optimizer.search.recommend import TrialOutcome
from optimizer.search.request import TuneRequest, TuneRequestError
from optimizer.search.sizing import fleet_of
from optimizer.sim import SLO, simulate

# ~28 ms per 2k-token prompt, ~8 ms per decode step: 12 clients need 4 replicas to keep
# 90% of TTFTs under 80 ms (1: 51%, 2: 68%, 3: 80%, 4: 93%).
LAT = SingleLatencySource(LinearLatency(base_s=0.008, per_token_s=1e-5, per_kv_token_s=2e-9))
SLO_ = SLO(ttft_s=0.08, tpot_s=0.03)
UNIT = ServingConfig.colocated(
    "llama-3.1-8b",
    InstanceConfig(accelerator="h100", tp=1, max_num_batched_tokens=4096, max_num_seqs=64),
)


def _spec(clients: int, prompts: int = 120) -> BenchServeSpec:
    return BenchServeSpec(
        random_input_len=2048, random_output_len=32, num_prompts=prompts,
        max_concurrency=clients, seed=1,
    )  # fmt: skip


def _evaluator(clients: int, **settings) -> ClosedLoopEvaluator:
    base = dict(slo=SLO_, attainment=0.9, gpu_budget=16, screen_requests=0)
    base.update(settings)
    return ClosedLoopEvaluator.for_spec(_spec(clients), LAT, EvalSettings(**base))


def _attainment(spec: BenchServeSpec, units: int) -> float:
    res = simulate(spec.build(), fleet_of(UNIT, units), LAT, seed=0, slo=SLO_)
    return res.attainment(SLO_)


def test_the_fleet_is_the_fewest_units_that_meet_the_slos_for_the_clients():
    ev = _evaluator(12)
    v = ev.verify(UNIT)
    n = v.evaluation.num_units
    assert v.evaluation.status is EvalStatus.FEASIBLE and v.evaluation.stage is EvalStage.VERIFIED
    assert n > 1  # the SLO is tight enough that one replica does not hold 12 clients
    assert _attainment(_spec(12), n) >= 0.9 > _attainment(_spec(12), n - 1)
    # Twice the clients never need fewer units.
    assert _evaluator(24).verify(UNIT).evaluation.num_units >= n


def test_verified_figures_are_what_simulate_prints_for_the_fleet():
    ev = _evaluator(12)
    v = ev.verify(UNIT)
    res = simulate(_spec(12).build(), v.fleet, LAT, seed=0, slo=SLO_)
    e = v.evaluation
    assert v.fleet == fleet_of(UNIT, e.num_units)
    # One attainment, measured with the benchmark's clients: what simulate prints.
    assert [a.load for a in e.attainments] == [Load.CLIENTS]
    assert e.attainment.share == res.attainment(SLO_)
    assert e.ttft_p90_ms == pytest.approx(res.ttft.p90 * 1e3, rel=1e-12)
    assert e.request_goodput == pytest.approx(res.request_goodput(SLO_), rel=1e-12)
    # Per-GPU goodput: the fleet's requests/s meeting the SLOs over its GPUs.
    assert e.goodput_per_gpu == pytest.approx(res.request_goodput(SLO_) / e.num_gpus)


def test_the_budget_caps_the_fleet_and_says_infeasible():
    ev = _evaluator(12, gpu_budget=1)
    screened = ev.evaluate(UNIT)
    assert screened.status is EvalStatus.INFEASIBLE and screened.num_units == 1
    assert screened.attainment.share == pytest.approx(_attainment(_spec(12), 1))
    big = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(accelerator="h100", tp=2))
    assert ev.evaluate(big).status is EvalStatus.INVALID  # 2 GPUs > the budget of 1


def test_screening_uses_the_first_prompts_at_least_four_per_client():
    ev = _evaluator(12, screen_requests=100)
    assert len(ev.screen.input_tokens) == 100 and ev.evaluated.screened.num_requests == 100
    assert (ev.screen.input_tokens == ev.workload.input_tokens[:100]).all()
    ev = _evaluator(30, screen_requests=100)  # 4 x 30 clients > 100 (capped at 120 prompts)
    assert len(ev.screen.input_tokens) == 120
    short = _spec(12).build().head(5)
    assert short.num_clients == 5 and len(short.output_tokens) == 5
    assert ev.evaluated.clients == 30
    run = simulate(ev.workload, UNIT, LAT, seed=0, slo=SLO_)
    assert ev.rates(run) == (run.request_throughput, run.request_throughput)
    assert "closed loop: 30 clients sending 120 prompts" in ev.evaluated.describe()


def test_an_open_loop_is_a_trace_not_a_closed_loop():
    open_loop = BenchServeSpec(num_prompts=50, request_rate=4.0)
    with pytest.raises(ValueError, match="open-loop"):
        ClosedLoopEvaluator.for_spec(open_loop, LAT, EvalSettings(slo=SLO_))


def _request(**kw) -> TuneRequest:
    base = dict(model="llama-3.1-8b", gpu_types=("h100",), gpu_budget=8, slo_ttft_ms=80,
                slo_tpot_ms=30, search_space={"tp": [1]})  # fmt: skip
    base.update(kw)
    return TuneRequest(**base)


def test_the_request_carries_the_benchmark_round_trip():
    bench = {"num_prompts": 120, "max_concurrency": 12, "request_rate": "inf",
             "random_input_len": 2048, "random_output_len": 32, "seed": 1}  # fmt: skip
    req = _request(workload=bench)
    # Kept as the parameters that differ from the client's defaults (JSON-safe: no inf).
    assert req.workload == {"random_input_len": 2048, "random_output_len": 32,
                            "num_prompts": 120, "max_concurrency": 12, "seed": 1}  # fmt: skip
    assert req.bench_spec() == _spec(12)
    assert TuneRequest.from_dict(req.to_dict()) == req
    assert req.source.startswith("workload:bench-serve random 2048/32")
    with pytest.raises(TuneRequestError, match="open loop"):
        _request(workload={"num_prompts": 50, "request_rate": 4})
    with pytest.raises(TuneRequestError, match="exactly one of trace_id"):
        _request(workload={"num_prompts": 50, "max_concurrency": 4}, trace_id=1)
    with pytest.raises(TuneRequestError, match="max_concurrency: expected an integer"):
        _request(workload={"num_prompts": 50, "max_concurrency": 0})
    with pytest.raises(TuneRequestError, match="unknown keys"):
        _request(workload={"num_prompt": 50, "max_concurrency": 4})


def test_the_outcome_describes_the_clients_and_plans_capacity_by_clients():
    req = _request(workload={"num_prompts": 120, "max_concurrency": 12, "random_input_len": 2048,
                             "random_output_len": 32, "seed": 1}, screen_requests=0)  # fmt: skip
    ev = ClosedLoopEvaluator.for_spec(req.bench_spec(), LAT, req.eval_settings())
    trial = TrialOutcome(3, UNIT, ev.evaluate(UNIT))
    out = build_outcome(req, req.space(), [trial], ev, study_name="c", num_trials=1,
                        latency=LatencyInfo("linear", True))  # fmt: skip
    assert TuneOutcome.from_dict(out.to_dict()) == out
    assert out.evaluated.clients == 12
    rec = out.recommendation
    assert rec is not None and rec.predicted.stage is EvalStage.VERIFIED
    one, two, four = out.capacity
    assert (one.traffic, two.traffic, four.traffic) == (1.0, 2.0, 4.0)
    assert one.num_gpus == rec.predicted.num_gpus <= two.num_gpus <= four.num_gpus
    # Rates quote what each sized fleet sustains (no arrival rate drives a closed loop).
    res = simulate(_spec(12).build(), rec.config, LAT, seed=0, slo=SLO_)
    assert one.mean_rate == pytest.approx(res.request_throughput)


def test_the_recommendation_states_no_out_of_step_range():
    """Where a step holds many of the prompts (512 tokens: 8 to 16 a step), the outcome
    gives the replay's figures alone: measured closed loops replayed under their own
    protocol match the lock-step replay, none run faster out of step
    (docs/closed-loop.md)."""
    bench = {"num_prompts": 120, "max_concurrency": 12, "random_input_len": 512,
             "random_output_len": 32, "seed": 1}  # fmt: skip
    req = _request(workload=bench, screen_requests=0, gpu_budget=16, slo_ttft_ms=400)
    ev = ClosedLoopEvaluator.for_spec(req.bench_spec(), LAT, req.eval_settings())
    trial = TrialOutcome(1, UNIT, ev.evaluate(UNIT))
    out = build_outcome(req, req.space(), [trial], ev, study_name="c", num_trials=1,
                        latency=LatencyInfo("linear", True))  # fmt: skip
    doc = out.to_dict()
    assert doc["schema_version"] == 5 and TuneOutcome.from_dict(doc) == out
    assert doc["recommendation"] is not None and "out_of_step" not in doc["recommendation"]
