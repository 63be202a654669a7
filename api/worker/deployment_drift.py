"""A schedule over a deployment: each due time observes its Prometheus window and
re-tunes when the traffic drifted, or when the prediction error passed a threshold.

One due time runs in steps, because the slow ones (Prometheus queries and simulations,
which may store compiled latency tables) must not hold a transaction open:
1. claim the due schedule and advance its `next_run_at` (one transaction): the due time
   is taken once, by one worker; a worker that dies after this skips it, never repeats it;
2. read the window from Prometheus and simulate the deployed config under it (priced
   with the deployment's calibration), outside any transaction;
3. judge it against the baseline (a read); a window that re-tunes is then calibrated on
   (`fit_window`: how the deployed config behaves at the new traffic), outside any
   transaction;
4. store the observation, that calibration and the re-tune, and record why (one
   transaction).

The decision compares the window with the schedule's **baseline**: the window the
deployed config is answering for. The first window sets it. A re-tune moves it to the
window that caused the re-tune, so one drift re-tunes once: later windows of the same
traffic compare with the drifted window, not with the old one.
- **traffic drift**: the request rate, or the mean or p90 of prompt or output lengths
  (from the token histograms), changed by more than `drift_threshold` (relative) from the
  baseline's (`api.services.stream_windows.drift`, as stream schedules measure it);
- **prediction error**: `error_threshold` set, the window's p90 TTFT or ITL predicted
  more than that far (relative) from what it observed, and the baseline's within it (the
  error passed the threshold since the baseline).

The re-tune's workload is the window's traffic as `observe` rebuilt it, stored as a trace
(named after the deployment and the observation); its job's request is the schedule's,
pinned to that trace, and keeps `deployment_id`, so the search is priced with the
deployment's newest calibration: the one fitted on that window. A schedule with a `plan`
queues a plan job instead: the plan pinned to that trace, sizing the deployed unit unless
the plan names one (`storage.schedules.deployed_plan`).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from api.services.calibrate import deployment_latency
from api.services.ingest import store_workload
from api.services.latency import resolve_latency
from api.services.observe import Observed, ObserveError, observe, read_prometheus, store
from api.services.prometheus import PrometheusError
from api.services.stream_windows import drift
from api.settings import get_settings
from optimizer.config import ServingConfig
from optimizer.latency.base import LatencySource
from optimizer.plan import PlanError
from optimizer.telemetry import (
    ObservedWindow,
    TelemetryError,
    reconstruct_workload,
)
from optimizer.telemetry.calibrate import WindowFit, fit_window
from storage.db import session_scope
from storage.deployment_calibrations import save_calibration
from storage.deployments import (
    DeploymentNotFound,
    get_deployment,
    get_observation,
    observed_window_of,
)
from storage.jobs import enqueue_job, get_job
from storage.schedules import deployed_plan
from storage.service_records import (
    DeploymentObservation,
    JobParams,
    ScheduleInfo,
    WindowSummary,
)


@dataclass(frozen=True, slots=True)
class Outcome:
    fired: bool
    reason: str
    job_id: int | None = None
    baseline_observation_id: int | None = None


def summary(window: ObservedWindow) -> WindowSummary:
    """The drift figures of an observed window (lengths from its token histograms)."""
    return WindowSummary(
        trace_ids=(),
        num_requests=window.num_requests,
        mean_rate=window.request_rate,
        input_mean=window.prompt_tokens.mean,
        input_p90=window.prompt_tokens.quantile(0.9),
        output_mean=window.generation_tokens.mean,
        output_p90=window.generation_tokens.quantile(0.9),
    )


def p90_error(*pairs: tuple[float | None, float | None]) -> float:
    """The largest |predicted / observed - 1| of (observed, predicted) p90 pairs (NaN if
    none has both)."""
    errors = [
        abs(p / ob - 1)
        for ob, p in pairs
        if ob is not None and p is not None and ob > 0 and math.isfinite(p)
    ]
    return max(errors) if errors else math.nan


@dataclass(frozen=True, slots=True)
class _Window:
    """A window read and simulated (step 2), with what priced it."""

    observed: Observed
    config: ServingConfig
    base: LatencySource  # the latency model before the deployment's calibration
    calibration_id: int | None


@dataclass(frozen=True, slots=True)
class _Verdict:
    """Why the window re-tunes (no reasons: it does not), judged against the baseline."""

    reasons: tuple[str, ...]
    note: str  # what is said when it does not re-tune
    new_baseline: bool  # no baseline yet, or it is gone: this window becomes it


def _observe(engine: Engine, schedule: ScheduleInfo, now: datetime) -> _Window:
    """Step 2: the window ending `now`, read and simulated (ObserveError, PrometheusError,
    TelemetryError or DeploymentNotFound with the reason otherwise)."""
    with session_scope(engine) as s:
        deployed = get_deployment(s, schedule.deployment_id)
        base = resolve_latency(s, deployed.config.model, num_threads=get_settings().native_threads)
        latency = deployment_latency(s, deployed.id, base.source, base.label)
    if deployed.prometheus_url is None or deployed.label_selector is None:
        raise ObserveError(f"deployment {deployed.id} has no Prometheus URL and selector")
    window_s = schedule.params.window_s
    before, after = read_prometheus(deployed.prometheus_url, deployed.label_selector,
                                    window_s, now)  # fmt: skip
    observed = observe(before, after, window_s, deployed.config, latency.source, latency.label)
    return _Window(observed, deployed.config, base.source, latency.calibration_id)


def observe_and_decide(engine: Engine, schedule: ScheduleInfo, now: datetime) -> Outcome:
    """Steps 2 and 3 for a claimed deployment schedule whose due time was advanced. A
    window that re-tunes is first calibrated on (the deployed config's behaviour at the
    new traffic), outside any transaction, and the re-tune is priced with that."""
    if schedule.last_job_id is not None:
        with session_scope(engine) as s:
            previous = get_job(s, schedule.last_job_id)
        if not previous.status.finished:
            return Outcome(False, f"previous job {previous.id} is still {previous.status}")
    try:
        w = _observe(engine, schedule, now)
    except (ObserveError, PrometheusError, TelemetryError, DeploymentNotFound) as exc:
        return Outcome(False, f"no window observed: {exc}")
    with session_scope(engine) as s:
        verdict = _judge(s, schedule, w.observed)
    fit = None
    if verdict.reasons:
        try:
            fit = fit_window(w.observed.window, w.config, w.base, seed=schedule.params.seed)
        except TelemetryError:
            fit = None  # the re-tune keeps the deployment's calibration
    with session_scope(engine) as s:
        stored = store(s, schedule.deployment_id, w.observed, calibration_id=w.calibration_id)
        return _act(s, schedule, w, stored, verdict, fit)


def _judge(s: Session, schedule: ScheduleInfo, observed: Observed) -> _Verdict:
    current = summary(observed.window)
    base_id = schedule.baseline_observation_id
    if base_id is None:
        return _Verdict((), "baseline set", True)
    try:
        baseline = summary(observed_window_of(s, schedule.deployment_id, base_id))
        base = get_observation(s, schedule.deployment_id, base_id)
        base_error = p90_error((base.ttft_p90_observed_s, base.ttft_p90_predicted_s),
                               (base.itl_p90_observed_s, base.itl_p90_predicted_s))  # fmt: skip
    except (LookupError, ValueError):
        return _Verdict((), f"baseline {base_id} is gone; new baseline", True)
    reasons = []
    changes = drift(baseline, current)
    over = [c for c in changes if c.relative > schedule.drift_threshold]
    if over:
        shifted = "; ".join(c.describe() for c in over)
        reasons.append(f"traffic drift beyond {schedule.drift_threshold:.0%} since "
                       f"observation {base_id}: {shifted}")  # fmt: skip
    r = observed.report
    limit = schedule.error_threshold
    error = p90_error((r.ttft.observed.p90, r.ttft.predicted.p90),
                      (r.itl.observed.p90, r.itl.predicted.p90))  # fmt: skip
    if limit is not None and error > limit and not base_error > limit:
        reasons.append(f"p90 prediction error {error:.0%} passed {limit:.0%} "
                       f"(observation {base_id}: {base_error:.0%})")  # fmt: skip
    note = (f"no drift: largest change {changes[0].describe()} is within "
            f"{schedule.drift_threshold:.0%} of observation {base_id}")  # fmt: skip
    return _Verdict(tuple(reasons), note, False)


def _act(
    s: Session,
    schedule: ScheduleInfo,
    w: _Window,
    stored: DeploymentObservation,
    verdict: _Verdict,
    fit: WindowFit | None,
) -> Outcome:
    current = summary(w.observed.window)
    what = (
        f"observation {stored.id}: {current.num_requests:,} requests, {current.mean_rate:.2f} req/s"
    )
    if not verdict.reasons:
        new = stored.id if verdict.new_baseline else None
        return Outcome(False, f"{verdict.note}: {what}", baseline_observation_id=new)
    reason = "; ".join(verdict.reasons)
    if fit is not None:
        cal = save_calibration(
            s, schedule.deployment_id, fitted_on=stored.id, checked_on=None,
            overhead_s=fit.overhead_s, prefill_scale=fit.prefill_scale,
            decode_scale=fit.decode_scale, fit=fit.to_dict(),
        )  # fmt: skip
        reason += f"; recalibrated on it ({cal.describe()})"
    workload = reconstruct_workload(
        w.observed.window, seed=schedule.params.seed, max_model_len=w.config.max_model_len
    )
    digest = hashlib.sha256(
        f"deployment {schedule.deployment_id} observation {stored.id}".encode()
    ).hexdigest()
    name = f"deployment-{schedule.deployment_id}-window-{stored.id}"
    trace = store_workload(s, workload, digest=digest, project=schedule.project, name=name)
    params: JobParams = schedule.params
    if schedule.plan is not None:
        try:
            params = deployed_plan(replace(schedule.plan, trace_id=trace.id), w.config)
        except PlanError as exc:
            return Outcome(False, f"{reason}; no plan made: {exc}", baseline_observation_id=None)
    doing = "re-planning" if schedule.plan is not None else "re-tuning"
    reason += f"; {doing} on {what} (trace {trace.id})"
    job = enqueue_job(
        s, project=schedule.project, params=params,
        window=replace(current, trace_ids=(trace.id,)), schedule_id=schedule.id,
        trigger_reason=reason,
    )  # fmt: skip
    return Outcome(True, reason, job.id, baseline_observation_id=stored.id)
