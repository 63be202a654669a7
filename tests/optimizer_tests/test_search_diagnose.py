"""The plain-language account: how many GPUs each fleet needs, which knobs moved, and
through which phase."""

from __future__ import annotations

import dataclasses

from optimizer.config import InstanceConfig, ServingConfig
from optimizer.search.attainment import Attainment, Load
from optimizer.search.diagnose import PhaseDiagnosis, explain
from optimizer.search.evaluation import EvalStage, EvalStatus, Evaluation
from optimizer.search.recommend import TrialOutcome
from optimizer.search.windows import EvaluatedTrace, TraceWindow

BASE = PhaseDiagnosis(
    label="baseline", rate=10.0, prefill_share=0.1, decode_share=0.6, mixed_share=0.3,
    mean_batch=40.0, decode_intensity=30.0, prefill_intensity=900.0, ridge=295.0,
    kv_utilization=0.5, num_preemptions=12, queueing_share_of_ttft=0.4, itl_spike_share=0.08,
    itl_p99_ms=180.0, ttft_p90_ms=900.0, tpot_p90_ms=30.0,
)  # fmt: skip
CFG = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_batched_tokens=8192))
SMALL = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_batched_tokens=2048))


EVALUATED = EvaluatedTrace(
    trace=TraceWindow(1000, 0.0, 100.0, 10.0),
    screened=TraceWindow(1000, 0.0, 100.0, 10.0),
    peak_rate=30.0,
    peak_window_s=60.0,
    headroom=1.0,
    sizing_rate=30.0,
)


def _explain(base, rec, base_out, best, *, per_dollar=False) -> tuple[str, ...]:
    defaults = best is not None and best.number is None
    name = "vLLM's defaults" if defaults else f"trial {best.number}" if best else ""
    return explain(
        base, rec, base_out.evaluation, base_out.config, best,
        rec_name=name, kept_defaults=defaults, evaluated=EVALUATED, per_dollar=per_dollar,
    )  # fmt: skip


def _out(number: int | None, cfg: ServingConfig, gpus: int, price=None) -> TrialOutcome:
    met = (Attainment(Load.SIZING, 30.0, 0.95, 0.97, 0.98),)
    ev = Evaluation(EvalStatus.FEASIBLE, EvalStage.VERIFIED, gpus, num_units=gpus, unit_gpus=1,
                    price_per_hour=price, attainments=met)  # fmt: skip
    return TrialOutcome(number, cfg, ev)


def test_a_smaller_fleet_is_explained_by_the_phase_that_moved() -> None:
    rec = dataclasses.replace(BASE, itl_spike_share=0.01, itl_p99_ms=40.0, num_preemptions=0)
    lines = _explain(BASE, rec, _out(None, CFG, 6), _out(3, SMALL, 4))
    assert lines[0].startswith("vLLM's defaults meet the SLOs with 6 GPUs. At 10.00 req/s")
    assert lines[1] == (
        "Recommendation (trial 3) meets the SLOs with 4 GPUs instead of the defaults' 6 GPUs; "
        "it changes max_num_batched_tokens 8192 -> 2048."
    )
    assert lines[2].startswith("Why: decode: fewer decode tokens stall behind prefill chunks")
    assert "8.0% -> 1.0%" in lines[2] and "preemptions fall 12 -> 0" in lines[2]


def test_prices_are_the_cost_when_given() -> None:
    lines = _explain(BASE, BASE, _out(None, CFG, 2, 8.0), _out(3, SMALL, 2, 6.5), per_dollar=True)
    assert "with 2 GPUs ($6.50/h) instead of the defaults' 2 GPUs ($8.00/h)" in lines[1]


def test_defaults_kept_say_why_and_explain_nothing_more() -> None:
    base = _out(None, CFG, 1)
    lines = _explain(BASE, None, base, base)
    assert lines[1] == (
        "No config found needs fewer GPUs than the defaults' 1 GPU or is more than 3% more "
        "interactive on as many, so the recommendation keeps them; other Pareto points trade "
        "cost for tokens/s per user."
    )
    assert len(lines) == 2


def test_defaults_that_miss_and_no_recommendation_say_so() -> None:
    base = _out(None, CFG, 8)
    at = (
        Attainment(Load.SIZING, 30.0, 0.62, 0.7, 0.9),
        Attainment(Load.TRACE, 10.0, 0.97, 0.98, 0.99),
    )
    missed = dataclasses.replace(base.evaluation, status=EvalStatus.INFEASIBLE, attainments=at)
    miss = dataclasses.replace(base, evaluation=missed)
    lines = _explain(BASE, None, miss, None)
    # The figure that decides it (the sizing rate's), with the traffic it was measured at.
    assert lines[0].startswith(
        "vLLM's defaults miss the SLOs even with 8 GPUs: 62.0% at 30.00 req/s (its busiest "
        "60 s, the sizing rate). At 10.00 req/s"
    )
    assert lines[-1] == "No config met the SLOs within the budget, so there is nothing to compare."


def test_invalid_defaults_are_named_with_their_error() -> None:
    bad = TrialOutcome(
        None, CFG, Evaluation(EvalStatus.INVALID, EvalStage.SCREENED, 1, error="too long")
    )
    lines = _explain(None, None, bad, _out(2, SMALL, 2))
    assert lines[0] == "vLLM's defaults are not a valid deployment here: too long"
    assert lines[1].startswith("Recommendation (trial 2) meets the SLOs with 2 GPUs; it changes")
