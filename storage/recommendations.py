"""Recommendations: the latest tuned config per deployment (workload, model, GPUs, SLOs)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from optimizer.search import Recommendation
from storage.codec import from_json, to_json
from storage.models import RecommendationRow
from storage.service_records import JobInfo, RecommendationInfo, WindowSummary


class RecommendationNotFound(LookupError):
    pass


@dataclass(frozen=True, slots=True)
class DeploymentFilter:
    """Which recommendations to consider; None matches anything."""

    source: str | None = None  # "trace:ID" or "stream:NAME"
    model: str | None = None
    gpu: str | None = None
    num_gpus: int | None = None
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None


def _info(row: RecommendationRow) -> RecommendationInfo:
    return RecommendationInfo(
        id=row.id,
        project=row.project,
        job_id=row.job_id,
        source=row.source,
        model=row.model,
        gpu=row.gpu,
        num_gpus=row.num_gpus,
        slo_ttft_ms=row.slo_ttft_ms,
        slo_tpot_ms=row.slo_tpot_ms,
        attainment=row.attainment,
        created_at=row.created_at,
        recommendation=from_json(Recommendation, row.recommendation),
        window=None if row.window is None else from_json(WindowSummary, row.window),
    )


def save_recommendation(
    session: Session, job: JobInfo, recommendation: Recommendation
) -> RecommendationInfo:
    p = job.params
    row = RecommendationRow(
        project=job.project,
        job_id=job.id,
        source=p.source,
        model=p.model,
        gpu=",".join(p.gpu_types),
        num_gpus=p.gpu_budget,
        slo_ttft_ms=p.slo_ttft_ms,
        slo_tpot_ms=p.slo_tpot_ms,
        attainment=p.attainment,
        created_at=datetime.now(UTC),
        recommendation=to_json(recommendation),
        window=None if job.window is None else to_json(job.window),
    )
    session.add(row)
    session.flush()
    return _info(row)


def latest_recommendation(
    session: Session, *, project: str, where: DeploymentFilter = DeploymentFilter()
) -> RecommendationInfo:
    r = RecommendationRow
    query = sa.select(r).where(r.project == project)
    for column, value in (
        (r.source, where.source),
        (r.model, where.model),
        (r.gpu, where.gpu),
        (r.num_gpus, where.num_gpus),
        (r.slo_ttft_ms, where.slo_ttft_ms),
        (r.slo_tpot_ms, where.slo_tpot_ms),
    ):
        if value is not None:
            query = query.where(column == value)
    row = session.scalar(query.order_by(r.created_at.desc(), r.id.desc()).limit(1))
    if row is None:
        raise RecommendationNotFound("no recommendation matches this deployment yet")
    return _info(row)
