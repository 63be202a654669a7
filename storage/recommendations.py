"""Recommendations: the latest tuned config per deployment (workload, model, GPUs, SLOs)."""

from __future__ import annotations

from collections.abc import Sequence
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


def _info(row: RecommendationRow | sa.Row) -> RecommendationInfo:
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
    info = get_recommendations(session, [rec_id]).get(rec_id)
    if info is None:
        raise RecommendationNotFound(f"recommendation {rec_id} not found")
    return info


def latest_recommendation_ref(
    session: Session, *, project: str, where: DeploymentFilter = DeploymentFilter()
) -> tuple[int, datetime]:
    """The id and creation time of the newest recommendation matching `where` (rows are
    written once and never changed: the pair names one row's content for good)."""
    given = _given(where)
    params = {f: getattr(where, f) for f in given}
    # On the connection: an ORM execute of this column query costs ~50 us more (~25%).
    query = _ref_query(given)
    row = session.connection().execute(query, {"project": project, **params}).first()
    if row is None:
        raise RecommendationNotFound(NO_MATCH)
    return row.id, row.created_at


NO_MATCH = "no recommendation matches this deployment yet"
_FILTERS = ("source", "model", "gpu", "num_gpus", "slo_ttft_ms", "slo_tpot_ms")
# At most this many deployments' newest recommendations are held by a
# `RecommendationIndex` (a deployment re-tuned on a schedule counts once).
INDEX_MAX_ROWS = 1024


def _given(where: DeploymentFilter) -> tuple[str, ...]:
    return tuple(f for f in _FILTERS if getattr(where, f) is not None)


def _newest_first(columns) -> tuple:
    """The order of "newest" (`columns`: the table's, or a subquery's)."""
    return columns.created_at.desc(), columns.id.desc()


@lru_cache(maxsize=2 ** len(_FILTERS))
def _ref_query(given: tuple[str, ...]) -> sa.Select:
    # Built once per set of given filters (building one took most of a first hit's time).
    r = RecommendationRow
    query = sa.select(r.id, r.created_at).where(r.project == sa.bindparam("project"))
    for name in given:
        query = query.where(getattr(r, name) == sa.bindparam(name))
    return query.order_by(*_newest_first(r)).limit(1)


@lru_cache(maxsize=1)
def _by_ids_query() -> sa.Select:
    table = RecommendationRow.__table__
    return sa.select(table).where(table.c.id.in_(sa.bindparam("ids", expanding=True)))


def get_recommendations(session: Session, ids: Sequence[int]) -> dict[int, RecommendationInfo]:
    """The recommendations of `ids` that exist, by id, in one statement (a plain select on
    the connection: the ORM's identity map and loading cost ~0.2 ms a row)."""
    rows = session.connection().execute(_by_ids_query(), {"ids": list(ids)})
    return {row.id: _info(row) for row in rows}


@lru_cache(maxsize=1)
def _index_query() -> sa.Select:
    # The newest row of each deployment (the six filter columns' values): an older one
    # is never the newest match, since the newer one matches every filter it matches.
    # PARTITION BY groups values as `=` compares them (text, integers, doubles).
    r = RecommendationRow
    filters = [getattr(r, name) for name in _FILTERS]
    rank = sa.func.row_number().over(partition_by=filters, order_by=_newest_first(r))
    ranked = (
        sa.select(r.id, r.created_at, *filters, rank.label("rank"))
        .where(r.project == sa.bindparam("project"))
        .subquery()
    )
    newest = sa.select(*(ranked.c[c] for c in ("id", "created_at", *_FILTERS)))
    newest = newest.where(ranked.c.rank == 1)
    return newest.order_by(*_newest_first(ranked.c)).limit(sa.bindparam("limit"))


class RecommendationIndex:
    """A project's recommendations in memory, for `latest_recommendation_ref` without a
    query: `latest(where)` gives what it gives, for any filters, at the state the index
    was read at. The rows are the newest of each deployment, in the query's own order
    (newest first), and a row matches when each given filter equals its column, as the
    query's `=` compares them: values of the same types (text, integer, double),
    compared exactly.

    For each set of filters asked, the newest row per combination of their values is
    found once (one pass over the rows), then every such question is one lookup."""

    __slots__ = ("_newest", "_rows")

    def __init__(self, rows: Sequence[Sequence[object]]) -> None:
        self._rows = rows  # (id, created_at, *the filter columns), newest first
        self._newest: dict[tuple[str, ...], dict[tuple, tuple[int, datetime]]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def latest(self, where: DeploymentFilter) -> tuple[int, datetime]:
        given = _given(where)
        newest = self._newest.get(given)
        if newest is None:
            newest = self._newest[given] = self._newest_by(given)
        ref = newest.get(tuple(getattr(where, f) for f in given))
        if ref is None:
            raise RecommendationNotFound(NO_MATCH)
        return ref

    def _newest_by(self, given: tuple[str, ...]) -> dict[tuple, tuple[int, datetime]]:
        at = [2 + _FILTERS.index(f) for f in given]
        newest: dict[tuple, tuple[int, datetime]] = {}
        for row in self._rows:  # newest first: the first row of each combination wins
            newest.setdefault(tuple([row[i] for i in at]), (row[0], row[1]))
        return newest


def recommendation_index(
    session: Session, *, project: str, max_rows: int | None = None
) -> RecommendationIndex | None:
    """`project`'s recommendations as a `RecommendationIndex`, the newest of each deployment;
    None when it has more than `max_rows` (default `INDEX_MAX_ROWS`) deployments: ask
    `latest_recommendation_ref` then, one indexed query each."""
    max_rows = INDEX_MAX_ROWS if max_rows is None else max_rows
    query = _index_query()
    rows = session.connection().execute(query, {"project": project, "limit": max_rows + 1}).all()
    if len(rows) > max_rows:
        return None
    return RecommendationIndex(rows)
