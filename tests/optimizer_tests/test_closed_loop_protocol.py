"""The benchmark client as it runs (warm-ups, a barrier, chat-template tokens, its
turnaround) and async scheduling's admission, worked by hand with a constant step."""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.bench_serve import BenchServeError, BenchServeSpec
from optimizer.closed_loop_workload import NO_FRONTEND, ClosedLoopWorkload
from optimizer.config import InstanceConfig, ServingConfig
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.sim import simulate
from optimizer.workload import Workload, WorkloadError

C = 0.010
CONST = SingleLatencySource(LinearLatency(base_s=C))
MODEL = "llama-3.1-8b"


def _config(version: str) -> ServingConfig:
    return ServingConfig.colocated(MODEL, InstanceConfig(max_num_seqs=8), engine_version=version)


def test_async_scheduling_admits_an_arrival_two_steps_later() -> None:
    """r0 prefills in 0-10 ms and decodes; r1 reaches the engine at 5 ms. Synchronous
    (0.12): r1 prefills in the next step, 10-20 ms. Async (0.20): step 2 was planned when
    step 1 began, so r1 prefills in step 3, 20-30 ms."""
    w = Workload(np.array([0.0, 0.005]), np.array([100, 100]), np.array([4, 4]))
    sync = simulate(w, _config("0.12.0"), CONST)
    asy = simulate(w, _config("0.20.1"), CONST)
    assert sync.ttft_s[1] == pytest.approx(0.020 - 0.005)
    assert asy.ttft_s[1] == pytest.approx(0.030 - 0.005)
    assert sync.ttft_s[0] == asy.ttft_s[0] == pytest.approx(C)
    # an idle engine starts at once on either
    alone = Workload(np.array([0.0, 1.0]), np.array([100, 100]), np.array([2, 2]))
    assert simulate(alone, _config("0.20.1"), CONST).ttft_s[1] == pytest.approx(C)


def test_async_scheduling_plans_a_step_at_once_when_none_was_planned() -> None:
    """r0 (one output token) ends with its prefill step, 0-10 ms; r1 arrived at 5 ms. No
    step was planned after r0's, so the engine plans r1's at 10 ms: it is not left waiting
    on an idle engine."""
    w = Workload(np.array([0.0, 0.005]), np.array([100, 100]), np.array([1, 3]))
    res = simulate(w, _config("0.20.1"), CONST, check_invariants=True)
    assert res.num_completed == 2
    assert res.ttft_s[1] == pytest.approx(0.020 - 0.005)


def _closed(n: int, clients: int, warmups: int, outputs=3, turnaround=0.0):
    return ClosedLoopWorkload(
        num_clients=clients, input_tokens=np.full(n, 50), output_tokens=np.full(n, outputs),
        frontend=NO_FRONTEND, num_warmups=warmups, turnaround_per_output_token_s=turnaround,
    )  # fmt: skip


def test_warm_ups_run_first_and_the_measured_burst_waits_for_all_of_them() -> None:
    """2 clients, 3 warm-ups of 3 tokens (prefill 0-10, decode 10-20, 20-30 ms): w0 and w1
    finish at 30 ms; w2 then runs alone, 30-60 ms, and the other slot waits for it. The 2
    measured requests go together at 60 ms (TTFT 10 ms each, 3 steps to 90 ms); only they
    are in the results."""
    res = simulate(_closed(5, 2, 3), _config("0.12.0"), CONST)
    assert res.num_requests == 2
    np.testing.assert_allclose(res.arrival_s, [0.060, 0.060])
    np.testing.assert_allclose(res.ttft_s, [C, C])
    np.testing.assert_allclose(res.e2e_s, [0.030, 0.030])
    assert res.makespan_s == pytest.approx(0.030)
    # the measured window's steps only: 3 steps of two sequences
    assert res.phases.num_steps == 3


def test_the_clients_turnaround_grows_with_the_output_it_parses() -> None:
    """One client: each next send waits 1 ms per output token of the request that ended."""
    res = simulate(_closed(3, 1, 0, outputs=3, turnaround=1e-3), _config("0.12.0"), CONST)
    np.testing.assert_allclose(res.arrival_s, [0.0, 0.033, 0.066])


def test_bad_warm_up_counts_and_turnarounds_are_refused() -> None:
    with pytest.raises(WorkloadError, match="num_warmups must be an integer from 0 to 2"):
        _closed(3, 1, 3)
    with pytest.raises(WorkloadError, match="turnaround_per_output_token_s must be >= 0"):
        _closed(3, 1, 0, turnaround=-1.0)


def test_the_spec_adds_warm_ups_template_tokens_and_the_clients_turnaround() -> None:
    spec = BenchServeSpec(random_input_len=1024, random_output_len=128, num_prompts=16,
                          max_concurrency=8, num_warmups=4, chat_template_tokens=8,
                          client="aiperf")  # fmt: skip
    wl = spec.build()
    assert len(wl) == 20 and wl.num_warmups == 4 and wl.num_clients == 8
    assert set(wl.input_tokens.tolist()) == {1032}
    assert wl.turnaround_per_output_token_s == pytest.approx(3.8e-6)
    assert BenchServeSpec.from_dict(spec.to_plain()) == spec
    with pytest.raises(BenchServeError, match="client: expected one of"):
        BenchServeSpec(client="locust")
    with pytest.raises(BenchServeError, match="num_warmups: warm-up requests are modelled"):
        BenchServeSpec(num_warmups=2, request_rate=4.0)
    with pytest.raises(BenchServeError, match="chat_template_tokens: expected an integer"):
        BenchServeSpec(chat_template_tokens=-1)
