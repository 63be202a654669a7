"""The answer in words: the verdict, the baseline's, why the recommendation beats the
runner-up, and what would change the answer.

Every sentence is built here once, from the verified figures, and stored with the
outcome: `servetune tune`, `servetune explain`, the REST result and the result page
print the same sentences, so no two of them can state two figures for one claim.
Each attainment is stated with the traffic it was measured at (`Attainment`,
`EvaluatedTrace.attainment_text`), the deciding (lowest) one first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from optimizer.search.attainment import Attainment, SLOThreshold
from optimizer.search.evaluation import EvalStatus, Evaluation
from optimizer.search.recommend import NEAR_DEFAULTS, TrialOutcome, cost_of
from optimizer.search.request import TuneRequest
from optimizer.search.windows import EvaluatedTrace

SIZING_NOTE_RATIO = 1.5  # peak / mean above which the sizing window is worth a what-if


@dataclass(frozen=True, slots=True)
class Verdict:
    headline: str  # the recommendation, or why there is none
    baseline: str  # what the engine's defaults need
    runner_up: str  # why the recommendation beats the runner-up ("": no recommendation)
    what_ifs: tuple[str, ...]  # what would change the answer


def tuned_text(r: TuneRequest) -> str:
    """What was tuned: the model, the GPUs on offer and the budget, the SLOs and target."""
    e2e = f", E2E <= {r.slo_e2e_ms:g} ms" if r.slo_e2e_ms else ""
    return (
        f"Tuned {r.model} on {', '.join(r.gpu_types)} (budget {r.gpu_budget} GPUs) for TTFT "
        f"<= {r.slo_ttft_ms:g} ms, TPOT <= {r.slo_tpot_ms:g} ms{e2e} at {r.attainment:.0%} "
        "attainment"
    )


def who(number: int | None, defaults: bool) -> str:
    """How the answer names a fleet: the engine's defaults, or the trial that found it."""
    if defaults or number is None:
        return "vLLM's defaults"
    return f"trial {number}"


def gpus(n: int) -> str:
    return f"{n} GPU{'' if n == 1 else 's'}"


def _cost(ev: Evaluation, per_dollar: bool) -> str:
    if per_dollar and ev.price_per_hour is not None:
        return f"${ev.price_per_hour:,.2f}/h ({gpus(ev.num_gpus)})"
    return gpus(ev.num_gpus)


def attainments_text(ev: Evaluation, evaluated: EvaluatedTrace) -> str:
    """Every attainment of `ev` with its traffic, the deciding one first."""
    deciding = ev.attainment
    assert deciding is not None
    rest = [a for a in ev.attainments if a is not deciding]
    return " and ".join(evaluated.attainment_text(a) for a in (deciding, *rest))


def headline(
    request: TuneRequest,
    evaluated: EvaluatedTrace,
    rec: TrialOutcome | None,
    rec_defaults: bool,
    closest: TrialOutcome | None,
    closest_defaults: bool,
    gain: float | None,
    per_dollar: bool,
) -> str:
    """The recommendation with its figures, or why there is none and how close it came."""
    target = request.attainment
    if rec is not None:
        ev = rec.evaluation
        more = ""
        if gain and not rec_defaults:
            more = (
                f"; the defaults cost {gain:.2f}x as much"
                if per_dollar
                else f"; the defaults need {gain:.2f}x as many GPUs"
            )
        price = ""
        if ev.price_per_hour is not None:
            price = f", ${ev.price_per_hour:,.2f}/h"
        return (
            f"Recommendation ({who(rec.number, rec_defaults)}): {gpus(ev.num_gpus)} "
            f"({ev.num_units} x {ev.unit_gpus}-GPU unit){price}{more}. It meets the SLOs for "
            f"{target:.0%} of requests: {attainments_text(ev, evaluated)}."
        )
    none = (
        f"No fleet within {gpus(request.gpu_budget)} meets the SLOs for {target:.0%} of requests."
    )
    if closest is None:
        return (
            f"{none} No config tried is valid: each breaks a rule, does not fit or rejects "
            "the workload's longest requests (`servetune explain` counts them by reason)."
        )
    ev = closest.evaluation
    att = ev.attainment
    assert att is not None
    return (
        f"{none} Closest: {who(closest.number, closest_defaults)} on {gpus(ev.num_gpus)}, "
        f"{evaluated.attainment_text(att)}; there {_binding_text(att, request)}."
    )


def _binding_text(att: Attainment, request: TuneRequest) -> str:
    """Which SLOs fall short at `att`, each with the share meeting it alone."""
    target = request.attainment
    limits = {"TTFT": request.slo_ttft_ms, "TPOT": request.slo_tpot_ms, "E2E": request.slo_e2e_ms}
    short = [(n, s) for n, s in att.alone() if s < target]
    if short:
        return "; ".join(f"{n} <= {limits[n]:g} ms binds ({s:.1%} meet it alone)" for n, s in short)
    alone = " and ".join(f"{n} {s:.1%}" for n, s in att.alone())
    return f"the SLOs bind together (alone: {alone})"


def baseline_text(
    description: str, base: Evaluation, evaluated: EvaluatedTrace, per_dollar: bool
) -> str:
    if base.status is EvalStatus.INVALID:
        return f"Baseline ({description}): cannot be deployed: {base.error}"
    att = base.attainment
    assert att is not None
    verdict = "meets the SLOs with" if base.feasible else "misses the SLOs even with"
    return (
        f"Baseline ({description}): {verdict} {_cost(base, per_dollar)}: "
        f"{attainments_text(base, evaluated)}."
    )


def runner_up_text(
    rec: TrialOutcome,
    rec_defaults: bool,
    others: Sequence[tuple[TrialOutcome, bool]],
    evaluated: EvaluatedTrace,
    per_dollar: bool,
) -> str:
    """Why `rec` beats the next verified fleet (`others`: the other verified fleets in the
    recommendation's order, each with whether it is the defaults)."""
    name = who(rec.number, rec_defaults)
    ev = rec.evaluation
    meeting = [(o, d) for o, d in others if o.evaluation.feasible]
    if not meeting:
        missing = [(o, d) for o, d in others if o.evaluation.status is not EvalStatus.INVALID]
        text = "No other verified fleet meets the SLOs within the budget"
        if missing:
            o, d = max(missing, key=lambda p: p[0].evaluation.share)
            att = o.evaluation.attainment
            assert att is not None
            text += (
                f"; the nearest, {who(o.number, d)} on {gpus(o.evaluation.num_gpus)}, reaches "
                f"{evaluated.attainment_text(att)}"
            )
        return text + "."
    other, other_defaults = meeting[0]
    oev = other.evaluation
    oname = who(other.number, other_defaults)
    mine, theirs = cost_of(ev, per_dollar), cost_of(oev, per_dollar)
    if mine < theirs:
        return (
            f"The recommendation, {name}, beats the runner-up, {oname}, on cost: "
            f"{_cost(ev, per_dollar)} against {_cost(oev, per_dollar)}, both meeting the SLOs."
        )
    a, b = ev.interactivity_tok_s, oev.interactivity_tok_s
    if rec_defaults and b > a:
        return (
            f"vLLM's defaults are kept: {oname} needs as much ({_cost(oev, per_dollar)}) and is "
            f"only {b / a - 1:.1%} more interactive ({b:.0f} against {a:.0f} tokens/s per "
            f"user); a change of knobs must gain more than {NEAR_DEFAULTS - 1:.0%}."
        )
    return (
        f"The recommendation, {name}, and the runner-up, {oname}, both need "
        f"{_cost(ev, per_dollar)}; the recommendation gives {a:.0f} tokens/s per user against "
        f"{b:.0f}."
    )


def threshold_text(thresholds: Sequence[SLOThreshold], request: TuneRequest) -> str:
    """For each SLO, the value at which the fleet meets the target with the other SLOs as
    asked, or that no value is enough."""
    asked = {"TTFT": request.slo_ttft_ms, "TPOT": request.slo_tpot_ms, "E2E": request.slo_e2e_ms}
    parts = []
    for t in thresholds:
        others = " and ".join(f"{m} <= {v:g} ms" for m, v in asked.items() if m != t.metric and v)
        if t.value_ms is None:
            parts.append(f"no {t.metric} SLO is enough (only {t.others_share:.1%} meet {others})")
        else:
            parts.append(
                f"a {t.metric} SLO of {_ms(t.value_ms)} ms ({others} as asked) still meets it"
            )
    return "; ".join(parts)


def _ms(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def sizing_text(evaluated: EvaluatedTrace) -> str:
    """The sizing window's effect on the rate fleets are sized for ("" when it has little)."""
    if evaluated.clients or not evaluated.trace.mean_rate:
        return ""
    ratio = evaluated.sizing_rate / evaluated.trace.mean_rate
    if ratio < SIZING_NOTE_RATIO:
        return ""
    longer = [
        f"--peak-window-s {w:g}: {r:.2f} req/s"
        for w, r in evaluated.peak_rates
        if w > evaluated.peak_window_s
    ]
    text = (
        f"Fleets are sized for {evaluated.sizing_rate:.2f} req/s, its busiest "
        f"{evaluated.peak_window_s:g} s x headroom {evaluated.headroom:g}, {ratio:.1f}x the "
        f"trace's mean {evaluated.trace.mean_rate:.2f} req/s"
    )
    if longer:
        text += "; a longer window sizes for less (" + ", ".join(longer) + ")"
    return text + "."
