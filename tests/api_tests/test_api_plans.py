"""/v1/plans and /ui/plans/{id}: a plan job queued on the tuning jobs' queue, run by the
real plan executor (roofline latency, a few hundred requests), its plan stored linked to
the job and served as JSON and as a page; bad input refused at creation naming the field,
with nothing stored; project isolation, paging and cancel; schedules that plan."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
import yaml

from api.worker import Worker, WorkerOptions, default_executors
from optimizer.plan import FleetPlan
from storage.db import make_engine, session_scope
from tests.api_tests.conftest import Service

REPO = Path(__file__).resolve().parents[2]
UNIT = yaml.safe_load((REPO / "examples" / "colocated-h100.yaml").read_text())
PLAN = {
    "model": "llama-3.1-8b",
    "gpu": "h100",
    "slo_ttft_ms": 1000,
    "slo_tpot_ms": 50,
    "window_s": 60,
    "cold_start_s": 10,
    "gpu_budget": 8,
    "price_per_gpu_hour": 2.5,
    "unit": UNIT,  # the CLI's --unit YAML as it is, schema_version and all
}


def _trace_csv(path: Path, n: int, rate: float, prompt: int = 600) -> Path:
    """`n` Poisson arrivals at `rate` req/s, the middle third at 3x the rate."""
    rng = np.random.default_rng(1)
    gaps = rng.exponential(1 / rate, size=n)
    gaps[n // 3 : 2 * n // 3] /= 3
    arrival = np.cumsum(gaps) - gaps[0]
    rows = ["arrival_s,input_tokens,output_tokens"]
    rows += [f"{a:.4f},{prompt + i % 200},{40 + i % 60}" for i, a in enumerate(arrival)]
    path.write_text("\n".join(rows) + "\n")
    return path


def _upload(svc: Service, path: Path, key: str | None = None, **fields) -> int:
    with path.open("rb") as fh:
        r = svc.client.post(
            "/v1/traces", headers=svc.auth(key or svc.key_a), files={"file": fh}, data=fields
        )
    assert r.status_code in (200, 201), r.text
    return r.json()["id"]


def _worker(svc: Service) -> Worker:
    """A worker with the real executors: the plan runs, priced by the roofline."""
    return Worker(
        make_engine(svc.url),
        storage_url=svc.url,
        executors=default_executors(),
        options=WorkerOptions(lease_s=30, poll_s=0.5),
    )


def _plans(url: str) -> list[tuple]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("select id, job_id, project from plans")).all()
    finally:
        engine.dispose()


def _element(page: str, ident: str) -> str:
    m = re.search(rf'<(\w+) id="{ident}"[^>]*>(.*?)</\1>', page, re.S)
    assert m, f"no #{ident} in the page"
    return m.group(2)


def test_a_plan_job_runs_on_the_worker_and_is_served(service: Service, tmp_path: Path) -> None:
    tid = _upload(service, _trace_csv(tmp_path / "day.csv", 600, 2.0))
    h = service.auth(service.key_a)
    r = service.client.post("/v1/plans", headers=h, json={"trace_id": tid, **PLAN})
    assert r.status_code == 202, r.text
    created = r.json()
    jid = created["id"]
    assert created["status"] == "queued" and r.headers["location"] == f"/v1/plans/{jid}"
    assert created["ui_url"] == f"/ui/plans/{jid}"
    assert created["result_url"] == f"/v1/plans/{jid}/result"
    queued = service.client.get(f"/v1/plans/{jid}", headers=h).json()
    assert queued["kind"] == "plan" and queued["params"]["window_s"] == 60
    assert queued["params"]["unit"]["replica"]["max_num_batched_tokens"] == 2048
    assert queued["window"]["trace_ids"] == [tid]
    pending = service.client.get(f"/v1/plans/{jid}/result", headers=h)
    assert pending.status_code == 409 and "plan job" in pending.json()["detail"]
    page = service.client.get(f"/ui/plans/{jid}", headers=h)
    assert page.status_code == 200 and 'http-equiv="refresh"' in page.text
    assert 'class="status queued">queued<' in page.text and "<svg" not in page.text

    assert _worker(service).run_once() is True
    job = service.client.get(f"/v1/plans/{jid}", headers=h).json()
    assert job["status"] == "succeeded", job["error"]
    assert job["progress"]["steps_done"] >= 3 and job["progress"]["stage"] == "storing the plan"
    result = service.client.get(f"/v1/plans/{jid}/result", headers=h)
    assert result.status_code == 200 and result.headers["etag"]
    body = result.json()
    assert body["job_id"] == jid and body["plan"]["schema_version"] == 2
    plan = FleetPlan.from_dict(body["plan"])
    assert plan.request.trace_id == tid and plan.request.window_s == 60
    assert plan.unit.source.value == "given" and sum(w.num_requests for w in plan.windows) == 600
    static = plan.fleets[0]
    assert all(f.gpu_hours > 0 for f in plan.fleets)
    assert static.dollars == pytest.approx(static.gpu_hours * 2.5)
    assert _plans(service.url) == [(body["plan_id"], jid, "a")]  # the plan names its job

    # The page: the plan's own figures, the picture and the KEDA object, without a script.
    page = service.client.get(f"/ui/plans/{jid}", headers=h)
    assert page.status_code == 200 and 'http-equiv="refresh"' not in page.text
    text = page.text
    assert 'class="status succeeded">succeeded<' in text and "<script" not in text
    assert "(a) The unit&#x27;s SLO-bounded capacity" in text
    lb = unescape(_element(text, "lower-bound"))
    assert f"<td>peak units</td><td>{max(plan.lower_bound.units)}</td>" in lb
    assert f"<td>GPU-hours</td><td>{plan.lower_bound.gpu_hours:,.1f}</td>" in lb
    fleets = unescape(_element(text, "fleets"))
    assert "static" in fleets and f"${static.dollars:,.0f}" in fleets
    assert text.count("<svg") == 2 and "demand, req/s" in text
    keda = unescape(_element(text, "keda"))
    assert "kind: ScaledObject" in keda and "vllm:" in keda
    linked = service.client.get(f"/ui/plans/{jid}/result.json", headers=h)
    assert linked.json() == body

    # A plan job is not a tuning job, nor the other way round.
    assert service.client.get(f"/v1/tuning-jobs/{jid}", headers=h).status_code == 404
    assert service.client.get(f"/ui/jobs/{jid}", headers=h).status_code == 404
    assert service.client.get("/v1/tuning-jobs", headers=h).json()["total"] == 0
    listed = service.client.get("/v1/plans?status=succeeded", headers=h).json()
    assert [j["id"] for j in listed["items"]] == [jid] and listed["total"] == 1


def test_bad_input_is_a_422_naming_the_field_and_stores_nothing(
    service: Service, tmp_path: Path
) -> None:
    """The CLI's refusals of the same input, decided on the stored trace (~300 s)."""
    tid = _upload(service, _trace_csv(tmp_path / "t.csv", 600, 2.0))
    other = _upload(service, _trace_csv(tmp_path / "b.csv", 50, 2.0), key=service.key_b)
    h = service.auth(service.key_a)
    cases = [
        ({"window_s": 900}, ["body.window_s"], "--window 900 s is longer than trace"),
        ({"window_s": 200}, ["body.window_s"], "is shorter than two windows of 200 s"),
        ({"cold_start_s": 100}, ["body.cold_start_s", "body.window_s"],
         "cold start (100 s, --cold-start-s) is longer than a window"),
        ({"cold_start_s": None}, ["body.cold_start_s", "body.window_s"],
         "(68 s, the default) is longer than a window"),
        ({"slo_ttft_ms": -5}, ["body.slo_ttft_ms"], "expected a positive finite number"),
        ({"gpu": "h999"}, ["body.gpu"], "gpu: "),
        ({"attainment": 1.5}, ["body.attainment"], "expected a share in (0, 1]"),
        ({"windw_s": 60}, ["body"], "unknown keys ['windw_s']"),
        ({"unit": {**UNIT, "model": "llama-3.2-1b"}}, ["body.unit"], "not the plan's model"),
        ({"unit": {**UNIT, "replicas": 2}}, ["body.unit"], "unknown keys ['replicas']"),
        ({"trace_id": None, "stream": "nothing"}, ["body.stream"],
         "stream 'nothing' has no uploads"),
        ({"stream": "s"}, ["body.stream"], "not both"),
    ]  # fmt: skip
    for change, where, message in cases:
        body = {"trace_id": tid, **PLAN, **change}
        r = service.client.post("/v1/plans", headers=h, json=body)
        assert r.status_code == 422, (change, r.text)
        problem = r.json()
        assert r.headers["content-type"] == "application/problem+json"
        assert message in problem["detail"], (change, problem["detail"])
        assert [e["where"] for e in problem["errors"]] == where, (change, problem)
    r = service.client.post("/v1/plans", headers=h, json={**PLAN, "trace_id": other})
    assert r.status_code == 404 and r.json()["detail"] == f"trace {other} not found"
    r = service.client.post("/v1/plans", headers=h, json=[1, 2])
    assert r.status_code == 422
    assert service.client.get("/v1/plans", headers=h).json()["total"] == 0
    assert _plans(service.url) == []


def test_a_peak_beyond_the_budget_fails_the_job_and_stores_nothing(
    service: Service, tmp_path: Path
) -> None:
    """Only the plan finds it: the job fails with the CLI's message, no plan is stored."""
    tid = _upload(service, _trace_csv(tmp_path / "busy.csv", 1500, 20.0, prompt=4000))
    h = service.auth(service.key_a)
    body = {"trace_id": tid, **PLAN, "gpu_budget": 1, "window_s": 20}
    r = service.client.post("/v1/plans", headers=h, json=body)
    assert r.status_code == 202, r.text
    jid = r.json()["id"]
    assert _worker(service).run_once()
    job = service.client.get(f"/v1/plans/{jid}", headers=h).json()
    assert job["status"] == "failed" and "the peak needs more than --gpus 1: window" in job["error"]
    result = service.client.get(f"/v1/plans/{jid}/result", headers=h)
    assert result.status_code == 409 and "the peak needs more than" in result.json()["detail"]
    page = service.client.get(f"/ui/plans/{jid}", headers=h).text
    assert "the peak needs more than" in unescape(_element(page, "error"))
    assert _plans(service.url) == []


def test_isolation_paging_and_cancel(service: Service, tmp_path: Path) -> None:
    tid = _upload(service, _trace_csv(tmp_path / "t.csv", 600, 2.0))
    a, b = service.auth(service.key_a), service.auth(service.key_b)
    ids = []
    for window in (60, 70, 80):
        r = service.client.post(
            "/v1/plans", headers=a, json={"trace_id": tid, **PLAN, "window_s": window}
        )
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    tuning = service.client.post(
        "/v1/tuning-jobs", headers=a,
        json={"trace_id": tid, "model": "llama-3.1-8b", "gpu_types": ["h100"], "gpu_budget": 8,
              "slo_ttft_ms": 2000, "slo_tpot_ms": 50},
    )  # fmt: skip
    assert tuning.status_code == 202
    first = service.client.get("/v1/plans?limit=2", headers=a).json()
    assert [j["id"] for j in first["items"]] == ids[:0:-1] and first["total"] == 3
    assert first["next_offset"] == 2 and first["next_after"] == ids[1]
    rest = service.client.get(f"/v1/plans?limit=2&after={first['next_after']}", headers=a).json()
    assert [j["id"] for j in rest["items"]] == [ids[0]] and rest["next_after"] is None
    assert service.client.get("/v1/plans?offset=2", headers=a).json()["items"][0]["id"] == ids[0]
    # another project's plan is not found, anywhere
    jid = ids[0]
    for url in (f"/v1/plans/{jid}", f"/v1/plans/{jid}/result", f"/ui/plans/{jid}"):
        assert service.client.get(url, headers=b).status_code == 404, url
    assert service.client.post(f"/v1/plans/{jid}/cancel", headers=b).status_code == 404
    assert service.client.get("/v1/plans", headers=b).json()["total"] == 0
    # nor is a tuning job's id a plan
    tid_job = tuning.json()["id"]
    assert service.client.get(f"/v1/plans/{tid_job}", headers=a).status_code == 404
    cancelled = service.client.post(f"/v1/plans/{jid}/cancel", headers=a)
    assert cancelled.status_code == 202 and cancelled.json()["status"] == "cancelled"
    # without a key the page asks for one, and the form brings the browser back to it
    bare = service.client.get(f"/ui/plans/{jid}")
    assert bare.status_code == 401 and f'value="/ui/plans/{jid}"' in bare.text
    assert "This page shows a plan job" in bare.text
    kept = service.client.post(
        "/ui/key", data={"key": service.key_a, "next": f"/ui/plans/{jid}"},
        follow_redirects=False,
    )  # fmt: skip
    assert kept.status_code == 303 and kept.headers["location"] == f"/ui/plans/{jid}"
    page = service.client.get(f"/ui/plans/{jid}")  # the cookie
    assert page.status_code == 200 and 'class="status cancelled">cancelled<' in page.text


def test_a_stream_is_planned_on_its_newest_upload(service: Service, tmp_path: Path) -> None:
    h = service.auth(service.key_a)
    _upload(service, _trace_csv(tmp_path / "old.csv", 100, 2.0), stream="chat")
    newest = _upload(service, _trace_csv(tmp_path / "new.csv", 600, 2.0), stream="chat")
    r = service.client.post("/v1/plans", headers=h, json={"stream": "chat", **PLAN})
    assert r.status_code == 202, r.text
    job = service.client.get(f"/v1/plans/{r.json()['id']}", headers=h).json()
    assert job["params"]["stream"] == "chat" and job["window"]["trace_ids"] == [newest]


def test_a_stream_schedule_with_a_plan_queues_plan_jobs(service: Service, tmp_path: Path) -> None:
    """Each due time queues a plan job: the schedule's plan pinned to the window's newest
    upload (trigger always); the refusals name the field."""
    from datetime import UTC, datetime, timedelta

    from api.worker.scheduling import fire_due_schedules
    from storage.jobs import list_jobs
    from storage.service_records import JobKind

    h = service.auth(service.key_a)
    newest = _upload(service, _trace_csv(tmp_path / "new.csv", 600, 2.0), stream="chat")
    params = {"stream": "chat", "window_s": 3600, "model": "llama-3.1-8b", "gpu_types": ["h100"],
              "gpu_budget": 8, "slo_ttft_ms": 1000, "slo_tpot_ms": 50}  # fmt: skip
    plan = {k: v for k, v in PLAN.items() if k != "unit"}

    def create(**changes):
        body = {"interval_s": 60, "params": params, "plan": plan, **changes}
        return service.client.post("/v1/schedules", headers=h, json=body)

    refusals = [
        ({"trigger": "drift"}, "body.trigger", "which a plan does not make"),
        ({"plan": {**plan, "trace_id": newest}}, "body.plan.trace_id", "expected no trace_id"),
        ({"plan": {**plan, "slo_ttft_ms": 500}}, "body.plan.slo_ttft_ms",
         "differs from params.slo_ttft_ms"),
        ({"plan": {**plan, "window_s": -1}}, "body.plan.window_s", "window_s: expected"),
    ]  # fmt: skip
    for change, where, message in refusals:
        r = create(**change)
        assert r.status_code == 422, (change, r.text)
        assert message in r.json()["detail"] and r.json()["errors"][0]["where"] == where, r.text
    r = create()
    assert r.status_code == 201, r.text
    assert r.json()["plan"]["window_s"] == 60 and r.json()["plan"]["trace_id"] is None
    engine = make_engine(service.url)
    try:
        later = datetime.now(UTC) + timedelta(seconds=120)
        assert fire_due_schedules(engine, now=later) == 1
        with session_scope(engine) as s:
            jobs = list_jobs(s, project="a")
        assert [j.kind for j in jobs] == [JobKind.PLAN]
        fired = jobs[0].params
        assert fired.trace_id == newest and fired.window_s == 60 and fired.cold_start_s == 10
        assert fired.price_per_gpu_hour == 2.5 and fired.unit is None
        assert jobs[0].schedule_id == r.json()["id"]
    finally:
        engine.dispose()


def test_the_documented_examples_are_valid() -> None:
    """The bodies /docs offers for a plan and for a schedule (its plan too) are accepted."""
    from api.routes import plans, schedules
    from api.schemas import ScheduleCreate
    from api.services.planning import parse_plan_request
    from storage.schedules import check_plan

    for name, example in plans.EXAMPLES.items():
        assert parse_plan_request(json.loads(json.dumps(example["value"]))).model, name
    for example in schedules.EXAMPLES.values():
        spec = ScheduleCreate(**example["value"])
        if spec.plan is not None:
            check_plan(spec.params, parse_plan_request(spec.plan))


def test_a_running_plan_is_cancelled_at_its_next_step(service: Service, tmp_path: Path) -> None:
    """A cancel reaches a running plan between its steps: the job ends cancelled and no
    plan is stored (a plan has no partial answer)."""
    import time

    from api.worker import JobContext
    from api.worker.planning import run_planning
    from storage.jobs import claim_job
    from storage.service_records import JobKind

    tid = _upload(service, _trace_csv(tmp_path / "t.csv", 600, 2.0))
    h = service.auth(service.key_a)
    jid = service.client.post("/v1/plans", headers=h, json={"trace_id": tid, **PLAN}).json()["id"]

    def cancelled_first(ctx: JobContext):
        assert service.client.post(f"/v1/plans/{jid}/cancel", headers=h).status_code == 202
        deadline = time.monotonic() + 10
        while not ctx.should_stop() and time.monotonic() < deadline:
            time.sleep(0.05)  # the heartbeat sees the cancel
        return run_planning(ctx)

    engine = make_engine(service.url)
    try:
        worker = Worker(engine, storage_url=service.url,
                        executors={JobKind.PLAN: cancelled_first},
                        options=WorkerOptions(lease_s=5, poll_s=0.1))  # fmt: skip
        with session_scope(engine) as s:
            claim = claim_job(s, worker=worker.name, lease_s=5)
        assert claim is not None and claim.job.id == jid
        assert worker.execute(claim) is not None
    finally:
        engine.dispose()
    job = service.client.get(f"/v1/plans/{jid}", headers=h).json()
    assert job["status"] == "cancelled" and job["error"] == "cancelled while running"
    assert job["progress"] is None  # stopped before its first step
    assert _plans(service.url) == []
