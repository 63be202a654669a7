"""Recommendations: the latest tuned config per deployment (workload, model, GPUs, SLOs)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

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
    gpu_budget: int | None = None
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None


def _info(row: RecommendationRow | sa.Row) -> RecommendationInfo:
    return RecommendationInfo(
        id=row.id,
        project=row.project,
        job_id=row.job_id,
        source=row.source,
        model=row.model,
        gpu=row.gpu,
        gpu_budget=row.num_gpus,
        slo_ttft_ms=row.slo_ttft_ms,
        slo_tpot_ms=row.slo_tpot_ms,
        attainment_target=row.attainment,
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


_RECOMMENDATIONS = RecommendationRow.__table__
_BY_ID = sa.select(_RECOMMENDATIONS).where(_RECOMMENDATIONS.c.id == sa.bindparam("id"))


def get_recommendation(
    session: Session, recommendation_id: int, *, project: str | None = None
) -> RecommendationInfo:
    """One stored recommendation (another project's is not found)."""
    row = session.connection().execute(_BY_ID, {"id": recommendation_id}).first()
    if row is None or (project is not None and row.project != project):
        raise RecommendationNotFound(f"recommendation {recommendation_id} not found")
    return _info(row)


def latest_recommendation(
    session: Session, *, project: str, where: DeploymentFilter = DeploymentFilter()
) -> RecommendationInfo:
    """The newest of `project`'s recommendations matching `where` (one indexed query)."""
    given = tuple(name for name in _FILTERS if getattr(where, name) is not None)
    params = {name: getattr(where, name) for name in given}
    row = session.connection().execute(_latest_query(given), {"project": project, **params})
    found = row.first()
    if found is None:
        raise RecommendationNotFound("no recommendation matches this deployment yet")
    return _info(found)


_FILTERS = ("source", "model", "gpu", "gpu_budget", "slo_ttft_ms", "slo_tpot_ms")
_COLUMNS = {"gpu_budget": "num_gpus"}  # filter -> column, where they differ


@lru_cache(maxsize=2 ** len(_FILTERS))
def _latest_query(given: tuple[str, ...]) -> sa.Select:
    """The newest row matching the `given` filters (a plain select, built once per set)."""
    table = RecommendationRow.__table__
    query = sa.select(table).where(table.c.project == sa.bindparam("project"))
    for name in given:
        query = query.where(table.c[_COLUMNS.get(name, name)] == sa.bindparam(name))
    return query.order_by(table.c.created_at.desc(), table.c.id.desc()).limit(1)
