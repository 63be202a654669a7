"""Requests a deployment cannot hold: the throughput counts only what was delivered (no
infinite rate from a run where nothing finished), and `rejection_note` says which
requests are rejected and why, as the event loop rejects them."""

from __future__ import annotations

import math

import numpy as np

from optimizer.config import InstanceConfig, ServingConfig
from optimizer.latency.analytic import LinearLatency, SingleLatencySource
from optimizer.sim import SLO, rejection_note, simulate
from optimizer.workload import Workload

LAT = SingleLatencySource(LinearLatency(base_s=0.007, per_token_s=2.7e-5, per_kv_token_s=4e-8))


def _workload(prompts: list[int], output: int = 20) -> Workload:
    n = len(prompts)
    return Workload(np.arange(n) * 0.5, np.asarray(prompts), np.full(n, output))


def test_a_run_where_every_request_is_rejected_delivers_nothing() -> None:
    cfg = ServingConfig.colocated("llama-3.1-8b", max_model_len=1024)
    wl = _workload([2000 + 10 * i for i in range(10)])
    res = simulate(wl, cfg, LAT, slo=SLO(2.0, 0.1))
    assert res.num_rejected == 10 and res.num_completed == 0 and res.makespan_s == 0.0
    figures = (res.request_throughput, res.output_token_throughput, res.output_tokens_per_gpu_s)
    assert figures == (0.0, 0.0, 0.0)
    assert res.goodput == 0.0 and res.slo_attainment == 0.0
    note = rejection_note(cfg, wl)
    assert note == (
        "every request rejected, as vLLM rejects them: 10 with more prompt + output tokens "
        "than the 1,024 one request may hold (max_model_len 1,024); the longest has 2,090 + "
        "20 = 2,110"
    )


def test_throughput_counts_the_finished_requests_only() -> None:
    cfg = ServingConfig.colocated("llama-3.1-8b", max_model_len=1024)
    wl = _workload([500, 3000, 600, 4000])
    res = simulate(wl, cfg, LAT)
    assert res.num_rejected == 2 and res.num_completed == 2 and res.makespan_s > 0
    assert math.isclose(res.request_throughput, 2 / res.makespan_s)
    assert math.isclose(res.output_token_throughput, 40 / res.makespan_s)
    assert rejection_note(cfg, wl).startswith("2 of 4 requests rejected, as vLLM rejects them")
    assert rejection_note(cfg, _workload([500, 600])) is None


def test_the_note_counts_what_the_event_loop_rejects_on_either_side_of_a_pd_fleet() -> None:
    # The prefill side runs unchunked prompts within a 2,048-token budget; the decode side
    # holds what its KV cache holds.
    prefill = InstanceConfig(enable_chunked_prefill=False, max_num_batched_tokens=2048)
    cfg = ServingConfig.disaggregated("llama-3.1-8b", prefill, InstanceConfig())
    blocks = cfg.roles()[1].kv_blocks
    wl = _workload([1000, 3000, blocks * 16, 1500], output=20)
    res = simulate(wl, cfg, LAT)
    assert res.num_rejected == 2
    assert rejection_note(cfg, wl) == (
        "2 of 4 requests rejected, as vLLM rejects them: 1 with more prompt + output tokens "
        f"than the {blocks * 16:,} one request may hold (the KV cache of one decode instance: "
        f"{blocks:,} blocks x 16 tokens); the longest has {blocks * 16:,} + 20 = "
        f"{blocks * 16 + 20:,}; 1 with a prompt longer than the 2,047 tokens a prefill "
        "instance may hold (max_num_batched_tokens 2,048 with chunked prefill off); the "
        "longest of them has 3,000"
    )
