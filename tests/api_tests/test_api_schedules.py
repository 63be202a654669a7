"""/v1/schedules: CRUD, exactly-once firing with two workers, and the drift trigger."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

from api.worker.scheduling import fire_due_schedules
from optimizer.search import TuneRequest
from storage.db import make_engine, session_scope
from storage.jobs import list_jobs
from storage.schedules import create_schedule, get_schedule
from storage.service_records import ScheduleTrigger
from tests.api_tests.conftest import Service, write_trace_csv

PARAMS = {
    "stream": "prod",
    "window_s": 86400,
    "model": "llama-3.1-8b",
    "gpu_types": ["h100"],
    "gpu_budget": 8,
    "slo_ttft_ms": 2000,
    "slo_tpot_ms": 50,
    "num_trials": 3,
}


def _upload(svc: Service, path: Path) -> int:
    with path.open("rb") as fh:
        r = svc.client.post(
            "/v1/traces", headers=svc.auth(svc.key_a), files={"file": fh}, data={"stream": "prod"}
        )
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_schedule_crud(service: Service) -> None:
    h = service.auth(service.key_a)
    r = service.client.post(
        "/v1/schedules", headers=h, json={"cron": "0 3 * * *", "params": PARAMS}
    )
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    nxt = datetime.fromisoformat(r.json()["next_run_at"])
    assert nxt > datetime.now(UTC) and (nxt.hour, nxt.minute) == (3, 0)
    assert service.client.get("/v1/schedules", headers=h).json()["total"] == 1
    assert service.client.post(f"/v1/schedules/{sid}/pause", headers=h).json()["paused"] is True
    assert service.client.post(f"/v1/schedules/{sid}/resume", headers=h).json()["paused"] is False
    other = service.auth(service.key_b)
    assert service.client.get(f"/v1/schedules/{sid}", headers=other).status_code == 404
    assert service.client.delete(f"/v1/schedules/{sid}", headers=other).status_code == 404
    assert service.client.delete(f"/v1/schedules/{sid}", headers=h).status_code == 204
    assert service.client.get(f"/v1/schedules/{sid}", headers=h).status_code == 404

    bad = service.client.post("/v1/schedules", headers=h, json={"cron": "61 * *", "params": PARAMS})
    assert bad.status_code == 422 and "expected five fields" in bad.json()["detail"]
    both = service.client.post(
        "/v1/schedules", headers=h, json={"cron": "* * * * *", "interval_s": 60, "params": PARAMS}
    )
    assert both.status_code == 422 and "exactly one of interval_s or cron" in both.json()["detail"]
    no_stream = {**PARAMS, "stream": None, "trace_id": 1}
    r = service.client.post(
        "/v1/schedules", headers=h, json={"interval_s": 60, "params": no_stream}
    )
    assert (
        r.status_code == 422
        and "re-tunes a trace stream (params.stream) or a deployment" in r.json()["detail"]
    )


def _schedule(engine, trigger: ScheduleTrigger) -> int:
    with session_scope(engine) as s:
        info = create_schedule(
            s,
            project="a",
            name="s",
            params=TuneRequest(**PARAMS),
            interval_s=3600,
            trigger=trigger,
            start_at=datetime.now(UTC) - timedelta(seconds=1),
        )
    return info.id


def test_two_workers_fire_a_due_time_exactly_once(service: Service, tmp_path: Path) -> None:
    _upload(service, write_trace_csv(tmp_path / "a.csv"))
    engines = [make_engine(service.url), make_engine(service.url)]
    sid = _schedule(engines[0], ScheduleTrigger.ALWAYS)
    barrier = threading.Barrier(2)
    fired: list[int] = []

    def work(engine) -> None:
        for _ in range(5):
            barrier.wait()
            fired.append(fire_due_schedules(engine))

    threads = [threading.Thread(target=work, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with session_scope(engines[0]) as s:
        jobs = list_jobs(s, project="a")
        schedule = get_schedule(s, sid)
    for e in engines:
        e.dispose()
    assert sum(fired) == 1 and len(jobs) == 1
    assert jobs[0].schedule_id == sid and "due time reached" in jobs[0].trigger_reason
    assert schedule.num_fired == 1 and schedule.next_run_at > datetime.now(UTC)


def test_drift_trigger_fires_only_on_shift(service: Service, tmp_path: Path) -> None:
    h = service.auth(service.key_a)
    _upload(service, write_trace_csv(tmp_path / "a.csv", seed=1))
    engine = make_engine(service.url)
    sid = _schedule(engine, ScheduleTrigger.DRIFT)
    try:
        assert fire_due_schedules(engine) == 1  # no recommendation yet
        assert service.worker().run_once()  # the fake tuner records a recommendation
        later = datetime.now(UTC) + timedelta(hours=2)
        assert fire_due_schedules(engine, now=later) == 0
        info = service.client.get(f"/v1/schedules/{sid}", headers=h).json()
        assert info["last_decision"] == "skipped" and info["last_reason"].startswith("no drift")

        _upload(service, write_trace_csv(tmp_path / "b.csv", seed=2, input_scale=4))
        assert fire_due_schedules(engine, now=later + timedelta(hours=2)) == 1
    finally:
        engine.dispose()
    info = service.client.get(f"/v1/schedules/{sid}", headers=h).json()
    assert info["last_decision"] == "fired" and info["num_fired"] == 2
    assert "drift beyond 20%" in info["last_reason"] and "input_mean +" in info["last_reason"]
    job = service.client.get(f"/v1/tuning-jobs/{info['last_job_id']}", headers=h).json()
    assert job["trigger_reason"] == info["last_reason"]
    assert len(job["window"]["trace_ids"]) == 2
