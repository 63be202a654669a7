"""`TuneOutcome`: the answer of a tuning run, and how it is assembled from a study.

The dataclasses are the JSON layout: `outcome.to_dict()` (what `outcome.json`,
the tuning-run table and the REST result hold) is `optimizer.plain.to_plain`
of the outcome plus `schema_version`, and `TuneOutcome.from_dict` reads it
back. Every config's predicted figures sit under `predicted` (an `Evaluation`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from optimizer.config import ServingConfig
from optimizer.plain import PlainDataError, from_plain, to_plain
from optimizer.search.diagnose import NEAR_DEFAULTS, Diagnosis, diagnose_config, explain
from optimizer.search.flags import LaunchCommand, launch_commands
from optimizer.search.objective import Evaluation, TraceEvaluator
from optimizer.search.recommend import (
    BaselineComparison,
    ParetoRow,
    TrialOutcome,
    baseline_config,
    compare,
    pareto_front,
    recommend,
)
from optimizer.search.request import TuneRequest

OUTCOME_SCHEMA_VERSION = 2


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
    """The config to run. `trial` is None when it is the engine's defaults, kept
    because no trial beat them by more than the search's resolution."""

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
class TuneOutcome:
    request: TuneRequest
    study_name: str
    num_trials: int
    latency: LatencyInfo
    recommendation: Recommendation | None  # None: no config meets the SLOs at the trace's rate
    baseline: BaselineComparison
    pareto: tuple[ParetoRow, ...]
    diagnosis: Diagnosis

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
                f"{OUTCOME_SCHEMA_VERSION} (outcomes written before 2026-12 are kept as stored "
                "and served as they are)"
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


def build_outcome(
    request: TuneRequest,
    outcomes: list[TrialOutcome],
    evaluator: TraceEvaluator,
    *,
    study_name: str,
    num_trials: int,
    latency: LatencyInfo,
    model_id: str | None = None,
) -> TuneOutcome:
    space = request.space()
    per_dollar = bool(space.prices)
    best = recommend(outcomes, per_dollar=per_dollar)
    base_cfg = baseline_config(space)
    base_eval = evaluator.evaluate(base_cfg)
    found = compare(base_cfg, base_eval, best.evaluation if best else None, per_dollar=per_dollar)
    rec = None
    comparison = found
    near = found.gain is not None and found.gain < NEAR_DEFAULTS
    if best is not None and base_eval.feasible and near:
        # Within the capacity search's resolution of the defaults: keep them.
        launch = launch_commands(base_cfg, model=model_id)
        rec = Recommendation(None, base_cfg, base_eval, slo_checks(request, base_eval), launch)
        comparison = compare(base_cfg, base_eval, base_eval, per_dollar=per_dollar)
    elif best is not None:
        rec = Recommendation(
            best.number,
            best.config,
            best.evaluation,
            slo_checks(request, best.evaluation),
            launch_commands(best.config, model=model_id),
        )
    rate = base_eval.max_rate or evaluator.trace_rate
    d_base = diagnose_config(evaluator, "baseline", base_cfg, rate)
    d_rec = diagnose_config(evaluator, "recommendation", best.config, rate) if best else None
    account = explain(
        d_base,
        d_rec,
        base_cfg,
        best.config if best else None,
        base_eval,
        best.evaluation if best else None,
    )
    return TuneOutcome(
        request=request,
        study_name=study_name,
        num_trials=num_trials,
        latency=latency,
        recommendation=rec,
        baseline=comparison,
        pareto=tuple(pareto_front(outcomes, per_dollar=per_dollar)),
        diagnosis=Diagnosis(d_base, d_rec, account),
    )
