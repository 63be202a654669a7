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
    rec_id, _ = latest_recommendation_ref(session, project=project, where=where)
    return get_recommendation(session, rec_id)


def get_recommendation(session: Session, rec_id: int) -> RecommendationInfo:
    row = session.get(RecommendationRow, rec_id)
    if row is None:
        raise RecommendationNotFound(f"recommendation {rec_id} not found")
    return _info(row)


def latest_recommendation_ref(
    session: Session, *, project: str, where: DeploymentFilter = DeploymentFilter()
) -> tuple[int, datetime]:
    """The id and creation time of the newest recommendation matching `where` (rows are
    written once and never changed: the pair names one row's content for good)."""
    given = tuple(f for f in _FILTERS if getattr(where, f) is not None)
    params = {f: getattr(where, f) for f in given}
    # On the connection: an ORM execute of this column query costs ~50 us more (~25%).
    query = _ref_query(given)
    row = session.connection().execute(query, {"project": project, **params}).first()
    if row is None:
        raise RecommendationNotFound("no recommendation matches this deployment yet")
    return row.id, row.created_at


_FILTERS = ("source", "model", "gpu", "num_gpus", "slo_ttft_ms", "slo_tpot_ms")


@lru_cache(maxsize=2 ** len(_FILTERS))
def _ref_query(given: tuple[str, ...]) -> sa.Select:
    # Built once per set of given filters (building one took most of a first hit's time).
    r = RecommendationRow
    query = sa.select(r.id, r.created_at).where(r.project == sa.bindparam("project"))
    for name in given:
        query = query.where(getattr(r, name) == sa.bindparam(name))
    return query.order_by(r.created_at.desc(), r.id.desc()).limit(1)
