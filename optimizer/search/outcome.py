"""`TuneOutcome`: the answer of a tuning run, and how it is assembled from a study."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from optimizer.config import ServingConfig
from optimizer.search.diagnose import NEAR_DEFAULTS, Diagnosis, diagnose_config, explain
from optimizer.search.flags import LaunchCommand, launch_commands
from optimizer.search.objective import Evaluation, TraceEvaluator
from optimizer.search.recommend import (
    BaselineComparison,
    ParetoRow,
    baseline_config,
    compare,
    pareto_front,
    recommend,
)
from optimizer.search.request import TuneRequest
from optimizer.search.study import TrialOutcome

OUTCOME_SCHEMA_VERSION = 1


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
    evaluation: Evaluation
    slo_checks: tuple[SLOCheck, ...]
    launch: tuple[LaunchCommand, ...]

    def yaml(self) -> str:
        return yaml.safe_dump(self.config.to_dict(), sort_keys=False)


@dataclass(frozen=True, slots=True)
class TuneOutcome:
    request: TuneRequest
    study_name: str
    num_trials: int
    latency_label: str  # e.g. "roofline estimate" or "learned (aiconfigurator)"
    latency_is_estimate: bool
    recommendation: Recommendation | None  # None: no config meets the SLOs at the trace's rate
    baseline: BaselineComparison
    pareto: tuple[ParetoRow, ...]
    diagnosis: Diagnosis

    def to_dict(self) -> dict[str, Any]:
        rec = None
        if self.recommendation is not None:
            r = self.recommendation
            rec = {
                "trial": r.trial,
                "config": r.config.to_dict(),
                "predicted": r.evaluation.to_dict(),
                "slo_checks": [
                    {"metric": c.metric, "predicted": c.predicted, "target": c.target, "ok": c.ok}
                    for c in r.slo_checks
                ],
                "launch": [
                    {"engine": c.engine, "role": c.role, "count": c.count, "command": c.command}
                    for c in r.launch
                ],
            }
        b = self.baseline
        return {
            "schema_version": OUTCOME_SCHEMA_VERSION,
            "request": self.request.to_dict(),
            "study_name": self.study_name,
            "num_trials": self.num_trials,
            "latency": {"label": self.latency_label, "is_estimate": self.latency_is_estimate},
            "recommendation": rec,
            "baseline": {
                "description": b.description,
                "config": b.config.to_dict(),
                "predicted": b.evaluation.to_dict(),
                "gain": b.gain,
            },
            "pareto": [
                {
                    "trial": p.trial,
                    "meets_slo": p.meets_slo,
                    "config": p.config.to_dict(),
                    "predicted": p.evaluation.to_dict(),
                }
                for p in self.pareto
            ],
            "diagnosis": self.diagnosis.to_dict(),
        }


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
    latency_label: str,
    latency_is_estimate: bool,
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
        latency_label=latency_label,
        latency_is_estimate=latency_is_estimate,
        recommendation=rec,
        baseline=comparison,
        pareto=tuple(pareto_front(outcomes, per_dollar=per_dollar)),
        diagnosis=Diagnosis(d_base, d_rec, account),
    )
