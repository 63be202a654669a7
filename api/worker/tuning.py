"""The real tuning executor: issue 5's `api.services.tuning.run_tuning_job`, adapted to the queue.

The job's `TuningParams` become a `TuneRequest` (a stream job tunes on the newest
upload of the window it resolved at creation); progress and the outcome are
translated into the service's records. The Optuna study `ctx.study_name` lives
in the service database, so a job taken over after a crash resumes it: finished
trials are kept and never re-run.
"""

from __future__ import annotations

import math

from api.worker.context import JobContext, JobFailed
from storage.tuning_records import (
    Baseline,
    Engine,
    JobProgress,
    LaunchCommand,
    ParetoPoint,
    Recommendation,
    TuningOutcome,
    TuningParams,
)


def to_request(params: TuningParams, trace_id: int | None):
    """The search's request for these params; JobFailed when the search rejects them."""
    from api.services.tuning import TuneRequest, TuneRequestError

    if trace_id is None:
        raise JobFailed("the job has no trace: its stream window was empty")
    try:
        return TuneRequest(
            trace_id=trace_id,
            model=params.model,
            gpus=(params.gpu,),
            gpu_budget=params.num_gpus,
            slo_ttft_ms=params.slo_ttft_ms,
            slo_tpot_ms=params.slo_tpot_ms,
            attainment=params.attainment,
            n_trials=params.num_trials,
            seed=params.seed,
        )
    except (TuneRequestError, ValueError) as exc:
        raise JobFailed(f"invalid tuning request: {exc}") from exc


def _numbers(values: dict) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in values.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def to_outcome(outcome) -> TuningOutcome:
    pareto = tuple(
        ParetoPoint(
            trial=p.trial,
            goodput_per_gpu=p.evaluation.goodput_per_gpu,
            interactivity_tok_s=p.evaluation.interactivity_tok_s,
            num_gpus=p.evaluation.num_gpus,
            meets_slo=p.meets_slo,
            config=p.config.to_dict(),
        )
        for p in outcome.pareto
    )
    rec = None
    if outcome.recommendation is not None:
        r = outcome.recommendation
        predicted = _numbers(r.evaluation.to_dict())
        predicted.update({f"slo_{c.metric}": float(c.target) for c in r.slo_checks})
        rec = Recommendation(
            trial=r.trial,
            goodput_per_gpu=r.evaluation.goodput_per_gpu,
            interactivity_tok_s=r.evaluation.interactivity_tok_s,
            num_gpus=r.evaluation.num_gpus,
            predicted=predicted,
            launch_commands=tuple(
                LaunchCommand(
                    Engine(c.engine), c.role if c.count == 1 else f"{c.role} ×{c.count}", c.command
                )
                for c in r.launch
            ),
            config=r.config.to_dict(),
        )
    b = outcome.baseline
    baseline = Baseline(
        description=b.description,
        goodput_per_gpu=b.evaluation.goodput_per_gpu,
        interactivity_tok_s=b.evaluation.interactivity_tok_s,
        predicted=_numbers(b.evaluation.to_dict()),
        gain=float(b.gain) if b.gain is not None else 0.0,
    )
    notes = (f"Latency model: {outcome.latency_label}.",)
    return TuningOutcome(
        pareto=pareto,
        recommendation=rec,
        baseline=baseline,
        diagnosis=tuple(outcome.diagnosis.account) + notes,
        num_trials=outcome.num_trials,
    )


def run_tuning(ctx: JobContext) -> TuningOutcome:
    params, window = ctx.job.params, ctx.job.window
    trace_id = params.trace_id
    if trace_id is None and window is not None and window.trace_ids:
        trace_id = window.trace_ids[-1]
    request = to_request(params, trace_id)
    from api.services.tuning import run_tuning_job

    def on_progress(p) -> None:
        ctx.report(JobProgress(p.trials_done, p.trials_total, p.best_per_gpu_goodput, p.eta_s))

    try:
        outcome = run_tuning_job(
            request,
            database_url=ctx.storage_url,
            study_name=ctx.study_name,
            should_stop=ctx.should_stop,
            on_progress=on_progress,
        )
    except LookupError as exc:  # the trace was deleted since the job was queued
        raise JobFailed(str(exc)) from exc
    return to_outcome(outcome)
