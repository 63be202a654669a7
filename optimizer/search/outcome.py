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

from optimizer.config import ServingConfig
from optimizer.plain import PlainDataError, from_plain, to_plain
from optimizer.search.diagnose import Diagnosis, breakdown, explain
from optimizer.search.evaluation import EvalStatus, Evaluation, Evaluator
from optimizer.search.flags import LaunchCommand, launch_commands
from optimizer.search.recommend import (
    BaselineComparison,
    ParetoRow,
    TrialOutcome,
    baseline_config,
    candidates,
    compare,
    pareto_front,
    recommend,
)
from optimizer.search.request import TuneRequest
from optimizer.search.space import SearchSpace, config_key
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
    trial that screened its unit; None only when it is the engine's defaults (kept because
    no config found needs fewer GPUs or dollars) and no trial tried exactly those."""

    trial: int | None
    config: ServingConfig
    predicted: Evaluation
    slo_checks: tuple[SLOCheck, ...]
    launch: tuple[LaunchCommand, ...]

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
    attainment: float  # at the sizing rate
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
    shortfall: str = ""  # when nothing meets the SLOs: which SLO binds, how close it came

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


def _recommendation(
    request: TuneRequest, o: TrialOutcome, model_id: str | None, trial: int | None
) -> Recommendation:
    ev = o.evaluation
    launch = launch_commands(o.config, model=model_id)
    return Recommendation(trial, o.config, ev, slo_checks(request, ev), launch)


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
    is tried). The rates are the evaluator's (`Evaluator.rates`)."""
    ev = rec.evaluation
    rows = [
        CapacityRow(1.0, *evaluator.rates(result), ev.num_gpus, ev.num_units,
                    ev.price_per_hour, ev.sizing_attainment, ev.feasible)
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


def shortfall(request: TuneRequest, verified: Sequence[TrialOutcome]) -> str:
    """Which SLO binds when no fleet meets the targets, and how close the best came."""
    target = request.attainment
    if not verified:
        return (
            "no valid config: every config tried breaks a vLLM rule, does not fit the model "
            "or rejects the trace's longest requests"
        )
    best = max(verified, key=lambda o: o.evaluation.attainment)
    ev = best.evaluation
    who = "vLLM's defaults" if best.number is None else f"trial {best.number}"
    binding = [
        f"{name} <= {limit:g} ms ({share:.1%} meet it alone)"
        for name, limit, share in (
            ("TTFT", request.slo_ttft_ms, ev.ttft_attainment),
            ("TPOT", request.slo_tpot_ms, ev.tpot_attainment),
        )
        if share < target
    ]
    if not binding:
        binding = [
            f"TTFT and TPOT together ({ev.ttft_attainment:.1%} and {ev.tpot_attainment:.1%} "
            "meet them alone)"
            + (f", with E2E <= {request.slo_e2e_ms:g} ms" if request.slo_e2e_ms else "")
        ]
    return (
        f"No fleet within {request.gpu_budget} GPUs meets the SLOs for {target:.0%} of requests. "
        f"Binding: {'; '.join(binding)}. Closest: {who} on {ev.num_gpus} GPUs, "
        f"{ev.attainment:.1%} attainment (TTFT p90 {ev.ttft_p90_ms:,.0f} ms, TPOT p90 "
        f"{ev.tpot_p90_ms:.1f} ms)."
    )


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
    on_step: Callable[[str], None] = lambda _msg: None,
) -> TuneOutcome:
    """Verify the best screened units and vLLM's defaults as sized fleets on the whole
    trace, and assemble the answer from those verified figures only (`space`: the one the
    trials searched)."""
    per_dollar = bool(space.prices)
    verified: list[TrialOutcome] = []
    results: dict[int | None, SimulationResult] = {}
    units: dict[int | None, ServingConfig] = {}
    for o in candidates(outcomes, per_dollar=per_dollar):
        on_step(f"verifying trial {o.number} as a sized fleet on the whole workload")
        v = evaluator.verify(o.config, o.evaluation.num_units, screened=o.evaluation)
        verified.append(TrialOutcome(o.number, v.fleet, v.evaluation))
        results[o.number], units[o.number] = v.result, o.config
    on_step("sizing vLLM's defaults on the whole workload")
    base_unit = baseline_config(space)
    base_screen = evaluator.evaluate(base_unit)
    if base_screen.status is EvalStatus.INVALID:
        base = TrialOutcome(None, base_unit, base_screen)
    else:
        v = evaluator.verify(base_unit, base_screen.num_units, screened=base_screen)
        base = TrialOutcome(None, v.fleet, v.evaluation)
        results[None], units[None] = v.result, base_unit
    pool = verified + ([base] if base.evaluation.status is not EvalStatus.INVALID else [])
    best = recommend(pool, per_dollar=per_dollar)
    # The defaults stay trial None while recommending (they win ties), but when a trial
    # screened exactly the defaults' unit, the answer names that trial.
    base_trial = _trial_of(base_unit, outcomes)
    rec = None
    if best is not None:
        rec_trial = base_trial if best.number is None else best.number
        rec = _recommendation(request, best, model_id, rec_trial)
    capacity: tuple[CapacityRow, ...] = ()
    if best is not None:
        on_step("capacity plan: GPUs needed at 2x and 4x the traffic")
        capacity = capacity_plan(evaluator, best, units[best.number], results[best.number])
    comparison = compare(
        base.config, base.evaluation, best.evaluation if best else None, per_dollar=per_dollar
    )

    d_base = None
    if None in results:
        res = results[None]
        d_base = breakdown("baseline", base.config, res, evaluator.rates(res)[0])
    tuned = best if best is not None and best.number is not None else None
    d_rec = None
    if tuned is not None:
        res = results[tuned.number]
        d_rec = breakdown("recommendation", tuned.config, res, evaluator.rates(res)[0])
    account = explain(d_base, d_rec, base, best, per_dollar=per_dollar)
    return TuneOutcome(
        request=request,
        study_name=study_name,
        num_trials=num_trials,
        latency=latency,
        evaluated=evaluator.evaluated,
        recommendation=rec,
        baseline=comparison,
        pareto=tuple(
            replace(r, trial=base_trial) if r.trial is None else r
            for r in pareto_front(pool, per_dollar=per_dollar, keep=best)
        ),
        capacity=capacity,
        diagnosis=Diagnosis(d_base, d_rec, account),
        shortfall="" if best is not None else shortfall(request, pool),
    )
