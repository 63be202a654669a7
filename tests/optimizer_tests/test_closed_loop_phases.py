"""A closed loop's clients out of step (`ClosedLoopWorkload.out_of_step`) and the bound
`simulate --workload` states where the clients' phases decide TTFT
(`optimizer.sim.out_of_step_bound`), worked by hand with a linear step cost."""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.closed_loop_workload import NO_FRONTEND, ClosedLoopWorkload
from optimizer.config import InstanceConfig, ServingConfig
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.sim import out_of_step_bound, simulate
from optimizer.sim.phases import LOCKSTEP_VALIDATED_PROMPTS, prompts_per_step
from optimizer.workload import WorkloadError

# 10 ms a step + 0.1 ms a token: a 1,000-token prompt prefills in 110 ms on its own.
LINEAR = SingleLatencySource(LinearLatency(base_s=0.010, per_token_s=1e-4))
CONFIG = ServingConfig.colocated(
    "llama-3.1-8b", InstanceConfig(max_num_batched_tokens=8192), engine_version="0.12.0"
)


def _loop(prompt: int, n: int = 20, clients: int = 2, warmups: int = 0, release=None):
    return ClosedLoopWorkload(
        num_clients=clients, input_tokens=np.full(n, prompt), output_tokens=np.full(n, 2),
        frontend=NO_FRONTEND, num_warmups=warmups, release_s=release,
    )  # fmt: skip


def test_out_of_step_drops_the_warm_ups_and_spreads_the_first_sends_over_a_cycle():
    w = _loop(100, n=12, clients=3, warmups=2)
    out = w.out_of_step(0.5, seed=3)
    assert len(out) == 10 and out.num_warmups == 0 and out.num_clients == 3
    rel = out.release_s
    assert rel is not None and np.all(np.diff(rel) >= 0)
    assert rel[0] >= 0.0 and rel[2] < 0.5  # each client's first send within one cycle
    assert np.all(rel[3:] == rel[2])  # the later sends wait only for their slot
    assert len(set(rel[:3])) == 3  # independent phases, not one burst
    assert np.array_equal(out.release_s, w.out_of_step(0.5, seed=3).release_s)
    assert not np.array_equal(out.release_s, w.out_of_step(0.5, seed=4).release_s)
    # a request schedule already spreads the sends: refused, not overwritten
    paced = _loop(100, n=12, clients=3, warmups=2, release=np.linspace(0.0, 5.5, 12))
    with pytest.raises(WorkloadError, match="request schedule"):
        paced.out_of_step(0.5)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(WorkloadError, match="cycle_s"):
            w.out_of_step(bad)


def test_the_bound_replays_the_clients_out_of_step_where_a_step_holds_many_prompts():
    """Two clients of 1,000-token prompts and 2 output tokens. In lock-step both prefill
    in one 2,000-token step, 0-210 ms, decode in 210-220.2 ms and send again together:
    every TTFT is 210 ms. Out of step each prefill shares its step with the other's at
    most partly: every TTFT is at least the lone prefill's 110 ms, and the mean is lower
    than lock-step's whatever the phases."""
    w = _loop(1000)
    assert prompts_per_step(w, CONFIG) == 8 > LOCKSTEP_VALIDATED_PROMPTS
    lockstep = simulate(w, CONFIG, LINEAR)
    assert lockstep.ttft_s == pytest.approx(np.full(20, 0.210))
    for seed in range(4):
        bound = out_of_step_bound(w, CONFIG, LINEAR, lockstep, seed=seed)
        assert bound is not None and bound.prompts_per_step == 8
        assert 0.110 - 1e-9 <= bound.ttft.p50 <= bound.ttft.max
        assert bound.ttft.mean < lockstep.ttft.mean and bound.lockstep_ttft == lockstep.ttft
        again = simulate(w.out_of_step(float(np.mean(lockstep.e2e_s)), seed), CONFIG, LINEAR)
        assert bound.ttft.mean == pytest.approx(float(np.mean(again.ttft_s)))
    note = bound.note
    assert "a step holds 8 of these prompts" in note and "against 210.0 ms" in note


def test_no_bound_where_the_lock_step_replay_holds_or_no_burst_is_sent():
    long = _loop(4000)  # 2 prompts a step: where measured runs matched the lock-step replay
    assert prompts_per_step(long, CONFIG) == LOCKSTEP_VALIDATED_PROMPTS
    assert out_of_step_bound(long, CONFIG, LINEAR, simulate(long, CONFIG, LINEAR)) is None
    alone = _loop(1000, clients=1)  # one client has no phase to lose
    assert out_of_step_bound(alone, CONFIG, LINEAR, simulate(alone, CONFIG, LINEAR)) is None
    paced = _loop(1000, release=np.linspace(0.0, 9.5, 20))  # a request rate spreads the sends
    assert out_of_step_bound(paced, CONFIG, LINEAR, simulate(paced, CONFIG, LINEAR)) is None
