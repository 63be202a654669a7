"""`TuneOutcome`: the answer of a tuning run, and how it is assembled from a study.

The dataclasses are the JSON layout: `outcome.to_dict()` (what `outcome.json`,
the tuning-run table and the REST result hold) is `optimizer.plain.to_plain`
of the outcome plus `schema_version`, and `TuneOutcome.from_dict` reads it
back. Every fleet's predicted figures sit under `predicted` (an `Evaluation`, verified:
what `servetune simulate` prints for that config on the same trace and SLOs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from optimizer.config import ConfigError, ServingConfig
from optimizer.plain import PlainDataError, from_plain, to_plain
from optimizer.search.attainment import Attainment, Load, slo_thresholds
from optimizer.search.diagnose import Diagnosis, breakdown, explain
from optimizer.search.evaluation import (
    EvalStage,
    EvalStatus,
    Evaluation,
    Evaluator,
    Verified,
    invalid,
)
from optimizer.search.flags import LaunchCommand, launch_commands
from optimizer.search.recommend import (
    BaselineComparison,
    ParetoRow,
    TrialOutcome,
    baseline_config,
    candidates,
    compare,
    describe_baseline,
    pareto_front,
    rank,
    recommend,
)
from optimizer.search.request import TuneRequest
from optimizer.search.sizing import unit_of
from optimizer.search.space import SearchSpace, config_key
from optimizer.search.trials import (
    RejectedTrial,
    TrialFate,
    TrialRow,
    TrialsSummary,
    knobs,
    summarize_trials,
)
from optimizer.search.verdict import (
    Verdict,
    attainments_text,
    baseline_text,
    gpus,
    headline,
    runner_up_text,
    sizing_text,
    threshold_text,
    who,
)
from optimizer.search.windows import EvaluatedTrace
from optimizer.sim import SimulationResult

OUTCOME_SCHEMA_VERSION = 5


class OutcomeFormatError(ValueError):
    """A stored or written outcome that does not describe a `TuneOutcome`."""


@dataclass(frozen=True, slots=True)
class SLOCheck:
    metric: str  # e.g. "ttft_p90_ms"
    predicted: float
    target: float

    @property
    def ok(self) -> bool:
        return self.predicted <= self.target


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The fleet to run, sized and verified on the whole trace. `trial` is the number of the
    trial that screened its unit; None only when it is the engine's defaults and no trial
    tried exactly those. `defaults`: the fleet is the engine's defaults (kept because no
    config found needs fewer GPUs or dollars, or is more than 3% more interactive)."""

    trial: int | None
    config: ServingConfig
    predicted: Evaluation
    slo_checks: tuple[SLOCheck, ...]
    launch: tuple[LaunchCommand, ...]
    defaults: bool = False

    def yaml(self) -> str:
        return yaml.safe_dump(self.config.to_dict(), sort_keys=False)


@dataclass(frozen=True, slots=True)
class LatencyInfo:
    """What priced the run, for people (e.g. "roofline estimate (accelerator specs)")."""

    label: str
    is_estimate: bool  # True when nothing measured is used


@dataclass(frozen=True, slots=True)
class CapacityRow:
    """GPUs the recommended unit needs for a multiple of the trace's traffic (its mean and
    peak rates both scaled)."""

    traffic: float  # x the trace's traffic
    mean_rate: float  # requests/s
    sizing_rate: float  # the rate the fleet is sized for: the peak x headroom, scaled
    num_gpus: int
    num_units: int
    price_per_hour: float | None
    attainment: Attainment | None  # at the sizing rate (x the traffic)
    feasible: bool  # False: even the largest fleet tried (num_gpus) misses the SLOs


@dataclass(frozen=True, slots=True)
class TuneOutcome:
    request: TuneRequest
    study_name: str
    num_trials: int
    latency: LatencyInfo
    evaluated: EvaluatedTrace  # the trace, the screening window and the sizing rate
    recommendation: Recommendation | None  # None: nothing meets the SLOs within the budget
    baseline: BaselineComparison
    pareto: tuple[ParetoRow, ...]  # verified fleets: cost (GPUs or USD/h) vs tokens/s/user
    capacity: tuple[CapacityRow, ...]  # the recommendation at 1x, 2x, 4x the traffic
    diagnosis: Diagnosis
    verdict: Verdict  # the answer in words, from the figures above (`optimizer.search.verdict`)
    trials: TrialsSummary  # every trial's fate, for `servetune explain`

    def to_dict(self) -> dict[str, Any]:
        out = to_plain(self)
        assert isinstance(out, dict)
        return {"schema_version": OUTCOME_SCHEMA_VERSION, **out}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TuneOutcome:
        if not isinstance(data, Mapping):
            raise OutcomeFormatError(f"outcome: expected a mapping, got {type(data).__name__}")
        data = dict(data)
        version = data.pop("schema_version", None)
        if version != OUTCOME_SCHEMA_VERSION:
            raise OutcomeFormatError(
                f"outcome schema_version {version!r}: this build reads version "
                f"{OUTCOME_SCHEMA_VERSION} (outcomes of earlier versions are kept as stored and "
                "served as they are)"
            )
        try:
            built = from_plain(cls, data, "outcome")
        except (PlainDataError, ValueError) as exc:
            raise OutcomeFormatError(str(exc)) from None
        assert isinstance(built, TuneOutcome)
        return built


def slo_checks(request: TuneRequest, ev: Evaluation) -> tuple[SLOCheck, ...]:
    """Predicted tail latencies (p90, or p99 for targets >= 99%) against the SLOs."""
    tail = request.attainment >= 0.99
    q = "p99" if tail else "p90"
    return (
        SLOCheck(f"ttft_{q}_ms", ev.ttft_p99_ms if tail else ev.ttft_p90_ms, request.slo_ttft_ms),
        SLOCheck(f"tpot_{q}_ms", ev.tpot_p99_ms if tail else ev.tpot_p90_ms, request.slo_tpot_ms),
    )


CAPACITY_FACTORS = (1.0, 2.0, 4.0)


def _trial_of(unit: ServingConfig, outcomes: Sequence[TrialOutcome]) -> int | None:
    """The first trial that screened exactly `unit` (None: no trial did)."""
    key = config_key(unit)
    tried = (o.number for o in outcomes if o.number is not None and config_key(o.config) == key)
    return min(tried, default=None)


def capacity_plan(
    evaluator: Evaluator, rec: TrialOutcome, unit: ServingConfig, result: SimulationResult
) -> tuple[CapacityRow, ...]:
    """GPUs `unit` needs at 1x, 2x and 4x the traffic (the 1x row is the recommendation,
    `result` its run; the others may exceed the budget: up to 4x the budget x the factor
    is tried). The rates are the evaluator's (`Evaluator.rates`); each row's attainment is
    the one its fleet was sized on."""
    ev = rec.evaluation
    sized = ev.attainment if ev.at(Load.SIZING) is None else ev.at(Load.SIZING)
    rows = [
        CapacityRow(1.0, *evaluator.rates(result), ev.num_gpus, ev.num_units,
                    ev.price_per_hour, sized, ev.feasible)
    ]  # fmt: skip
    budget = evaluator.settings.gpu_budget
    for factor in CAPACITY_FACTORS[1:]:
        start = max(1, math.ceil(ev.num_units * factor))
        cap = max(budget, ev.num_gpus) * int(factor) * 4
        verified = evaluator.verify(unit, start, rate_factor=factor, max_gpus=cap)
        v = verified.evaluation
        rows.append(
            CapacityRow(factor, *evaluator.rates(verified.result, factor), v.num_gpus,
                        v.num_units, v.price_per_hour, v.attainment, v.feasible)
        )  # fmt: skip
    return tuple(rows)


@dataclass(frozen=True, slots=True)
class _Fleets:
    """The verified fleets of one run: each by trial number (None: the defaults), with its
    unit and its verification."""

    pool: list[TrialOutcome]
    units: dict[int | None, ServingConfig]
    runs: dict[int | None, Verified]
    defaults_key: str | None  # the defaults' unit (None: they cannot be built)

    def is_defaults(self, o: TrialOutcome) -> bool:
        return o.number is None or config_key(self.units[o.number]) == self.defaults_key


def _baseline(
    space: SearchSpace, evaluator: Evaluator
) -> tuple[str, ServingConfig | None, Evaluation, Verified | None]:
    """The engine's defaults: (their description, their unit, their evaluation, their
    verification). Defaults that cannot be deployed are an INVALID evaluation saying why,
    never a failure of the run."""
    try:
        unit = baseline_config(space)
    except ConfigError as exc:
        return describe_baseline(None, space), None, invalid(0, exc), None
    screen = evaluator.evaluate(unit)
    if screen.status is EvalStatus.INVALID:
        return describe_baseline(unit), unit, screen, None
    v = evaluator.verify(unit, screen.num_units, screened=screen)
    return describe_baseline(v.fleet), unit, v.evaluation, v


def _what_ifs(
    request: TuneRequest,
    evaluator: Evaluator,
    fleets: _Fleets,
    answer: TrialOutcome | None,
    name: str,
    feasible: bool,
) -> tuple[str, ...]:
    """What would change the answer, from runs already made (plus, when nothing meets the
    SLOs, one verification of the closest unit beyond the budget)."""
    evaluated, target, budget = evaluator.evaluated, request.attainment, request.gpu_budget
    out: list[str] = []
    if answer is not None:
        ev = answer.evaluation
        att = ev.attainment
        assert att is not None
        thresholds = slo_thresholds(fleets.runs[answer.number].deciding_run(), request.slo, target)
        if feasible:
            if ev.limit is not None:
                out.append(
                    f"With one unit fewer ({gpus((ev.num_units - 1) * ev.unit_gpus)}), the "
                    f"recommendation ({name}) reaches {evaluated.attainment_text(ev.limit)}: "
                    f"below the {target:.0%} target; an attainment target of "
                    f"{ev.limit.share:.1%} or less would accept it."
                )
            elif ev.num_units == 1:
                out.append(
                    f"The recommendation ({name}) is a single {ev.unit_gpus}-GPU unit: no "
                    "smaller fleet of it exists."
                )
            out.append(
                f"Tighter SLOs, for {name} (at {evaluated.load_label(att.load)}): "
                f"{threshold_text(thresholds, request)}; tighter than that, the answer changes."
            )
        else:
            unit = fleets.units[answer.number]
            v = evaluator.verify(unit, ev.num_units, max_gpus=4 * budget).evaluation
            if v.feasible:
                out.append(
                    f"With {gpus(v.num_gpus)} ({v.num_gpus - budget} more than the budget), "
                    f"the unit of {name} meets the SLOs: {attainments_text(v, evaluated)}."
                )
            else:
                out.append(
                    f"Even {gpus(v.num_gpus)} of the unit of {name} miss the target: "
                    f"{attainments_text(v, evaluated)}."
                )
            out.append(
                f"Looser SLOs, for {name} on {gpus(ev.num_gpus)} (at "
                f"{evaluated.load_label(att.load)}): {threshold_text(thresholds, request)}."
            )
            out.append(
                f"An attainment target of {att.share:.1%} or less would accept {name} on "
                f"{gpus(ev.num_gpus)}."
            )
    sizing = sizing_text(evaluated)
    if sizing:
        out.append(sizing)
    return tuple(out)


def build_outcome(
    request: TuneRequest,
    space: SearchSpace,
    outcomes: list[TrialOutcome],
    evaluator: Evaluator,
    *,
    study_name: str,
    num_trials: int,
    latency: LatencyInfo,
    model_id: str | None = None,
    rejected: Sequence[RejectedTrial] = (),
    on_step: Callable[[str], None] = lambda _msg: None,
) -> TuneOutcome:
    """Verify the best screened units and vLLM's defaults as sized fleets on the whole
    trace, and assemble the answer from those verified figures only (`space`: the one the
    trials searched; `rejected`: the trials whose choices made no valid config)."""
    per_dollar = bool(space.prices)
    fleets = _Fleets([], {}, {}, None)
    for o in candidates(outcomes, per_dollar=per_dollar):
        on_step(f"verifying trial {o.number} as a sized fleet on the whole workload")
        v = evaluator.verify(o.config, o.evaluation.num_units, screened=o.evaluation)
        fleets.pool.append(TrialOutcome(o.number, v.fleet, v.evaluation))
        fleets.units[o.number], fleets.runs[o.number] = o.config, v
    on_step("sizing vLLM's defaults on the whole workload")
    description, base_unit, base_eval, base_run = _baseline(space, evaluator)
    base_trial = None if base_unit is None else _trial_of(base_unit, outcomes)
    if base_unit is not None:
        fleets = replace(fleets, defaults_key=config_key(base_unit))
    base = None
    if base_run is not None:
        assert base_unit is not None
        base = TrialOutcome(None, base_run.fleet, base_eval)
        fleets.pool.append(base)
        fleets.units[None], fleets.runs[None] = base_unit, base_run
    best = recommend(fleets.pool, per_dollar=per_dollar)
    rec_defaults = best is not None and fleets.is_defaults(best)
    closest = None
    if best is None and fleets.pool:
        closest = max(fleets.pool, key=lambda o: (o.evaluation.share, o.number is None))
    answer = best or closest
    answer_defaults = answer is not None and fleets.is_defaults(answer)
    # The defaults are trial None while recommending (they win ties); where a trial
    # screened exactly their unit, the answer names that trial too.
    answer_trial = None
    if answer is not None:
        answer_trial = base_trial if answer_defaults else answer.number
    name = who(answer_trial, answer_defaults)
    rec = None
    capacity: tuple[CapacityRow, ...] = ()
    if best is not None:
        result = fleets.runs[best.number].result
        ev = best.evaluation
        launch = launch_commands(best.config, model=model_id)
        checks = slo_checks(request, ev)
        rec = Recommendation(answer_trial, best.config, ev, checks, launch, rec_defaults)
        on_step("capacity plan: GPUs needed at 2x and 4x the traffic")
        capacity = capacity_plan(evaluator, best, fleets.units[best.number], result)
    rec_eval = best.evaluation if best else None
    comparison = compare(description, base_unit, base_eval, rec_eval, per_dollar=per_dollar)

    d_base = None
    if base_run is not None:
        res = base_run.result
        d_base = breakdown("baseline", base_run.fleet, res, evaluator.rates(res)[0])
    tuned = best if best is not None and not rec_defaults else None
    d_rec = None
    if tuned is not None:
        res = fleets.runs[tuned.number].result
        d_rec = breakdown("recommendation", tuned.config, res, evaluator.rates(res)[0])
    account = explain(
        d_base,
        d_rec,
        base_eval,
        base.config if base is not None else base_unit,
        best,
        rec_name=name,
        kept_defaults=rec_defaults,
        evaluated=evaluator.evaluated,
        per_dollar=per_dollar,
    )

    on_step("explaining the answer")
    evaluated = evaluator.evaluated
    others = [
        (o, fleets.is_defaults(o))
        for o in sorted(fleets.pool, key=lambda o: rank(o, per_dollar))
        if best is not None and config_key(o.config) != config_key(best.config)
    ]
    verdict = Verdict(
        headline=headline(
            request,
            evaluated,
            best,
            rec_defaults,
            closest,
            answer_defaults,
            comparison.gain,
            per_dollar,
        ),
        baseline=baseline_text(description, base_eval, evaluated, per_dollar),
        runner_up=(
            runner_up_text(best, rec_defaults, others, evaluated, per_dollar)
            if best is not None
            else ""
        ),
        what_ifs=_what_ifs(request, evaluator, fleets, answer, name, best is not None),
    )
    trials = summarize_trials(
        outcomes,
        rejected,
        {config_key(fleets.units[o.number]): o for o in fleets.pool},
        best,
        num_trials=num_trials,
        evaluated=evaluated,
        target=request.attainment,
        budget=request.gpu_budget,
        per_dollar=per_dollar,
    )
    if base_run is None:  # the defaults cannot be deployed, or reject the workload
        reason = base_eval.reject.value if base_eval.reject else "invalid"
        row = TrialRow(
            base_trial,
            True,
            "vLLM's defaults" if base_unit is None else knobs(base_unit),
            EvalStage.SCREENED,
            base_eval.num_gpus,
            TrialFate.INVALID,
            reason,
            base_eval.error,
        )
        trials = replace(trials, rows=(row, *trials.rows))
    pareto = tuple(
        replace(r, trial=base_trial, defaults=True)
        if r.defaults or config_key(unit_of(r.config, r.predicted.num_units)) == fleets.defaults_key
        else r
        for r in pareto_front(fleets.pool, per_dollar=per_dollar, keep=answer)
    )
    return TuneOutcome(
        request=request,
        study_name=study_name,
        num_trials=num_trials,
        latency=latency,
        evaluated=evaluated,
        recommendation=rec,
        baseline=comparison,
        pareto=pareto,
        capacity=capacity,
        diagnosis=Diagnosis(d_base, d_rec, account),
        verdict=verdict,
        trials=trials,
    )
