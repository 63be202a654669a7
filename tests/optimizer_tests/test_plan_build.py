"""A whole plan on a small synthetic trace with a linear latency model: windows of two
length mixes (two capacity buckets), the lower bound from each bucket's capacity, the
static fleet sized for the peak, the scheduled and reactive fleets replayed, the reactive
policy, bad input, the JSON round trip and the pictures."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from optimizer.config import InstanceConfig, ServingConfig
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.plan import (
    FleetKind,
    FleetPlan,
    PlanError,
    PlanRequest,
    UnitChoice,
    UnitSource,
    build_plan,
    check_inputs,
    screen_unit,
)
from optimizer.plan.fleets import busiest_window, scheduled_schedule
from optimizer.plan.lower_bound import LowerBound
from optimizer.plan.parts import FleetPart, PartInputs, PlanPart, run_plan_parts
from optimizer.plan.report import attainment_series, plan_html, write_png
from optimizer.plan.windows import PlanWindow
from optimizer.search.outcome import LatencyInfo
from optimizer.search.recommend import baseline_config
from optimizer.search.request import TuneRequest
from optimizer.search.trace_evaluator import TraceEvaluator
from optimizer.sim import simulate
from optimizer.sim.dynamic import simulate_fleet
from optimizer.sim.scaling import FleetRun, ReplicaSchedule
from optimizer.workload import FixedLength, Workload, synthetic_workload

LAT = SingleLatencySource(LinearLatency(base_s=0.02, per_token_s=2e-4, per_kv_token_s=1e-7))
UNIT = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_seqs=32))
RATES = (2.0, 7.0, 0.0, 4.0, 1.0, 3.0)  # req/s per 300 s window
PROMPTS = (400, 400, 400, 1600, 1600, 1600)  # the last three: 4x the prompt


def _trace() -> Workload:
    parts = []
    for k, (rate, prompt) in enumerate(zip(RATES, PROMPTS, strict=True)):
        if rate == 0:
            continue
        w = synthetic_workload(
            int(rate * 300),
            rate,
            input_lengths=FixedLength(prompt),
            output_lengths=FixedLength(40),
            seed=k,
        )
        keep = w.arrival_s < 300
        parts.append((w.arrival_s[keep] + 300 * k, w.input_tokens[keep], w.output_tokens[keep]))
    return Workload(*(np.concatenate(c) for c in zip(*parts, strict=True)), name="phases")


def _request(**kw) -> PlanRequest:
    base = dict(
        model="llama-3.1-8b",
        gpu="h100",
        slo_ttft_ms=1000,
        slo_tpot_ms=60,
        window_s=300,
        gpu_budget=16,
        cold_start_s=30,
    )
    base.update(kw)
    return PlanRequest(**base)


def _plan(request: PlanRequest, trace: Workload, **kw) -> FleetPlan:
    checked = check_inputs(request, trace)
    unit = UnitChoice(UNIT, UnitSource.GIVEN, "given")
    return build_plan(request, trace, checked, unit, LAT, LatencyInfo("linear", True), **kw)


@pytest.fixture(scope="module")
def trace() -> Workload:
    return _trace()


@pytest.fixture(scope="module")
def plan(trace: Workload) -> FleetPlan:
    return _plan(_request(), trace)


def test_windows_of_each_mix_share_a_capacity_and_the_longer_prompts_have_less(plan):
    b = plan.bucketing
    assert b.bucket_of == (0, 0, None, 1, 1, 1)
    short, long = b.buckets
    assert short.windows == (0, 1) and long.windows == (3, 4, 5)
    assert (short.mean_input_tokens, long.mean_input_tokens) == (400.0, 1600.0)
    assert long.capacity_rps < short.capacity_rps
    assert all(x.attainment >= 0.9 and x.bounded for x in b.buckets)
    assert b.describe().startswith("2 length-mix bucket(s)")


def test_the_lower_bound_is_each_windows_rate_over_its_buckets_capacity(plan):
    lb = plan.lower_bound
    for w in plan.windows:
        cap = plan.bucketing.capacity_of(w.index)
        want = 0 if cap is None else math.ceil(w.rate / cap - 1e-9)
        assert lb.units[w.index] == want
    assert lb.units[2] == 0  # no traffic: no unit
    hours = sum(n * w.duration_s for n, w in zip(lb.units, plan.windows, strict=True)) / 3600
    assert lb.gpu_hours == pytest.approx(hours)
    assert lb.peak_gpus == max(lb.units)


def test_the_static_fleet_sized_for_the_peak_holds_the_target_on_the_busiest_window(plan):
    static = plan.fleet(FleetKind.STATIC)
    peak = busiest_window(plan.windows, plan.lower_bound)
    assert static.num_cold_starts == 0
    assert static.window_attainment[peak.index] >= plan.request.attainment
    assert static.window_attainment[2] is None  # no request there
    n = static.peak_units
    assert static.schedule == ReplicaSchedule.constant(n)
    assert static.gpu_hours == pytest.approx(n * plan.windows[-1].end_s / 3600)
    assert f"busiest window, {peak.label()}" in static.note


def test_the_static_fleets_figures_are_those_of_simulate_on_the_whole_trace(plan, trace):
    static = plan.fleet(FleetKind.STATIC)
    fleet = replace(UNIT, num_replicas=static.peak_units)
    res = simulate(trace, fleet, LAT, seed=0, slo=plan.request.slo)
    assert static.attainment == res.attainment(plan.request.slo)
    ok = res.meets(plan.request.slo)
    w = plan.windows[3]
    assert static.window_attainment[3] == pytest.approx(ok[w.first : w.stop].mean())


def test_the_schedule_starts_units_one_cold_start_before_their_window_by_hand():
    windows = tuple(PlanWindow(i, 100.0 * i, 100.0 * (i + 1), 0, 1, 1.0, 1.0) for i in range(5))
    lb = LowerBound((1, 3, 2, 0, 1), 1, 0.0, 3, 1.4, None)
    s = scheduled_schedule(windows, lb, 30.0)
    assert s.times_s == (0.0, 70.0, 200.0, 300.0, 370.0)
    assert s.counts == (1, 3, 2, 0, 1)
    # 1 x 70 + 3 x 130 + 2 x 100 + 0 x 70 + 1 x 130 = 790 unit-seconds; +2 and +1 units
    assert s.replica_seconds(0.0, 500.0) == pytest.approx(790.0)
    assert s.num_started(0.0, 500.0) == 3
    # a cold start of a whole window: the units start with the window before
    whole = scheduled_schedule(windows, lb, 100.0)
    assert whole.times_s == (0.0, 200.0, 300.0) and whole.counts == (3, 2, 1)


def test_the_scheduled_fleet_serves_each_windows_units_from_its_start(plan, trace):
    """Replayed: each window's added units started one cold start early are ready at its
    start; the units it held are at least its schedule's (leaving units drain)."""
    scheduled = plan.fleet(FleetKind.SCHEDULED)
    sched = scheduled_schedule(plan.windows, plan.lower_bound, 30.0)
    end = plan.windows[-1].end_s
    for w in plan.windows:
        assert scheduled.ready.count_at(w.start_s + 1e-6) == plan.lower_bound.units[w.index]
        assert scheduled.schedule.count_at(w.start_s + 1e-6) >= sched.count_at(w.start_s)
    held = scheduled.schedule.replica_seconds(0.0, end)
    assert held >= sched.replica_seconds(0.0, end)
    assert scheduled.gpu_hours == pytest.approx(held / 3600)  # one GPU per unit
    assert scheduled.num_cold_starts == sched.num_started(0.0, end) > 0
    assert scheduled.note.startswith("the lower bound's units per window")
    w = plan.windows[1]
    run = simulate_fleet(
        trace, UNIT, LAT, fleet=sched, initial_units=sched.count_at(0.0),
        cold_start=plan.cold_start, seed=0, slo=plan.request.slo,
    )  # fmt: skip
    ok = run.result.meets(plan.request.slo)
    assert scheduled.attainment == float(ok.mean())
    assert scheduled.window_attainment[1] == pytest.approx(ok[w.first : w.stop].mean())


def test_the_reactive_fleet_is_its_policy_replayed(plan):
    reactive = plan.fleet(FleetKind.REACTIVE)
    p = plan.policy
    assert p.min_replicas <= reactive.ready.peak <= reactive.peak_units <= p.max_replicas
    end = plan.windows[-1].end_s
    assert reactive.gpu_hours == pytest.approx(reactive.schedule.replica_seconds(0.0, end) / 3600)
    assert reactive.num_cold_starts > 0  # the load swings from 0 to 7 req/s
    assert reactive.attainment > 0 and reactive.worst_window is not None
    assert "not yet simulated" not in plan.ordering
    # here the reactive fleet holds more than the static one, and the ordering says so
    static = plan.fleet(FleetKind.STATIC)
    assert reactive.gpu_hours > static.gpu_hours
    mean = reactive.schedule.replica_seconds(0.0, end) / end
    assert plan.ordering.startswith("GPU-hours out of the expected order: ")
    assert f"reactive {reactive.gpu_hours:,.1f} > static {static.gpu_hours:,.1f}" in plan.ordering
    assert f"held {mean:,.2f} units on average against the static fleet's 4" in plan.ordering


def test_the_reactive_policy_comes_from_the_busiest_windows_capacity(plan):
    p, basis = plan.policy, plan.policy_basis
    bucket = plan.bucketing.buckets[basis.bucket]
    assert basis.window == busiest_window(plan.windows, plan.lower_bound).index
    assert p.target == pytest.approx(round(bucket.concurrency / 1.1, 1))
    assert p.min_replicas == 1
    assert p.max_replicas == max(plan.fleet(FleetKind.STATIC).peak_units, *plan.lower_bound.units)
    assert p.scale_up_delay_s == 30.0 and p.sync_period_s == 15.0


def test_a_plan_round_trips_through_json(plan):
    doc = json.loads(json.dumps(plan.to_dict()))
    assert doc["schema_version"] == 2 and doc["request"]["trace_id"] is None
    assert FleetPlan.from_dict(doc) == plan
    with pytest.raises(PlanError, match="schema_version"):
        FleetPlan.from_dict({**doc, "schema_version": 99})


def test_the_pictures(plan, tmp_path):
    page = plan_html(plan)
    assert (
        page.count("<svg") == 2 and "<script" not in page and "http" not in page.split("<pre>")[0]
    )
    assert "not yet simulated" not in page and "keda.sh/v1alpha1" in page
    assert {s.name for s in attainment_series(plan)} == {"static", "scheduled", "reactive"}
    png = write_png(plan, tmp_path / "plan.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_dynamic_replay_fills_the_scheduled_and_reactive_fleets(trace):
    """The plug the simulator's dynamic fleets use: a stand-in that replays the fleet's
    peak as a static fleet (the real one follows the schedule)."""
    calls = []

    def replay(workload, unit, latency, *, fleet, initial_units, cold_start, seed, slo):
        calls.append((type(fleet).__name__, initial_units, cold_start.total_s))
        n = fleet.peak if isinstance(fleet, ReplicaSchedule) else fleet.max_replicas
        res = simulate(workload, replace(unit, num_replicas=n), latency, seed=seed, slo=slo)
        held = ReplicaSchedule.constant(n)
        return FleetRun(res, held, held, 2)

    plan = _plan(_request(), trace, dynamic=replay)
    assert calls == [("ReplicaSchedule", 1, 30.0), ("AutoscalerPolicy", 1, 30.0)]
    for kind in (FleetKind.SCHEDULED, FleetKind.REACTIVE):
        f = plan.fleet(kind)
        assert f.num_cold_starts == 2
        assert f.gpu_hours == pytest.approx(f.peak_units * plan.windows[-1].end_s / 3600)
        assert f.attainment is not None and f.worst_window is not None
    assert "not yet simulated" not in plan.ordering


def test_fleets_that_never_change_size_are_the_static_fleets_replay_not_run_again():
    """A flat 1 req/s that one unit holds: the schedule is one unit throughout and the
    autoscaler's min equals its max, so neither is replayed (no dynamic replay runs); the
    static fleet's replay stands for them, and it is what replaying them gives."""
    flat = synthetic_workload(
        1200, 1.0, input_lengths=FixedLength(400), output_lengths=FixedLength(40), seed=9
    )
    calls = []

    def replay(workload, unit, latency, **kw):
        calls.append(kw["fleet"])
        return simulate_fleet(workload, unit, latency, **kw)

    request = _request()
    plan = _plan(request, flat, dynamic=replay)
    assert calls == []
    static = plan.fleet(FleetKind.STATIC)
    assert static.schedule == ReplicaSchedule.constant(1) and plan.policy.max_replicas == 1
    slo = request.eval_settings().slo
    for kind, fleet in ((FleetKind.SCHEDULED, plan.fleet(FleetKind.SCHEDULED).schedule),
                        (FleetKind.REACTIVE, plan.policy)):  # fmt: skip
        f = plan.fleet(kind)
        assert "the static fleet's replay stands for it" in f.note
        run = simulate_fleet(flat, UNIT, LAT, fleet=fleet, initial_units=1,
                             cold_start=plan.cold_start, seed=0, slo=slo)  # fmt: skip
        assert run.result.attainment(slo) == f.attainment == static.attainment
        assert run.provisioned == f.schedule and run.num_cold_starts == f.num_cold_starts == 0
        assert f.window_attainment == static.window_attainment
        assert f.gpu_hours == static.gpu_hours


def test_a_plan_over_two_processes_is_the_plan_in_one(plan, trace):
    """--jobs 2: the capacity searches, then the fleets' replays, side by side in forked
    processes (the static fleet, 2 units behind round-robin, alone splits its replicas)."""
    assert len(plan.bucketing.buckets) == 2 and len({f.schedule for f in plan.fleets}) == 3
    assert _plan(_request(), trace, jobs=2).to_dict() == plan.to_dict()
    lone = FleetPart(FleetKind.STATIC, "two units", static_units=2)
    part = PlanPart(_request(), UNIT, "linear", fleet=lone)
    checked = check_inputs(_request(), trace)
    inputs = PartInputs(
        trace, checked.windows, checked.cold_start, LAT, _request().eval_settings(), simulate_fleet
    )
    one, two = (run_plan_parts((part,), inputs, jobs=j)[0].fleet for j in (1, 2))
    assert one == two
    with pytest.raises(PlanError, match="--jobs"):
        run_plan_parts((part,), inputs, jobs=0)


def test_bad_input_is_refused_before_any_simulation(trace):
    with pytest.raises(PlanError, match="--window 3600 s is longer than"):
        check_inputs(_request(window_s=3600), trace)
    with pytest.raises(PlanError, match="shorter than two windows of 1200 s"):
        check_inputs(_request(window_s=1200), trace)
    with pytest.raises(
        PlanError, match=r"cold start \(68 s, the default\) is longer than a window"
    ):
        check_inputs(_request(window_s=60, cold_start_s=None), trace)
    with pytest.raises(PlanError, match=r"cold start \(400 s, --cold-start-s\)"):
        check_inputs(_request(cold_start_s=400), trace)


def test_a_peak_beyond_the_gpus_and_a_unit_too_small_are_refused(trace):
    with pytest.raises(PlanError, match=r"--gpus 2: window 3 \(00:15-00:20\)"):
        _plan(_request(gpu_budget=2), trace)
    small = replace(UNIT, max_model_len=1024)
    with pytest.raises(PlanError, match=r"holds at most 1,024 prompt .* has 1,640"):
        build_plan(
            _request(),
            trace,
            check_inputs(_request(), trace),
            UnitChoice(small, UnitSource.GIVEN, "given"),
            LAT,
            LatencyInfo("linear", True),
        )


def test_the_request_scores_as_tune_does_and_checks_its_unit():
    r = _request(attainment=0.95, seed=3, gpu_budget=8)
    tune = TuneRequest(
        trace_id=1,
        model="llama-3.1-8b",
        gpu_types=("h100",),
        gpu_budget=8,
        slo_ttft_ms=1000,
        slo_tpot_ms=60,
        attainment=0.95,
        seed=3,
    )
    assert r.eval_settings() == tune.eval_settings()
    assert r.space() == tune.space()
    with_unit = _request(unit=UNIT, price_per_gpu_hour=2.5)
    assert PlanRequest.from_dict(json.loads(json.dumps(with_unit.to_dict()))) == with_unit
    assert with_unit.priced(UNIT).price_per_hour() == 2.5
    with pytest.raises(PlanError, match="expected one replica"):
        _request(unit=replace(UNIT, num_replicas=2))
    with pytest.raises(PlanError, match="runs on h100; --gpu a100"):
        _request(gpu="a100", unit=UNIT)
    with pytest.raises(PlanError, match="gpu:"):
        _request(gpu="no-such-gpu")
    with pytest.raises(PlanError, match="window_s"):
        _request(window_s=-1)
    with pytest.raises(PlanError, match="model"):
        _request(model="no-such-model")


def test_the_screen_takes_the_feasible_unit_with_the_most_capacity_per_gpu(trace):
    r = _request(screen_trials=2, gpu_budget=4)
    busiest = max(check_inputs(r, trace).windows, key=lambda w: w.rate)
    choice = screen_unit(r, trace, busiest, LAT)
    assert choice.source is UnitSource.SCREENED
    assert "vLLM's defaults and 2 seeded draws" in choice.reason
    # no worse per GPU than vLLM's defaults, screened the same way on the same window
    evaluator = TraceEvaluator.for_trace(
        trace.slice(busiest.first, busiest.stop), LAT, r.eval_settings()
    )
    chosen = evaluator.evaluate(choice.config)
    defaults = evaluator.evaluate(baseline_config(r.space()))
    assert chosen.feasible and chosen.goodput_per_gpu >= defaults.goodput_per_gpu
    with pytest.raises(PlanError, match="no unit screened"):
        screen_unit(_request(slo_ttft_ms=1, screen_trials=1), trace, busiest, LAT)
