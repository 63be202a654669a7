"""The plain-language account: which knob moved goodput, and through which phase."""

from __future__ import annotations

import dataclasses

from optimizer.config import InstanceConfig, ServingConfig
from optimizer.search.diagnose import PhaseDiagnosis, explain
from optimizer.search.objective import EvalStatus, Evaluation

BASE = PhaseDiagnosis(
    label="baseline", rate=10.0, prefill_share=0.1, decode_share=0.6, mixed_share=0.3,
    mean_batch=40.0, decode_intensity=30.0, prefill_intensity=900.0, ridge=295.0,
    kv_utilization=0.5, num_preemptions=12, queueing_share_of_ttft=0.4, itl_spike_share=0.08,
    itl_p99_ms=180.0, ttft_p90_ms=900.0, tpot_p90_ms=30.0, attainment=0.9,
)  # fmt: skip
CFG = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_batched_tokens=8192))
SMALL = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_batched_tokens=2048))


def _eval(goodput: float) -> Evaluation:
    return Evaluation(EvalStatus.FEASIBLE, 1, goodput_per_gpu=goodput)


def test_a_real_gain_is_explained_by_the_phase_that_moved() -> None:
    rec = dataclasses.replace(BASE, itl_spike_share=0.01, itl_p99_ms=40.0, num_preemptions=0)
    lines = explain(BASE, rec, CFG, SMALL, _eval(10.0), _eval(13.0))
    assert "max_num_batched_tokens 8192 -> 2048" in lines[1] and "(1.30x)" in lines[1]
    assert lines[2].startswith("Why: decode: fewer decode tokens stall behind prefill chunks")
    assert "8.0% -> 1.0%" in lines[2] and "preemptions fall 12 -> 0" in lines[2]


def test_a_gain_within_the_search_resolution_says_keep_the_defaults() -> None:
    lines = explain(BASE, BASE, CFG, SMALL, _eval(10.0), _eval(10.1))
    assert "(1.01x)" in lines[1]
    assert "defaults are already within 3% of the best config" in lines[2]
    assert not any(line.startswith("Why:") for line in lines)


def test_no_recommendation_says_so() -> None:
    lines = explain(BASE, None, CFG, None, _eval(10.0), None)
    assert (
        lines[-1] == "No config met the SLOs at the trace's rate, so there is nothing to compare."
    )
