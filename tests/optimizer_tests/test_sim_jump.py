"""Decode stretches advanced at once (`simulate(..., jump=True)`, the default) give the
step-by-step loop's results: the same per-request TTFT and TPOT, steps per instance,
preemptions, tokens and KV accounting; with `jump=False` the loop is today's, to the bit.
Runs cut short by arrivals, KV landings and an autoscaler's ticks are covered, and the
decode-run pricers give the floats of the per-step pricers."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest

from optimizer.closed_loop_workload import ClosedLoopWorkload
from optimizer.config import InstanceConfig, RoutingPolicy, ServingConfig
from optimizer.engines import EngineOverhead
from optimizer.hardware import get_accelerator
from optimizer.latency import StepLoad, compile_roofline
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.latency.base import decode_run_pricer, step_pricer
from optimizer.latency.launches import HostFloor
from optimizer.latency.table import TableGrid
from optimizer.shapes import get_shape
from optimizer.sim import SLO, dynamic, engine, simulate
from optimizer.sim.dynamic import simulate_fleet
from optimizer.sim.scaling import AutoscalerPolicy, ColdStart, ReplicaSchedule, ScalingMetric
from optimizer.workload import Workload
from tests.factories import azure_workload, instance_with_blocks

MODEL = "llama-3.1-8b"
LINEAR = SingleLatencySource(LinearLatency(7e-3, 27e-6, 39e-9, 1e-9))
TABLE = compile_roofline(get_shape(MODEL), get_accelerator("h100"), 1)
ROOFLINE = SingleLatencySource(TABLE)
H100 = InstanceConfig(accelerator="h100", max_num_batched_tokens=2048)


def poisson(n: int, gap_s: float, seed: int, prompt=(10, 800), output=(1, 300)) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload(
        np.cumsum(rng.exponential(gap_s, n)),
        rng.integers(*prompt, n),
        rng.integers(*output, n),
    )


DEFAULT_GATES = (engine.MIN_RUN_STEPS, engine.ARRIVAL_GAP_STEPS)


@pytest.fixture(autouse=True)
def eager(monkeypatch):
    """Every stretch of two steps or more jumps, however often requests come (the loop's
    defaults step short ones): the most runs, and the most runs cut short."""
    monkeypatch.setattr(engine, "MIN_RUN_STEPS", 2)
    monkeypatch.setattr(engine, "ARRIVAL_GAP_STEPS", 0)


def assert_same(off, on) -> None:
    """Jump on (`on`) gives the step-by-step results (`off`)."""
    for name in ("ttft_s", "tpot_s", "e2e_s", "queueing_s"):
        a, b = getattr(off, name), getattr(on, name)
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=0, equal_nan=True, err_msg=name)
    assert [i.num_steps for i in on.instances] == [i.num_steps for i in off.instances]
    assert [i.num_preemptions for i in on.instances] == [i.num_preemptions for i in off.instances]
    np.testing.assert_array_equal(on.num_preemptions, off.num_preemptions)
    assert on.num_tokens_emitted == off.num_tokens_emitted
    done = ~np.isnan(off.e2e_s)
    assert off.num_tokens_emitted >= int(off.output_tokens[done].sum())
    assert on.num_floor_clamped_steps == off.num_floor_clamped_steps
    for name in off.phases.__dataclass_fields__:  # float sums, in another order
        assert getattr(on.phases, name) == pytest.approx(getattr(off.phases, name), rel=1e-12)
    assert [i.peak_kv_used_blocks for i in on.instances] == [
        i.peak_kv_used_blocks for i in off.instances
    ]
    assert all(i.leaked_blocks == 0 for i in on.instances)


def both(workload, config, latency=LINEAR, **kw):
    off = simulate(workload, config, latency, jump=False, check_invariants=True, **kw)
    on = simulate(workload, config, latency, jump=True, check_invariants=True, **kw)
    assert_same(off, on)
    return off, on


@pytest.fixture
def counted(monkeypatch):
    """How many decode stretches began, and how many were cut short."""
    seen = {"runs": 0, "cut": 0}
    begin, interrupt = engine._EventLoop._begin_run, engine._EventLoop._interrupt

    def counting_begin(self, inst, now, t, k):
        seen["runs"] += 1
        begin(self, inst, now, t, k)

    def counting_interrupt(self, inst, now):
        seen["cut"] += inst.run_ends is not None
        interrupt(self, inst, now)

    monkeypatch.setattr(engine._EventLoop, "_begin_run", counting_begin)
    monkeypatch.setattr(engine._EventLoop, "_interrupt", counting_interrupt)
    return seen


# ---------------------------------------------------------------------- the pricers


@pytest.mark.parametrize(
    ("host", "hidden"),
    [
        (HostFloor(0, 0.0, 0.0), EngineOverhead()),
        (HostFloor(16, 8e-3, 30e-3), EngineOverhead(base_s=3e-3, per_seq_s=2e-5)),
    ],
)
def test_the_table_run_pricer_gives_the_step_pricers_floats(host, hidden):
    grid = TableGrid(max_tokens=1024, max_log2_q=10, max_log2_kv=12, max_log2_batch=5)
    table = compile_roofline(get_shape(MODEL), get_accelerator("h100"), 1, grid=grid)
    table = replace(table, host=host, hidden=hidden)
    step, run = step_pricer(table), decode_run_pricer(table)
    # in the grids, past the KV grid's end (4096 per sequence), past the batch grid's (32)
    for b, kv0, k in ((1, 1, 50), (3, 3 * 100, 300), (8, 8 * 3000, 4000), (40, 40 * 50, 20)):
        want = [step(StepLoad(b, b, (), (), b, kv0 + b * i, 1)) for i in range(k)]
        got = run(b, kv0, k)
        assert got.shape == (k,) and got.tolist() == want


def test_a_model_without_a_run_pricer_is_priced_step_by_step():
    lat = LinearLatency(7e-3, 27e-6, 39e-9, 1e-9)
    got = decode_run_pricer(lat)(5, 50, 4)
    want = [lat.step_time_s(StepLoad(5, 5, (), (), 5, 50 + 5 * i)) for i in range(4)]
    assert got.tolist() == want


# ---------------------------------------------------------------------- jump off


def test_jump_off_is_the_step_by_step_loop_to_the_bit():
    """A digest of main's results before the jump existed (preemptions included)."""
    rng = np.random.default_rng(44)
    n = 300
    wl = Workload(
        np.cumsum(rng.exponential(0.02, n)), rng.integers(10, 800, n), rng.integers(1, 200, n)
    )
    cfg = ServingConfig.colocated(
        MODEL, instance_with_blocks(120, max_num_batched_tokens=512), num_replicas=2
    )
    res = simulate(wl, cfg, LINEAR, jump=False)
    digest = hashlib.sha256()
    for values in (res.ttft_s, res.tpot_s, res.e2e_s):
        digest.update(np.ascontiguousarray(values, dtype=np.float64).tobytes())
    assert [i.num_steps for i in res.instances] == [4485, 4207]
    assert int(res.num_preemptions.sum()) == 772
    assert digest.hexdigest() == "3861a073bca1ce0d63d9cf6ca18192e9b89d54588cd29ae86b5e2ef80f9c2298"


# ---------------------------------------------------------------------- hand-made cases


def test_one_request_decodes_in_one_run_with_hand_worked_latencies(counted):
    """100-token prompt, 50 tokens, 10 ms steps: one prefill step (first token at 10 ms),
    then 49 decode steps (the first planned as usual, the other 48 in the same run)."""
    const = SingleLatencySource(LinearLatency(base_s=0.010))
    wl = Workload(np.array([0.0]), np.array([100]), np.array([50]))
    _, on = both(wl, ServingConfig.colocated(MODEL), const)
    assert counted["runs"] == 1 and counted["cut"] == 0
    np.testing.assert_allclose(on.ttft_s, [0.010], rtol=1e-12)
    np.testing.assert_allclose(on.tpot_s, [0.010], rtol=1e-9)
    np.testing.assert_allclose(on.e2e_s, [0.500], rtol=1e-9)
    assert on.instances[0].num_steps == 50 and on.num_tokens_emitted == 50


def test_arrivals_cut_runs_short_and_change_nothing(counted):
    wl = poisson(400, 0.15, seed=1)
    both(wl, ServingConfig.colocated(MODEL, H100))
    assert counted["runs"] > 50 and counted["cut"] > 20


def test_a_tiny_kv_pool_preempts_inside_what_would_be_a_run(counted):
    wl = poisson(300, 0.03, seed=2)
    cfg = ServingConfig.colocated(MODEL, instance_with_blocks(90, max_num_batched_tokens=512))
    off, _ = both(wl, cfg)
    assert int(off.num_preemptions.sum()) > 50 and counted["runs"] > 0


def test_the_compiled_table_prices_runs_to_the_same_results():
    wl = poisson(500, 0.1, seed=3)
    both(wl, ServingConfig.colocated(MODEL, H100, num_replicas=3), ROOFLINE)


def test_least_outstanding_routing_over_runs():
    wl = poisson(400, 0.05, seed=4)
    least = RoutingPolicy.LEAST_OUTSTANDING_TOKENS
    cfg = ServingConfig.colocated(MODEL, H100, num_replicas=3, routing=least)
    both(wl, cfg, ROOFLINE)


def test_disaggregated_kv_landings_cut_decode_runs(counted):
    wl = poisson(300, 0.05, seed=5)
    cfg = ServingConfig.disaggregated(MODEL, H100, H100, num_prefill=1, num_decode=2)
    off, on = both(wl, cfg)
    assert on.num_kv_transfers == off.num_kv_transfers > 0
    assert counted["runs"] > 0 and counted["cut"] > 0


def test_closed_loop_clients():
    rng = np.random.default_rng(6)
    n = 200
    wl = ClosedLoopWorkload(
        num_clients=6,
        input_tokens=rng.integers(10, 900, n),
        output_tokens=rng.integers(1, 250, n),
        think_time_s=0.0,
    )
    both(wl, ServingConfig.colocated(MODEL, H100, num_replicas=2), ROOFLINE)


@pytest.mark.parametrize("metric", list(ScalingMetric))
def test_an_autoscaled_fleet_reads_its_gauges_mid_run(metric, counted, monkeypatch):
    """Every tick reads the very gauges (KV blocks used included) the step-by-step loop
    reads at that instant."""
    readings: list[tuple[int, float]] = []
    load = dynamic._DynamicFleet.load

    def recorded(self, which):
        out = load(self, which)
        readings.append(out)
        return out

    monkeypatch.setattr(dynamic._DynamicFleet, "load", recorded)
    wl = poisson(600, 0.08, seed=7, output=(50, 400))
    target = 4.0 if metric is ScalingMetric.RUNNING_WAITING else 0.02
    policy = AutoscalerPolicy(metric, target, 1, 4, 2.0, sync_period_s=0.25)
    runs, seen = [], []
    for jump in (False, True):
        readings.clear()
        runs.append(simulate_fleet(
            wl, ServingConfig.colocated(MODEL, H100), ROOFLINE, fleet=policy, initial_units=1,
            cold_start=ColdStart(0, override_s=3.0), slo=SLO(1.0, 0.05), jump=jump,
            check_invariants=True,
        ))  # fmt: skip
        seen.append(list(readings))
    assert len(seen[0]) > 100 and seen[1] == seen[0]
    assert_same(runs[0].result, runs[1].result)
    assert runs[1].provisioned == runs[0].provisioned and runs[1].ready == runs[0].ready
    assert runs[0].num_cold_starts == runs[1].num_cold_starts > 0
    assert counted["runs"] > 0


def test_a_scheduled_fleet():
    wl = poisson(400, 0.1, seed=8)
    schedule = ReplicaSchedule((0.0, 10.0, 25.0), (1, 3, 2))
    cfg = ServingConfig.colocated(MODEL, H100)
    runs = [
        simulate_fleet(
            wl,
            cfg,
            LINEAR,
            fleet=schedule,
            initial_units=1,
            cold_start=ColdStart(0, override_s=2.0),
            jump=jump,
            check_invariants=True,
        )
        for jump in (False, True)
    ]
    assert_same(runs[0].result, runs[1].result)


# ---------------------------------------------------------------------- shared traces


@pytest.mark.shared_data
@pytest.mark.parametrize("name", ["conv", "code"])
@pytest.mark.parametrize("gates", [DEFAULT_GATES, (2, 0)])
def test_azure_traces_give_the_same_results(shared_data, name, gates, monkeypatch):
    monkeypatch.setattr(engine, "MIN_RUN_STEPS", gates[0])
    monkeypatch.setattr(engine, "ARRIVAL_GAP_STEPS", gates[1])
    wl = azure_workload(shared_data, name)
    cfg = ServingConfig.colocated(MODEL, H100, num_replicas=2)
    off = simulate(wl, cfg, ROOFLINE, jump=False)
    on = simulate(wl, cfg, ROOFLINE)
    assert_same(off, on)
    assert on.num_tokens_emitted == wl.total_output_tokens
