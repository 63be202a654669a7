"""Requests below a physical floor (optimizer.search.floors) are refused before any study:
by `servetune tune`, by POST /v1/tuning-jobs (422 naming the fields) and by the worker for
a job queued another way; nothing is stored (no job, no study, no tuning run)."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from api.cli import app
from tests.api_tests.conftest import Service, write_trace_csv

# The case: Qwen3-235B-A22B-FP8 on 16 H200, TTFT <= 2 ms, TPOT <= 0.05 ms.
IMPOSSIBLE = {
    "model": "Qwen/Qwen3-235B-A22B-FP8",
    "gpu_types": ["h200"],
    "gpu_budget": 16,
    "slo_ttft_ms": 2,
    "slo_tpot_ms": 0.05,
}
TPOT_FLOOR = (
    "slo_tpot_ms: TPOT SLO 0.05 ms is below the decode floor of Qwen/Qwen3-235B-A22B-FP8 on "
    "h200: 0.234 ms per token at the most parallel deployment allowed (16 x h200: 22.2 GB of "
    "active weights read per step"
)
TTFT_FLOOR = "slo_ttft_ms: TTFT SLO 2 ms is below the lone-prefill floor of"


def _stored_searches(url: str) -> tuple[int, int]:
    """(tuning runs, Optuna studies) in the database."""
    from storage.db import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            runs = conn.execute(sa.text("SELECT count(*) FROM tuning_runs")).scalar_one()
            studies = 0
            if sa.inspect(conn).has_table("studies"):
                studies = conn.execute(sa.text("SELECT count(*) FROM studies")).scalar_one()
    finally:
        engine.dispose()
    return runs, studies


def _trace(svc: Service, tmp_path: Path, **fields) -> int:
    path = write_trace_csv(tmp_path / "t.csv", n=200)
    with path.open("rb") as fh:
        r = svc.client.post(
            "/v1/traces", headers=svc.auth(svc.key_a), files={"file": fh}, data=fields
        )
    assert r.status_code in (200, 201), r.text
    return r.json()["id"]


def test_rest_refuses_a_request_below_the_floors_with_422(service: Service, tmp_path: Path):
    tid = _trace(service, tmp_path, stream="chat")
    headers = service.auth(service.key_a)
    for source in ({"trace_id": tid}, {"stream": "chat"}, {"trace_id": tid, "max_requests": 50}):
        r = service.client.post("/v1/tuning-jobs", headers=headers, json={**IMPOSSIBLE, **source})
        assert r.status_code == 422, r.text
        assert r.headers["content-type"] == "application/problem+json"
        body = r.json()
        assert body["type"].endswith("/below-physical-floor")
        assert [e["where"] for e in body["errors"]] == ["body.slo_tpot_ms", "body.slo_ttft_ms"]
        assert body["detail"].startswith(TPOT_FLOOR) and TTFT_FLOOR in body["detail"]
    listing = service.client.get("/v1/tuning-jobs", headers=headers).json()
    assert listing["total"] == 0
    assert _stored_searches(service.url) == (0, 0)
    # Ordinary SLOs on the same deployment are queued as before.
    ok = {**IMPOSSIBLE, "slo_ttft_ms": 2000, "slo_tpot_ms": 50, "trace_id": tid}
    assert service.client.post("/v1/tuning-jobs", headers=headers, json=ok).status_code == 202


def test_worker_fails_a_queued_job_below_the_floors_and_stores_nothing(
    service: Service, tmp_path: Path
):
    from api.worker import Worker, WorkerOptions, default_executors
    from optimizer.search import TuneRequest
    from storage.db import make_engine, session_scope
    from storage.jobs import enqueue_job, get_job

    tid = _trace(service, tmp_path)
    engine = make_engine(service.url)
    with session_scope(engine) as s:  # queued as a schedule queues it: not through the route
        job = enqueue_job(s, project="a", params=TuneRequest(**IMPOSSIBLE, trace_id=tid))
    options = WorkerOptions(lease_s=30, poll_s=0.5)
    worker = Worker(engine, storage_url=service.url, executors=default_executors(), options=options)
    assert worker.run_once() is True
    with session_scope(engine) as s:
        done = get_job(s, job.id)
    engine.dispose()
    assert done.status.value == "failed"
    assert done.error.startswith(TPOT_FLOOR) and TTFT_FLOOR in done.error
    assert _stored_searches(service.url) == (0, 0)


def test_cli_refuses_a_request_below_the_floors_before_the_study(cli_db, runner, tmp_path):
    trace = write_trace_csv(tmp_path / "t.csv", n=200)
    flags = "--gpu h200 --gpus 16 --slo-ttft-ms 2 --slo-tpot-ms 0.05 --trials 3 --workers 1"
    args = ["tune", "--trace", str(trace), "--model", IMPOSSIBLE["model"], *flags.split()]
    res = runner.invoke(app, [*args, "--study", "impossible"])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert TPOT_FLOOR in text and TTFT_FLOOR in text
    assert _stored_searches(cli_db) == (0, 0)
