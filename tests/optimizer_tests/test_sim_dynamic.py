"""Fleets that change size (`optimizer.sim.dynamic.simulate_fleet`): a unit that joins
serves after its cold start, one that leaves drains, the routers see ready units only,
the HPA's recommendations, the GPU-hours of the units held, and a constant fleet replayed
as `simulate` replays the same static fleet. Hand-worked with a constant step time."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from optimizer.closed_loop_workload import ClosedLoopWorkload
from optimizer.config import (
    InstanceConfig,
    RoutingPolicy,
    ServingConfig,
    SpecMethod,
    SpeculationConfig,
)
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.plan.capacity import measure_capacities
from optimizer.plan.fleets import FleetKind, fleet_from_run
from optimizer.plan.lower_bound import lower_bound
from optimizer.plan.policy import reactive_policy
from optimizer.plan.request import PlanRequest
from optimizer.plan.windows import PlanWindow, cut_windows
from optimizer.search.evaluation import EvalSettings
from optimizer.search.sizing import fleet_of
from optimizer.sim import SLO, SimulationError, dynamic, simulate
from optimizer.sim.dynamic import UnitState, simulate_fleet
from optimizer.sim.fleet import Router
from optimizer.sim.scaling import (
    AutoscalerPolicy,
    ColdStart,
    ReplicaSchedule,
    ScalingError,
    ScalingMetric,
)
from optimizer.traces.synthesize import DIURNAL, synthesize
from optimizer.workload import FixedLength, Workload, synthetic_workload

C = 0.010  # constant step time (s); the Llama-3.1-8B/H100 floor is ~4.8 ms
MODEL = "llama-3.1-8b"
CONST = SingleLatencySource(LinearLatency(base_s=C))
LINEAR = SingleLatencySource(LinearLatency(base_s=0.02, per_token_s=2e-4, per_kv_token_s=1e-7))
UNIT = ServingConfig.colocated(MODEL, InstanceConfig(max_num_seqs=32))
SLO_ = SLO(ttft_s=1.0, tpot_s=0.06)


def cold(seconds: float) -> ColdStart:
    return ColdStart(0, override_s=seconds)


def make_workload(arrivals, prompts, outputs) -> Workload:
    return Workload(np.asarray(arrivals, float), np.asarray(prompts), np.asarray(outputs))


def swing(seed: int = 3) -> Workload:
    """2 req/s for 200 s, 12 req/s for 200 s, 2 req/s for 400 s (Poisson)."""
    parts = []
    for k, (rate, start, span) in enumerate(((2.0, 0, 200), (12.0, 200, 200), (2.0, 400, 400))):
        w = synthetic_workload(
            int(rate * span * 1.5),
            rate,
            input_lengths=FixedLength(300),
            output_lengths=FixedLength(60),
            seed=seed + k,
        )
        keep = w.arrival_s < span
        parts.append((w.arrival_s[keep] + start, w.input_tokens[keep], w.output_tokens[keep]))
    return Workload(*(np.concatenate(c) for c in zip(*parts, strict=True)), name="swing")


# ---------------------------------------------------------------------- hand-worked


def test_golden_a_unit_serves_after_its_cold_start_and_a_leaving_unit_drains():
    """No unit at 0; the schedule wants one (ready at 2 s), none from 3 s, one from 3.1 s.
    r0 (t=0) waits at the front for unit A: prefill 2.00-2.01, 4 decodes, done 2.05.
    r1 (t=2.95) on A: first token 2.96, 19 decodes, done 3.15. At 3 s A drains: it takes
    no new request but finishes r1, and stops at 3.15. r2 (t=3.05) finds no ready unit
    (A drains) and waits for unit B, asked for at 3.1 and ready at 5.1: first token 5.11,
    done 5.15. Held: A from 0 to 3.15, B from 3.1: 3.1 + 2 x 0.05 + (6 - 3.15) = 6.05
    unit-seconds over [0, 6)."""
    w = make_workload([0.0, 2.95, 3.05], [100, 100, 100], [5, 20, 5])
    schedule = ReplicaSchedule((0.0, 3.0, 3.1), (1, 0, 1))
    run = simulate_fleet(
        w, ServingConfig.colocated(MODEL), CONST, fleet=schedule, initial_units=0,
        cold_start=cold(2.0), slo=SLO_,
    )  # fmt: skip
    res = run.result
    np.testing.assert_allclose(res.ttft_s, [2.01, C, 2.06], atol=1e-9)
    np.testing.assert_allclose(res.e2e_s, [2.05, 0.20, 2.10], atol=1e-9)
    np.testing.assert_allclose(res.queueing_s, [2.0, 0.0, 2.05], atol=1e-9)
    assert run.ready == ReplicaSchedule((0.0, 2.0, 3.0, 5.1), (0, 1, 0, 1))
    assert run.provisioned.times_s == pytest.approx((0.0, 3.1, 3.15))
    assert run.provisioned.counts == (1, 2, 1)
    assert run.num_cold_starts == 2
    assert run.provisioned.replica_seconds(0.0, 6.0) == pytest.approx(6.05)
    assert len(res.instances) == 2 and res.num_gpus == 2  # at most 2 units of 1 GPU at once


def test_gpu_hours_are_the_units_held_times_their_gpus():
    """The golden case on a TP-2 unit at $3.5 per GPU-hour: 6.05 unit-seconds = 12.1
    GPU-seconds, $7 an hour per unit."""
    unit = ServingConfig.colocated(MODEL, InstanceConfig(tp=2, price_per_gpu_hour=3.5))
    w = make_workload([0.0, 2.95, 3.05], [100, 100, 100], [5, 20, 5])
    run = simulate_fleet(
        w, unit, CONST, fleet=ReplicaSchedule((0.0, 3.0, 3.1), (1, 0, 1)), initial_units=0,
        cold_start=cold(2.0), slo=SLO_,
    )  # fmt: skip
    windows = (PlanWindow(0, 0.0, 3.0, 0, 2, 100, 12.5), PlanWindow(1, 3.0, 6.0, 2, 3, 100, 5))
    settings = EvalSettings(slo=SLO_, attainment=0.9)
    f = fleet_from_run(FleetKind.SCHEDULED, run, windows, unit, settings, "by hand")
    assert f.gpu_hours == pytest.approx(2 * 6.05 / 3600)
    assert f.dollars == pytest.approx(7.0 * 6.05 / 3600)
    assert f.num_cold_starts == 2
    # r0 and r2 waited 2 s or more at the front (TTFT misses); r1 met both SLOs
    assert f.window_attainment == (0.5, 0.0) and f.worst_window == 1


def test_a_pd_unit_drains_its_prefilled_requests_through_its_own_decode_instance():
    """A 1P+1D unit leaves at 0.5 s, while r1's prompt (from 0.495 s) is computed; with no
    unit ready, the prompt goes on to the unit's own decode instance (r0 is decoding
    there), both finish, and the unit stops when they have."""
    inst = InstanceConfig()
    unit = ServingConfig.disaggregated(MODEL, inst, inst, num_prefill=1, num_decode=1)
    w = make_workload([0.0, 0.495], [2000, 2000], [100, 100])
    run = simulate_fleet(
        w, unit, CONST, fleet=ReplicaSchedule((0.0, 0.5), (1, 0)), initial_units=1,
        cold_start=cold(10.0), slo=SLO_,
    )  # fmt: skip
    res = run.result
    assert res.num_completed == 2 and res.num_kv_transfers == 2
    done = float(np.nanmax(res.arrival_s + res.e2e_s))
    assert run.ready == ReplicaSchedule((0.0, 0.5), (1, 0))
    assert run.provisioned.times_s == pytest.approx((0.0, done))
    assert run.provisioned.counts == (1, 0) and run.num_cold_starts == 0


def test_a_unit_asked_to_leave_while_starting_is_cancelled_first_and_never_serves():
    """1 unit, 3 wanted from 10 s (cold start 15 s: ready at 25 s), 1 again from 20 s: the
    two starting units are cancelled (paid 10 s each, two cold starts), the ready one
    stays and serves every request."""
    w = make_workload([0.0, 12.0, 22.0, 30.0], [100] * 4, [5] * 4)
    run = simulate_fleet(
        w, ServingConfig.colocated(MODEL), CONST, fleet=ReplicaSchedule((0.0, 10.0, 20.0),
        (1, 3, 1)), initial_units=1, cold_start=cold(15.0), slo=SLO_,
    )  # fmt: skip
    assert run.ready == ReplicaSchedule.constant(1)
    assert run.provisioned == ReplicaSchedule((0.0, 10.0, 20.0), (1, 3, 1))
    assert run.num_cold_starts == 2 and len(run.result.instances) == 1
    np.testing.assert_allclose(run.result.ttft_s, [C] * 4, atol=1e-9)


def test_with_no_unit_keda_activation_starts_one_for_the_requests_waiting_at_the_front():
    """min 0 units, none at the start: r0 (t=0, handled before the tick at 0) waits at the
    front; the tick sees it and wants 1 unit (KEDA's activation), ready at 5 s; r1 (t=1)
    waits too, and both are prefilled in the unit's first step: first tokens at 5.01."""
    policy = AutoscalerPolicy(ScalingMetric.RUNNING_WAITING, 4.0, 0, 3, 5.0)
    w = make_workload([0.0, 1.0], [100, 100], [5, 5])
    run = simulate_fleet(
        w, ServingConfig.colocated(MODEL), CONST, fleet=policy, initial_units=0,
        cold_start=cold(5.0), slo=SLO_,
    )  # fmt: skip
    np.testing.assert_allclose(run.result.ttft_s, [5.01, 4.01], atol=1e-9)
    assert run.num_cold_starts == 1 and run.ready.count_at(5.0) == 1


# ---------------------------------------------------------------------- the routers


@pytest.mark.parametrize("routing", list(RoutingPolicy))
def test_the_router_never_routes_to_a_starting_or_draining_unit(monkeypatch, routing):
    fleets: list[dynamic._DynamicFleet] = []
    init = dynamic._DynamicFleet.__init__

    def record_fleet(self, *args, **kw):
        init(self, *args, **kw)
        fleets.append(self)

    states: list[UnitState] = []
    pick = Router.pick

    def checked_pick(self):
        inst = pick(self)
        states.append(fleets[-1].unit_of[inst.index].state)
        return inst

    monkeypatch.setattr(dynamic._DynamicFleet, "__init__", record_fleet)
    monkeypatch.setattr(Router, "pick", checked_pick)
    policy = AutoscalerPolicy(ScalingMetric.RUNNING_WAITING, 8.0, 1, 8, 20.0,
                              scale_down_stabilization_s=60.0)  # fmt: skip
    w = swing()
    run = simulate_fleet(
        w, replace(UNIT, routing=routing), LINEAR, fleet=policy, initial_units=1,
        cold_start=cold(20.0), slo=SLO_,
    )  # fmt: skip
    assert len(states) == len(w) and set(states) == {UnitState.READY}
    # units did start cold and drain meanwhile
    assert run.num_cold_starts >= 2 and run.provisioned.peak > 1
    assert run.provisioned.counts[-1] < run.provisioned.peak


# ---------------------------------------------------------------------- the HPA


class _ScriptedFleet:
    """The autoscaler's view of a fleet: `total` running + waiting over `current` units."""

    def __init__(self, units: int) -> None:
        self.num_provisioned = self.current = units
        self.total = 0.0

    def load(self, metric: ScalingMetric) -> tuple[int, float]:
        return self.current, self.total / self.current


def test_the_hpa_scales_up_at_once_and_down_only_after_its_stabilisation_window():
    """Target 5 per unit, 2 units, a load of 10 that steps to 50 at 60 s and back to 10 at
    120 s. At 60 s: ceil(50 / 5) = 10 units at once. From 120 s the HPA recommends
    ceil(10 / 5) = 2, but scales down only to the highest recommendation of the last
    300 s: the last recommendation of 10 was at 105 s, so 10 until 405 s, then 2."""
    policy = AutoscalerPolicy(ScalingMetric.RUNNING_WAITING, 5.0, 1, 20, 0.0)
    fleet = _ScriptedFleet(2)
    hpa = dynamic._Autoscaler(fleet, policy, 0.0)  # type: ignore[arg-type]
    counts = {}
    for t in range(0, 601, 15):
        fleet.total = 50.0 if 60 <= t < 120 else 10.0
        fleet.current = counts[t] = hpa.recommend(float(t))
    assert {t: n for t, n in counts.items() if n != 10} == {
        t: 2 for t in (*range(0, 60, 15), *range(405, 601, 15))
    }
    # within the 10% tolerance nothing changes: 2 units at 10.9 / 2 = 5.45 per unit
    fleet.current, fleet.total = 2, 10.9
    assert dynamic._Autoscaler(fleet, policy, 0.0).recommend(0.0) == 2  # type: ignore[arg-type]


def test_a_reactive_fleet_follows_a_load_step_up_at_once_and_down_after_300_s():
    """Zero cold start: the ready units grow at the first tick that sees the step (200 s);
    a count the HPA raised to at t holds until t + 300 s (scale-down stabilisation), and
    the fleet is back to 1 unit after the load drops."""
    policy = AutoscalerPolicy(ScalingMetric.RUNNING_WAITING, 6.0, 1, 10, 0.0)
    run = simulate_fleet(
        swing(), UNIT, LINEAR, fleet=policy, initial_units=1, cold_start=cold(0.0), slo=SLO_
    )
    ready = run.ready
    steps = list(zip(ready.times_s, ready.counts, strict=True))
    first_up = next(t for (t, n), (_, before) in zip(steps[1:], steps, strict=False) if n > before)
    assert 200.0 < first_up <= 215.0 and first_up % 15 == 0
    assert ready.count_at(first_up) >= 3
    ups = [(t, n) for (t, n), (_, before) in zip(steps[1:], steps, strict=False) if n > before]
    downs = [(t, n) for (t, n), (_, before) in zip(steps[1:], steps, strict=False) if n < before]
    assert downs and min(t for t, _ in downs) >= first_up + 300.0
    for t_down, n_down in downs:
        assert all(n_down >= n_up for t_up, n_up in ups if t_down - 300.0 < t_up < t_down)
    assert ready.count_at(800.0) <= 2 < ready.peak
    assert run.provisioned.count_at(800.0) == ready.count_at(800.0)  # the drains are over
    # no cold start: every unit asked for is ready at once, none is cancelled
    assert run.num_cold_starts == sum(
        n - before for (_, n), (_, before) in zip(steps[1:], steps, strict=False) if n > before
    )


# ---------------------------------------------------------------------- as the static fleet


def _same(a, b) -> None:
    for name in ("ttft_s", "tpot_s", "e2e_s", "queueing_s", "num_preemptions"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.phases == b.phases and a.num_tokens_emitted == b.num_tokens_emitted


def _constant(w: Workload, unit: ServingConfig, n: int, latency) -> None:
    static = simulate(w, fleet_of(unit, n), latency, seed=0, slo=SLO_)
    run = simulate_fleet(
        w, unit, latency, fleet=ReplicaSchedule.constant(n), initial_units=n,
        cold_start=cold(0.0), seed=0, slo=SLO_,
    )  # fmt: skip
    _same(static, run.result)
    assert run.provisioned == run.ready == ReplicaSchedule.constant(n)
    assert run.num_cold_starts == 0


EAGLE = SpeculationConfig(method=SpecMethod.EAGLE, num_speculative_tokens=3)
PD = ServingConfig.disaggregated(MODEL, InstanceConfig(), InstanceConfig())


@pytest.mark.parametrize(
    "unit",
    [
        UNIT,
        replace(UNIT, routing=RoutingPolicy.LEAST_OUTSTANDING_TOKENS),
        ServingConfig.colocated(MODEL, InstanceConfig(max_num_seqs=32), speculation=EAGLE),
        PD,
    ],
    ids=["colocated", "least-outstanding", "eagle", "1p1d"],
)
def test_a_constant_fleet_replays_as_simulate_replays_the_static_fleet(unit):
    w = synthetic_workload(
        600, 30.0, input_lengths=FixedLength(500), output_lengths=FixedLength(80), seed=5
    )
    _constant(w, unit, 3, LINEAR)


@pytest.mark.shared_data
def test_on_the_azure_trace_a_constant_fleet_is_the_static_fleet(shared_data):
    """Colocated, EAGLE, 2P+2D and a MoE instance with 2 dp ranks, as two units each."""
    from optimizer.traces import parse_trace

    path = shared_data / "traces" / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
    w = Workload.from_columns(parse_trace(path).columns, name="conv").head(3000)
    lat = SingleLatencySource(LinearLatency(7e-3, 27e-6, 39e-9, 1e-9))
    inst = InstanceConfig(max_num_batched_tokens=2048, max_num_seqs=64)
    moe = InstanceConfig(accelerator="h200", dp=2, expert_parallel=True, max_num_seqs=64)
    for unit in (
        ServingConfig.colocated(MODEL, inst),
        ServingConfig.colocated(MODEL, inst, speculation=EAGLE),
        ServingConfig.disaggregated(MODEL, inst, inst),
        ServingConfig.colocated("qwen3-30b-a3b", moe),
    ):
        _constant(w, unit, 2, lat)


# ---------------------------------------------------------------------- the lower bound


def test_with_no_cold_start_and_a_tight_target_the_reactive_fleet_is_near_the_lower_bound():
    """A diurnal day (peak / trough 4) synthesized from a small sample and replayed in 2
    hours; units that hold ~50 requests at capacity. The HPA at the unit's at-capacity
    gauge, with no cold start, holds within 10% of the lower bound's GPU-hours."""
    rng = np.random.default_rng(0)
    inp, out = rng.integers(100, 400, 100), rng.integers(500, 1500, 100)
    cols = synthesize(inp, out, curve=DIURNAL, days=1, mean_rate=4.0 / 12, seed=1)
    w = Workload.from_columns(cols, name="diurnal").time_scaled(1 / 12)
    latency = SingleLatencySource(LinearLatency(base_s=0.05, per_token_s=2e-4))
    unit = ServingConfig.colocated(MODEL, InstanceConfig(max_num_seqs=64))
    request = PlanRequest(
        model=MODEL, gpu="h100", slo_ttft_ms=2000, slo_tpot_ms=75, window_s=300,
        gpu_budget=64, cold_start_s=0.0,
    )  # fmt: skip
    settings = request.eval_settings()
    windows = cut_windows(w, request.window_s)
    buckets = measure_capacities(w, windows, unit, latency, settings)
    lower = lower_bound(windows, buckets, unit.num_gpus, None, request.gpu_budget)
    assert max(lower.units) >= 3 * min(u for u in lower.units if u)  # the day's swing
    policy, basis = reactive_policy(windows, buckets, lower, max(lower.units), cold(0.0))
    tight = replace(policy, target=basis.at_capacity)
    run = simulate_fleet(
        w, unit, latency, fleet=tight, initial_units=1, cold_start=cold(0.0), slo=settings.slo
    )
    reactive = fleet_from_run(FleetKind.REACTIVE, run, windows, unit, settings, "tight")
    assert reactive.gpu_hours == pytest.approx(lower.gpu_hours, rel=0.10)
    assert reactive.attainment >= settings.attainment


# ---------------------------------------------------------------------- bad input


def test_bad_input_is_refused_with_what_was_expected():
    w = make_workload([0.0], [100], [5])
    kw = dict(initial_units=1, cold_start=cold(1.0))
    with pytest.raises(SimulationError, match="open-loop trace"):
        simulate_fleet(
            ClosedLoopWorkload(1, np.array([100]), np.array([5])), UNIT, CONST,
            fleet=ReplicaSchedule.constant(1), **kw,
        )  # fmt: skip
    with pytest.raises(ScalingError, match="fleet: expected a ReplicaSchedule"):
        simulate_fleet(w, UNIT, CONST, fleet=3, **kw)
    with pytest.raises(ScalingError, match="initial_units: 5 is outside the policy's 1-4"):
        policy = AutoscalerPolicy(ScalingMetric.KV_USAGE, 0.5, 1, 4, 1.0)
        simulate_fleet(w, UNIT, CONST, fleet=policy, initial_units=5, cold_start=cold(1.0))
    with pytest.raises(ScalingError, match="initial_units: expected a whole number"):
        simulate_fleet(w, UNIT, CONST, fleet=ReplicaSchedule.constant(1), initial_units=-1,
                       cold_start=cold(1.0))  # fmt: skip
