"""A tuning job on stored data: `run_tuning_job(request, ...) -> TuneOutcome`.

A job loads its trace from storage, creates or RESUMES the Optuna study named
`study_name` in the same database (completed trials are kept and never
re-run; trials left RUNNING by a dead worker are failed after the heartbeat
grace period and re-queued), runs trials until the study holds
`request.num_trials` finished ones (counted across every worker), stops soon
after `should_stop()` turns true (with `workers` > 1, that many processes run
trials on the study together), verifies the best units as sized fleets on the
whole trace, and stores the outcome with the trace, latency model and search
settings that produced it. `servetune tune`, the
REST job worker and `servetune tune-worker` (`run_worker`) all run it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace

from api.services.latency import ResolvedLatency, resolve_latency
from optimizer.engines import EngineOverhead
from optimizer.latency.base import LatencySource
from optimizer.search.closed_loop import ClosedLoopEvaluator
from optimizer.search.evaluation import Evaluator, TrialError
from optimizer.search.floors import check_floors, request_lengths
from optimizer.search.outcome import LatencyInfo, TuneOutcome, build_outcome
from optimizer.search.request import TuneProgress, TuneRequest, TuneRequestError
from optimizer.search.space import SearchSpace
from optimizer.search.study import (
    Objective,
    count_finished,
    make_storage,
    open_study,
    rejected_trials,
    run_trials,
    trial_outcomes,
    warm_cache,
)
from optimizer.search.trace_evaluator import TraceEvaluator
from optimizer.workload import Workload

__all__ = [
    "TrialError",
    "TuneOutcome",
    "TuneProgress",
    "TuneRequest",
    "TuneRequestError",
    "run_tuning_job",
    "run_worker",
]


def stored_latency(
    database_url: str,
    model: str,
    num_threads: int = 1,
    overhead: EngineOverhead | None = None,
    *,
    deployment_id: int | None = None,
) -> ResolvedLatency:
    """The latency source for `model`: the newest fitted model stored per accelerator,
    the roofline estimate (labelled as such) for any other accelerator; `overhead`
    replaces the models' engine overhead (see `resolve_latency`). For a deployment, its
    newest calibration is applied (`api.services.calibrate.deployment_latency`)."""
    from api.services.calibrate import deployment_latency
    from storage.db import make_engine, session_scope

    engine = make_engine(database_url)
    try:
        with session_scope(engine) as s:
            resolved = resolve_latency(s, model, num_threads=num_threads, overhead=overhead)
            if deployment_id is None:
                return resolved
            applied = deployment_latency(s, deployment_id, resolved.source, resolved.label)
            return replace(resolved, source=applied.source, label=applied.label)
    finally:
        engine.dispose()


@dataclass(frozen=True, slots=True)
class _Setup:
    evaluator: Evaluator
    objective: Objective
    latency: ResolvedLatency

    @property
    def space(self) -> SearchSpace:
        return self.objective.space


def prepare(request: TuneRequest, trace: Workload | None, resolved: ResolvedLatency) -> _Setup:
    """The evaluator and objective of `request`: on `trace` (its stored trace), or on its
    closed-loop benchmark (`request.workload`; `trace` None)."""
    settings = request.eval_settings()
    evaluator: Evaluator
    if trace is None:
        evaluator = ClosedLoopEvaluator.for_spec(request.bench_spec(), resolved.source, settings)
        space = request.space(trace_has_prefix_hashes=evaluator.workload.prefix_hashes is not None)
    else:
        evaluator = TraceEvaluator.for_trace(trace, resolved.source, settings)
        space = request.space(
            trace_has_prefix_hashes=trace.prefix_hashes is not None,
            trace_has_acceptance=trace.acceptance_length is not None,
        )
    return _Setup(evaluator, Objective(space, evaluator, per_dollar=bool(space.prices)), resolved)


def _trace_of(database_url: str, request: TuneRequest) -> Workload | None:
    """The request's stored trace (None for a closed-loop benchmark)."""
    if request.workload is not None:
        return None
    if request.trace_id is None:
        raise TuneRequestError(
            "a tuning job runs on a stored trace (trace_id) or a closed-loop benchmark "
            "(workload); the service resolves a stream's window to its newest upload first"
        )
    return _load_trace(database_url, request.trace_id)


def _load_trace(database_url: str, trace_id: int) -> Workload:
    from storage.db import make_engine, session_scope
    from storage.traces import load_trace_columns

    engine = make_engine(database_url)
    try:
        with session_scope(engine) as s:
            return Workload.from_columns(load_trace_columns(s, trace_id), name=f"trace-{trace_id}")
    finally:
        engine.dispose()


def _progress(
    study, num_trials: int, started: float, done_at_start: int
) -> Callable[[int], TuneProgress]:
    def make(done: int) -> TuneProgress:
        feasible = [o.evaluation for o in trial_outcomes(study) if o.evaluation.feasible]
        best = max((e.goodput_per_gpu for e in feasible), default=None)
        fewest = min((e.num_gpus for e in feasible), default=None)
        ran = done - done_at_start
        eta = (time.monotonic() - started) / ran * (num_trials - done) if ran > 0 else None
        return TuneProgress(done, num_trials, best, eta, fewest)

    return make


def run_worker(
    database_url: str,
    study_name: str,
    *,
    should_stop: Callable[[], bool] = lambda: False,
    on_progress: Callable[[TuneProgress], None] = lambda _p: None,
    latency: LatencySource | None = None,
    num_threads: int = 1,
) -> int:
    """Join an existing study (its request is stored on it) and run trials until its budget
    is reached; returns the number of finished trials."""
    storage = make_storage(database_url)
    import optuna

    summary = optuna.study.load_study(study_name=study_name, storage=storage)
    raw = summary.user_attrs.get("request")
    if raw is None:
        raise LookupError(f"study {study_name!r} was not created by servetune (no request)")
    request = TuneRequest.from_dict(json.loads(raw))
    resolved = _resolved(database_url, request, latency, num_threads)
    setup = prepare(request, _trace_of(database_url, request), resolved)
    study = open_study(study_name, storage, seed=request.seed + _worker_salt())
    warm_cache(study, setup.evaluator)
    start, first = time.monotonic(), count_finished(study)
    progress = _progress(study, request.num_trials, start, first)
    return run_trials(
        study,
        setup.objective,
        request.num_trials,
        should_stop=should_stop,
        on_trial=lambda d: on_progress(progress(d)),
    )


def _resolved(
    database_url: str, request: TuneRequest, latency: LatencySource | None, num_threads: int
) -> ResolvedLatency:
    if latency is None:
        return stored_latency(
            database_url, request.model, num_threads, deployment_id=request.deployment_id
        )
    return ResolvedLatency(latency, "custom latency source", False)


def _worker_salt() -> int:
    import os

    return os.getpid() % 9973  # extra workers sample differently from the job's own sampler


def _worker_process(database_url: str, study_name: str, num_threads: int, stop) -> None:
    """An extra worker process of `run_tuning_job` (`workers` > 1)."""
    run_worker(database_url, study_name, should_stop=stop.is_set, num_threads=num_threads)


@contextmanager
def _extra_workers(database_url: str, study_name: str, count: int, num_threads: int):
    """`count` worker processes on the study while the block runs; stopped and joined after
    it (a worker's failed trial is found in the study by the job's own `run_trials`)."""
    if count <= 0:
        yield
        return
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [
        ctx.Process(
            target=_worker_process,
            args=(database_url, study_name, num_threads, stop),
            name=f"servetune-tune-{i + 1}",
            daemon=True,
        )
        for i in range(count)
    ]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()
                p.join()


def run_tuning_job(
    request: TuneRequest,
    *,
    database_url: str,
    study_name: str,
    should_stop: Callable[[], bool],
    on_progress: Callable[[TuneProgress], None],
    latency: LatencySource | None = None,
    num_threads: int = 1,
    workers: int = 1,
) -> TuneOutcome:
    from storage.db import make_engine, session_scope, upgrade_database
    from storage.tuning import TuningStatus, finish_tuning_run, start_tuning_run

    if workers > 1 and latency is not None:
        raise ValueError(
            "workers > 1: the extra worker processes price with the stored latency models, "
            "not a custom latency source"
        )
    upgrade_database(database_url)  # ours first: Optuna then leaves alembic_version alone
    trace = _trace_of(database_url, request)
    check_floors(request, request_lengths(request, trace))  # FloorError: nothing stored
    setup = prepare(request, trace, _resolved(database_url, request, latency, num_threads))
    release = setup.space.release
    tables = setup.latency.tables_for(setup.space.accelerators, release)
    which = f"; this search: {tables}" if tables else ""
    label = f"{setup.latency.label}{which}; priced as {release.label}"
    engine = make_engine(database_url)
    try:
        with session_scope(engine) as s:
            start_tuning_run(
                s,
                study_name=study_name,
                trace_id=request.trace_id,
                model=request.model,
                request=request.to_dict(),
                search_space=setup.space.to_dict(),
                latency_label=label,
            )
        study = open_study(study_name, make_storage(database_url), seed=request.seed)
        study.set_user_attr("request", json.dumps(request.to_dict(), sort_keys=True))
        study.set_user_attr("latency", label)
        warm_cache(study, setup.evaluator)
        start, first = time.monotonic(), count_finished(study)
        progress = _progress(study, request.num_trials, start, first)
        on_progress(progress(first))
        with _extra_workers(database_url, study_name, workers - 1, num_threads):
            done = run_trials(
                study,
                setup.objective,
                request.num_trials,
                should_stop=should_stop,
                on_trial=lambda d: on_progress(progress(d)),
            )
        warm_cache(study, setup.evaluator)  # the other workers' screens
        last = progress(done)

        def on_step(message: str) -> None:
            on_progress(replace(last, eta_s=None, stage=message))

        outcome = build_outcome(
            request,
            setup.space,
            trial_outcomes(study),
            setup.evaluator,
            study_name=study_name,
            num_trials=done,
            latency=LatencyInfo(label, setup.latency.is_estimate),
            rejected=rejected_trials(study),
            on_step=on_step,
        )
        status = TuningStatus.DONE if done >= request.num_trials else TuningStatus.STOPPED
        with session_scope(engine) as s:
            finish_tuning_run(s, study_name, outcome.to_dict(), status)
        rec = outcome.recommendation
        gpus = None if rec is None else rec.predicted.num_gpus
        on_progress(replace(last, eta_s=None, stage="done", recommended_gpus=gpus))
        return outcome
    finally:
        engine.dispose()
