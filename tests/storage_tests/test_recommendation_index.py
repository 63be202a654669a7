"""A project's recommendations in memory (storage.recommendations.RecommendationIndex)
answer every filter exactly as the indexed query does, on both back-ends."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from storage.db import read_scope, session_scope
from storage.jobs import enqueue_job
from storage.models import RecommendationRow
from storage.recommendations import (
    DeploymentFilter,
    RecommendationNotFound,
    latest_recommendation_ref,
    recommendation_index,
)
from tests.storage_tests.test_jobs_queue import PARAMS

# Two stored values per filter (text differing only in case, floats one ulp apart,
# 0.1 + 0.2 against 0.3) and one that no row holds.
STORED = {
    "source": ("stream:prod", "stream:Prod"),
    "model": ("llama-3.1-8b", "llama-3.1-8b "),
    "gpu": ("h100", "h100,a100"),
    "num_gpus": (1, 8),
    "slo_ttft_ms": (300.0, 300.00000000000006),
    "slo_tpot_ms": (0.1 + 0.2, 50.0),
}
ABSENT = {
    "source": "trace:1", "model": "LLAMA-3.1-8B", "gpu": "a100", "num_gpus": 2,
    "slo_ttft_ms": 300.5, "slo_tpot_ms": 0.3,
}  # fmt: skip


def _store(engine, rng: random.Random, count: int) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    with session_scope(engine) as s:
        job = enqueue_job(s, project="p", params=PARAMS)
        for i in range(count):
            s.add(
                RecommendationRow(
                    project=rng.choice(("p", "p", "q")), job_id=job.id,
                    **{name: rng.choice(values) for name, values in STORED.items()},
                    attainment=0.9, recommendation={"row": i},
                    # few distinct times: ties, broken by the id
                    created_at=start + timedelta(seconds=rng.randrange(8)),
                )
            )  # fmt: skip


def _answers(session, project: str, index, where: DeploymentFilter) -> tuple:
    """(the query's answer, the index's): a reference or the not-found message."""
    out = []
    for ask in (
        lambda: latest_recommendation_ref(session, project=project, where=where),
        lambda: index.latest(where),
    ):
        try:
            out.append(ask())
        except RecommendationNotFound as exc:
            out.append(str(exc))
    return tuple(out)


def _deployments(session, project: str) -> tuple[int, int]:
    """How many recommendations `project` has, and how many distinct deployments."""
    r = RecommendationRow
    rows = session.execute(
        sa.select(r.source, r.model, r.gpu, r.num_gpus, r.slo_ttft_ms, r.slo_tpot_ms).where(
            r.project == project
        )
    ).all()
    return len(rows), len(set(map(tuple, rows)))


def test_the_index_answers_every_filter_as_the_query(engine) -> None:
    _store(engine, random.Random(3), 150)  # 64 deployments: most re-tuned, some never
    asked = found = 0
    with read_scope(engine) as s:
        for project in ("p", "q", "none"):
            index = recommendation_index(s, project=project)
            rows, deployments = _deployments(s, project)
            assert len(index) == deployments  # the newest of each only
            assert project == "none" or deployments < rows
            for r in range(len(STORED) + 1):
                for names in itertools.combinations(STORED, r):
                    choices = [(*STORED[n], ABSENT[n]) for n in names]
                    for values in itertools.product(*choices):
                        where = DeploymentFilter(**dict(zip(names, values, strict=True)))
                        want, got = _answers(s, project, index, where)
                        assert got == want, (project, where)
                        asked += 1
                        found += isinstance(want, tuple)
    assert asked == 3 * 4**6 and 1000 < found < asked - 1000  # both answers well exercised


def test_a_project_with_more_deployments_than_the_limit_has_no_index(engine) -> None:
    _store(engine, random.Random(4), 30)
    with read_scope(engine) as s:
        held = len(recommendation_index(s, project="p"))
        assert held == _deployments(s, "p")[1] > 1
        assert len(recommendation_index(s, project="p", max_rows=held)) == held
        assert recommendation_index(s, project="p", max_rows=held - 1) is None
        assert len(recommendation_index(s, project="none", max_rows=0)) == 0
