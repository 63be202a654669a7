"""Records of the service's own tables: API keys, jobs, schedules, recommendations,
deployments.

Frozen dataclasses returned by storage/keys.py, jobs.py, schedules.py,
recommendations.py and deployments.py; ORM rows never leave `storage/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from optimizer.config import ServingConfig
from optimizer.plan import PlanPart, PlanProgress, PlanRequest
from optimizer.search import Recommendation, TuneProgress, TuneRequest


@dataclass(frozen=True, slots=True)
class WindowSummary:
    """The workload a job was tuned on, summarised for the drift trigger."""

    trace_ids: tuple[int, ...]
    num_requests: int
    mean_rate: float  # requests/s
    input_mean: float
    input_p90: float
    output_mean: float
    output_p90: float


@dataclass(frozen=True, slots=True)
class ApiKeyInfo:
    id: int
    project: str
    name: str
    prefix: str  # the first characters of the key, to tell keys apart
    is_admin: bool
    created_at: datetime
    revoked_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the project a key belongs to and whether it may manage keys."""

    key_id: int
    project: str
    is_admin: bool


class JobKind(StrEnum):
    """What a job does; its params and progress are that kind's own types
    (`JobParams`, `JobProgress`), and its result is stored where that kind keeps it: a
    tuning job's `TuneOutcome` in the job row, a plan job's `FleetPlan` in `plans`, a
    plan part's `FleetReplay` (one fleet of its parent plan job) in the job row."""

    TUNING = "tuning"
    PLAN = "plan"
    PLAN_PART = "plan_part"

    @property
    def label(self) -> str:
        """How messages name a job of this kind: "tuning job", "plan job"."""
        return f"{self.value} job"


# A job's request and what it reports while running, by kind (a tuning job's are the
# search's `TuneRequest` and `TuneProgress`, a plan job's `PlanRequest` and `PlanProgress`,
# a plan part's `PlanPart` and `PlanProgress`).
JobParams = TuneRequest | PlanRequest | PlanPart
JobProgress = TuneProgress | PlanProgress


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


@dataclass(frozen=True, slots=True)
class JobInfo:
    id: int
    project: str
    kind: JobKind
    status: JobStatus
    params: JobParams  # the kind's request: TuneRequest, PlanRequest or PlanPart
    created_at: datetime
    progress: JobProgress | None = None
    window: WindowSummary | None = None  # the workload resolved when the job was created
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    attempts: int = 0
    cancel_requested: bool = False
    worker: str | None = None  # the lease holder while running
    schedule_id: int | None = None
    trigger_reason: str | None = None  # why a schedule fired this job


@dataclass(frozen=True, slots=True)
class JobResult:
    """A finished job's `TuneOutcome` as stored: its JSON (`TuneOutcome.to_dict()`,
    schema_version 3; jobs finished before 2026-12 keep the layout they were stored with)."""

    job_id: int
    outcome: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job a worker holds the lease of; `attempt` guards every later write."""

    job: JobInfo
    worker: str
    attempt: int


class ScheduleTrigger(StrEnum):
    ALWAYS = "always"  # re-tune at every due time
    DRIFT = "drift"  # re-tune only when the window drifted from the recommendation's


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    id: int
    project: str
    name: str
    params: TuneRequest  # params.stream is the stream; params.window_s the window
    interval_s: float | None
    cron: str | None
    trigger: ScheduleTrigger
    drift_threshold: float  # relative change of rate or length figures that counts
    paused: bool
    next_run_at: datetime | None
    created_at: datetime
    last_run_at: datetime | None = None
    last_decision: str | None = None  # "fired", "skipped"
    last_reason: str | None = None
    last_job_id: int | None = None
    num_fired: int = 0
    # A schedule over a deployment (`params.deployment_id`): each due time observes its
    # Prometheus window and re-tunes when the traffic drifted from the baseline window by
    # more than `drift_threshold`, or the p90 prediction error passed `error_threshold`.
    deployment_id: int | None = None
    error_threshold: float | None = None
    baseline_observation_id: int | None = None  # the window the deployed config answers
    # A schedule with a plan queues a plan job instead of a tuning job each time it fires:
    # this request pinned to the window's trace (a deployment's: the deployed unit unless
    # the plan names one). `params` still names the workload (stream or deployment, window).
    plan: PlanRequest | None = None


@dataclass(frozen=True, slots=True)
class RecommendationInfo:
    id: int
    project: str
    job_id: int
    source: str  # "trace:ID" or "stream:NAME"
    model: str
    gpu: str  # the request's GPU types, comma-separated
    gpu_budget: int  # the request's GPU budget (the fleet's GPUs: recommendation.predicted)
    slo_ttft_ms: float
    slo_tpot_ms: float
    attainment_target: float  # the request's share of requests that must meet the SLOs
    created_at: datetime
    recommendation: Recommendation
    window: WindowSummary | None = None


@dataclass(frozen=True, slots=True)
class Deployment:
    """A config running in production. Its engine and version are `config.engine` and
    `config.engine_version`, its GPUs `config.num_gpus`. `prometheus_url` and
    `label_selector` say where its metrics are (read by `servetune observe --window`)."""

    id: int
    project: str
    name: str
    config: ServingConfig
    created_at: datetime
    recommendation_id: int | None = None  # the stored recommendation it was deployed from
    prometheus_url: str | None = None  # http(s) base URL of the Prometheus HTTP API
    label_selector: str | None = None  # a `{...}` label matcher, e.g. '{job="vllm"}'


@dataclass(frozen=True, slots=True)
class DeploymentCalibration:
    """A deployment's own correction (`optimizer.telemetry.calibrate`): a per-step overhead
    and prefill and decode scales fitted on observation `fitted_on`, checked on the later
    `checked_on` (None when none was given). `fit` is `WindowFit.to_dict()` plus, under
    "check", `WindowCheck.to_dict()`."""

    id: int
    deployment_id: int
    created_at: datetime
    fitted_on: int
    checked_on: int | None
    overhead_s: float
    prefill_scale: float
    decode_scale: float
    fit: dict[str, Any]

    def describe(self) -> str:
        return (
            f"deployment calibration {self.id} (fitted on observation {self.fitted_on}: "
            f"overhead {self.overhead_s * 1e3:.2f} ms/step, prefill x{self.prefill_scale:.2f}, "
            f"decode x{self.decode_scale:.2f})"
        )


@dataclass(frozen=True, slots=True)
class DeploymentObservation:
    """One window of a deployment's metrics against the simulator's prediction.

    `report` is `ObservationReport.to_dict()` (docs/observe.md); the p90s (seconds) and
    the rate are copied out of it into columns of their own."""

    id: int
    deployment_id: int
    created_at: datetime
    window_s: float
    before_sha256: str  # of the two scrapes' text
    after_sha256: str
    latency: str  # what priced the prediction
    priced_as: str  # the engine release whose step rules priced it
    request_rate: float  # finished requests/s in the window
    ttft_p90_observed_s: float | None
    ttft_p90_predicted_s: float | None
    itl_p90_observed_s: float | None
    itl_p90_predicted_s: float | None
    report: dict[str, Any]
    calibration_id: int | None = None  # the deployment calibration that priced it
