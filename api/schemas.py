"""API-only shapes: pages, created answers, problems, key creation.

Core records (TraceInfo, JobInfo, TuneRequest ...) are served and validated as
the dataclasses they are; only shapes that exist solely in the API live here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from optimizer.plan import FleetPlan
from optimizer.records import TraceWarning
from optimizer.search import TuneOutcome, TuneRequest
from storage.service_records import ApiKeyInfo, JobStatus, ScheduleTrigger

T = TypeVar("T")

# A request body with a misspelt field (`num_trial`) is refused with the field named, not
# silently run with the default: the core's request dataclass as a body, and every
# API-only body below.
TuneRequest.__pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[attr-defined]


class StrictBody(BaseModel):
    """A request body: unknown fields are refused (422 naming them)."""

    model_config = ConfigDict(extra="forbid")


class FieldError(BaseModel):
    where: str = Field(description="dotted location, e.g. body.slo_ttft_ms or query.limit")
    message: str


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str = Field(examples=["https://servetune.dev/problems/not-found"])
    title: str = Field(examples=["Not Found"])
    status: int = Field(examples=[404])
    detail: str = Field(examples=["tuning job 42 not found"])
    instance: str | None = Field(None, examples=["/v1/tuning-jobs/42"])
    errors: list[FieldError] | None = None


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int = Field(description="matching items in all pages")
    limit: int
    offset: int
    next_offset: int | None = Field(None, description="offset of the next page; null at the end")
    next_after: int | None = Field(
        None,
        description="keyset cursor of the next page (its `after`: the id of this page's last "
        "item); null at the end. Stable while items are added, unlike offsets",
    )


def page(items: Sequence[T], *, total: int, limit: int, offset: int) -> Page[T]:
    """A page of `items`: read with `limit + 1` rows (one more than the page) so that
    whether another page follows is known without counting."""
    shown = list(items[:limit])
    more = len(items) > limit
    return Page[T](
        items=shown,
        total=total,
        limit=limit,
        offset=offset,
        next_offset=offset + len(shown) if more else None,
        next_after=shown[-1].id if more else None,  # type: ignore[attr-defined]
    )


class JobCreated(BaseModel):
    id: int = Field(examples=[17])
    status: JobStatus = Field(examples=["queued"])
    status_url: str = Field(examples=["/v1/tuning-jobs/17"])
    result_url: str = Field(examples=["/v1/tuning-jobs/17/result"])
    ui_url: str = Field(examples=["/ui/jobs/17"])


class TraceCreated(BaseModel):
    id: int = Field(examples=[3])
    created: bool = Field(description="false: the same content was already stored (idempotent)")
    name: str
    stream: str | None = None
    num_requests: int
    warnings: list[str] = Field([], description="the repairs made (a sort, dropped rows)")
    num_dropped: int = 0
    plausibility_warnings: list[TraceWarning] = Field(
        [],
        description="figures real traffic hardly shows (a request rate, a span, a length); "
        "the trace is stored all the same, with them",
    )


class KeyCreate(StrictBody):
    project: str = Field(examples=["team-a"], min_length=1, max_length=100)
    name: str = Field("", max_length=200, examples=["ci"])
    is_admin: bool = False


class KeyCreated(BaseModel):
    id: int
    key: str = Field(description="shown only now; store it safely", examples=["st_k3y..."])
    info: ApiKeyInfo


class Health(BaseModel):
    status: str = Field(examples=["ok"])
    detail: str | None = None


class ScheduleCreate(StrictBody):
    """A re-tuning schedule over a trace stream (params.stream) and its rolling window, or
    over a deployment (params.deployment_id alone; trigger drift): each due time observes
    its Prometheus window of params.window_s and re-tunes on drift or prediction error.
    With `plan` it re-plans instead: each firing queues a plan job on the window."""

    name: str = Field("", max_length=200, pattern=r"^[^\x00-\x1f\x7f]*$", examples=["nightly"])
    params: TuneRequest
    interval_s: float | None = Field(None, ge=1, le=10 * 365 * 86400, examples=[3600])
    cron: str | None = Field(None, max_length=200, examples=["0 3 * * *"])
    trigger: ScheduleTrigger = Field(
        ScheduleTrigger.ALWAYS,
        description="always: re-tune at every due time; drift: only when the window's rate or "
        "length figures moved beyond drift_threshold since the current recommendation",
    )
    drift_threshold: float = Field(0.2, gt=0, le=10, description="relative change, 0.2 = 20%")
    error_threshold: float | None = Field(
        None, gt=0, le=10,
        description="a deployment schedule also re-tunes when the p90 TTFT or ITL prediction "
        "error passes this relative error (0.25 = 25%)",
    )  # fmt: skip
    plan: dict[str, Any] | None = Field(
        None,
        description="queue a plan job instead of a tuning job each time it fires: the body of "
        "POST /v1/plans without trace_id or stream (the plan runs on the fired window's "
        "trace); its model, SLOs, attainment and gpu_budget as in params, its gpu among "
        "params.gpu_types. A deployment's plan sizes the deployed unit unless it names one. "
        "A stream schedule that plans fires at every due time (trigger always)",
        examples=[{"model": "llama-3.1-8b", "gpu": "h100", "slo_ttft_ms": 2000,
                   "slo_tpot_ms": 50, "gpu_budget": 8, "window_s": 600, "cold_start_s": 60}],
    )  # fmt: skip


_PRINTABLE = r"^[^\x00-\x1f\x7f]*$"


class PrometheusFields(StrictBody):
    """Where a deployment's metrics are (stored; read by a later slice)."""

    prometheus_url: str | None = Field(
        None, max_length=500, examples=["http://prometheus:9090"],
        description="http(s) base URL of the Prometheus HTTP API",
    )  # fmt: skip
    label_selector: str | None = Field(
        None, max_length=1000, examples=['{job="vllm", namespace="prod"}'],
        description="a label matcher in braces selecting the deployment's series",
    )  # fmt: skip


class DeploymentCreate(PrometheusFields):
    """A config running in production (engine and version: `config.engine`,
    `config.engine_version`)."""

    name: str = Field(min_length=1, max_length=200, pattern=_PRINTABLE, examples=["prod-chat"])
    config: dict[str, Any] = Field(
        description="the deployed ServingConfig, as `ServingConfig.to_dict()` and the CLI's "
        "YAML (schema_version optional)",
        examples=[{"model": "llama-3.1-8b", "replica": {"accelerator": "h100", "tp": 1},
                   "num_replicas": 2}],
    )  # fmt: skip


class RecommendationDeploy(PrometheusFields):
    """Mark a stored recommendation as deployed (every field optional)."""

    name: str | None = Field(
        None, min_length=1, max_length=200, pattern=_PRINTABLE,
        description="default: recommendation-<id>",
    )  # fmt: skip


class JobResultOut(BaseModel):
    """A finished job's outcome, as `servetune tune --out` writes `outcome.json`."""

    job_id: int
    outcome: TuneOutcome = Field(
        description="schema_version 5: every attainment with the load and rate it was "
        "measured at, the verdict's sentences and the trials' fates (the out_of_step range "
        "of 4 is gone); jobs finished before keep the layout they were stored with"
    )


class PlanResultOut(BaseModel):
    """A plan job's plan, as `servetune plan --out` writes `plan.json`."""

    job_id: int
    plan_id: int = Field(description="the stored plan's own id")
    plan: FleetPlan = Field(description="`FleetPlan.to_dict()`, schema_version 1")
