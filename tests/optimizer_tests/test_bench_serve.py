"""`vllm bench serve` workloads: the client's lengths and send schedule, and the closed
loop with the API server's path."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optimizer.bench_serve import BenchServeError, BenchServeSpec, client_send_times
from optimizer.closed_loop_workload import NO_FRONTEND, ClosedLoopWorkload, FrontendDelay
from optimizer.config import InstanceConfig, ServingConfig
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.sim import simulate

C = 0.010
CONST = SingleLatencySource(LinearLatency(base_s=C))


def test_lengths_are_drawn_as_the_random_dataset_draws_them():
    spec = BenchServeSpec(random_input_len=1000, random_output_len=100, random_range_ratio=0.1,
                          num_prompts=5, seed=3)  # fmt: skip
    inp, out = spec.lengths()
    rng = np.random.default_rng(3)
    # vLLM's bounds: floor(L(1-r)) and ceil(L(1+r)), inclusive; in floating point
    # 100 x 1.1 lands just above 110, so its ceiling is 111 (1000 x 1.1 is exact).
    assert math.ceil(1000 * 1.1) == 1100 and math.ceil(100 * 1.1) == 111
    np.testing.assert_array_equal(inp, rng.integers(900, 1101, size=5))
    np.testing.assert_array_equal(out, rng.integers(90, 112, size=5))
    fixed = BenchServeSpec(random_input_len=512, random_output_len=64, num_prompts=4)
    assert set(fixed.lengths()[0]) == {512} and set(fixed.lengths()[1]) == {64}


def test_send_schedule_is_the_clients():
    gaps = np.random.RandomState(0).gamma(shape=1.0, scale=1 / 4.0, size=4)
    # Current client: cumulative gaps rescaled so the last request goes at n / rate.
    now = client_send_times(4, 4.0, 1.0, 0)
    np.testing.assert_allclose(now, np.cumsum(gaps) * (1.0 / np.cumsum(gaps)[-1]))
    # Clients before ~0.9: the first at 0, then a fresh gap each.
    old = client_send_times(4, 4.0, 1.0, 0, "cumulative")
    np.testing.assert_allclose(old, [0.0, *np.cumsum(gaps[:3])])
    assert client_send_times(4, math.inf, 1.0, 0) is None
    np.testing.assert_allclose(client_send_times(3, 2.0, math.inf, 0), [0.5, 1.0, 1.5])


def test_a_workload_file_reads_the_clients_names_and_refuses_others(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(
        "dataset_name: random\nrandom_input_len: 256\nrandom_output_len: 32\n"
        "num_prompts: 12\nmax_concurrency: 4\nrequest_rate: inf\nseed: 1\n"
    )
    wl = BenchServeSpec.load(path).build()
    assert isinstance(wl, ClosedLoopWorkload) and wl.num_clients == 4 and len(wl) == 12
    assert wl.release_s is None
    path.write_text("random_input_len: 256\nrandom-output-len: 32\nqps: 3\n")
    with pytest.raises(BenchServeError, match=r"unknown keys \['qps'\]"):
        BenchServeSpec.load(path)
    with pytest.raises(BenchServeError, match="dataset_name: only 'random'"):
        BenchServeSpec(dataset_name="sharegpt")
    with pytest.raises(BenchServeError, match="random_range_ratio: expected 0 <= r < 1"):
        BenchServeSpec(random_range_ratio=1.0)
    with pytest.raises(BenchServeError, match="request_rate: expected > 0"):
        BenchServeSpec(request_rate=0)


def _closed(n_clients, n, frontend, release=None):
    return ClosedLoopWorkload(n_clients, np.full(n, 100), np.full(n, 3), release_s=release,
                              frontend=frontend)  # fmt: skip


def test_slots_refill_in_order_and_wait_for_their_release():
    cfg = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_seqs=8))
    # Two slots, three requests; each takes 3 steps (prefill + 2 decodes) of 10 ms.
    res = simulate(_closed(2, 3, NO_FRONTEND), cfg, CONST)
    np.testing.assert_allclose(res.arrival_s, [0.0, 0.0, 3 * C])
    # With a release schedule the third waits for its time, not just a free slot.
    res = simulate(_closed(2, 3, NO_FRONTEND, np.array([0.0, 0.0, 0.1])), cfg, CONST)
    np.testing.assert_allclose(res.arrival_s, [0.0, 0.0, 0.1])


def test_the_api_server_serialises_requests_and_ttft_counts_from_the_send():
    cfg = ServingConfig.colocated(
        "llama-3.1-8b", InstanceConfig(max_num_seqs=8), engine_version="0.12.0"
    )  # synchronous scheduling: a request joins the step after it reaches the engine
    fe = FrontendDelay(per_request_s=0.004, per_prompt_token_s=0.0, jitter_s=0.0)
    res = simulate(_closed(2, 2, fe), cfg, CONST)
    # Both sent at 0; they reach the engine at 4 and 8 ms: the first prefills alone
    # (4-14 ms), the second joins its decode step (14-24 ms).
    np.testing.assert_allclose(res.arrival_s, [0.0, 0.0])
    np.testing.assert_allclose(res.ttft_s, [0.004 + C, 0.004 + 2 * C])
    # Lock-step without it: both prefill in the first step.
    res = simulate(_closed(2, 2, NO_FRONTEND), cfg, CONST)
    np.testing.assert_allclose(res.ttft_s, [C, C])
