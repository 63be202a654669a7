"""The read routes (api.reads): every GET answers its declared response model, encoded as
FastAPI encodes it, and reads, key lookups included, never wait for a writer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from fastapi.routing import APIRoute
from pydantic import TypeAdapter
from starlette.routing import BaseRoute

from api.worker import Worker, default_executors
from storage.db import make_engine, session_scope
from storage.keys import create_key
from storage.latency_models import save_latency_model
from storage.profiles import create_profile_run
from tests.api_tests.conftest import Service
from tests.api_tests.test_api_jobs import PARAMS, _create, _trace
from tests.storage_tests.test_profiles import CPU, varied_samples

# Bodies that hold NaN figures, sent as null as they always were, so they cannot be
# validated back: the job's `outcome.json` as stored, the latest recommendation and a
# plan (a window without requests has no mean length): the field naming the job, and
# which job.
WITH_NAN = {
    "/v1/tuning-jobs/{job_id}/result": ("job_id", "job_id"),
    "/v1/recommendations/latest": ("job_id", "job_id"),
    "/v1/plans/{plan_job_id}/result": ("job_id", "plan_job_id"),
}


def _seed(service: Service, tmp_path: Path) -> dict[str, int]:
    trace_id = _trace(service, tmp_path, stream="prod")
    job_id = _create(service, trace_id=trace_id, num_trials=3).json()["id"]
    assert service.worker().run_once() is True
    schedule = service.client.post(
        "/v1/schedules",
        headers=service.auth(service.key_a),
        json={"interval_s": 3600, "params": {**PARAMS, "stream": "prod"}},
    )
    assert schedule.status_code == 201, schedule.text
    deployment = service.client.post(
        "/v1/deployments",
        headers=service.auth(service.key_a),
        json={"name": "prod", "config": {"model": "llama-3.1-8b", "replica": {"tp": 1}}},
    )
    assert deployment.status_code == 201, deployment.text
    plan = service.client.post(
        "/v1/plans",
        headers=service.auth(service.key_a),
        json={"trace_id": trace_id, "model": "llama-3.1-8b", "gpu": "h100", "slo_ttft_ms": 2000,
              "slo_tpot_ms": 50, "window_s": 20, "cold_start_s": 5,
              "unit": {"model": "llama-3.1-8b", "replica": {"tp": 1}}},
    )  # fmt: skip
    assert plan.status_code == 202, plan.text
    engine = make_engine(service.url)
    planner = Worker(engine, storage_url=service.url, executors=default_executors())
    assert planner.run_once() is True
    with session_scope(engine) as s:
        run = create_profile_run(
            s, name="r", source="profiler", accelerator="cpu", device=CPU, samples=varied_samples()
        )
        model = save_latency_model(s, name="m", accelerator="cpu", payload=b"x", schema_version=1)
    engine.dispose()
    return {
        "trace_id": trace_id,
        "job_id": job_id,
        "plan_job_id": plan.json()["id"],
        "schedule_id": schedule.json()["id"],
        "deployment_id": deployment.json()["id"],
        "run_id": run.id,
        "model_id": model.id,
    }


def _routes(routes: list) -> Iterator[BaseRoute]:
    """Every route, those of included routers too."""
    for route in routes:
        included = getattr(route, "original_router", None)
        yield from _routes(included.routes) if included is not None else (route,)


def test_every_get_answers_its_response_model(service: Service, tmp_path: Path) -> None:
    ids = _seed(service, tmp_path)
    routes = [
        r
        for r in _routes(service.client.app.routes)
        if isinstance(r, APIRoute) and "GET" in r.methods and r.response_model is not None
    ]
    assert len(routes) >= 15
    for route in routes:
        key = service.admin if route.path.startswith("/v1/keys") else service.key_a
        r = service.client.get(route.path.format(**ids), headers=service.auth(key))
        assert r.status_code == 200, (route.path, r.text)
        assert r.headers["content-type"] == "application/json", route.path
        if route.path in WITH_NAN:
            field, which = WITH_NAN[route.path]
            assert r.json()[field] == ids[which], route.path
            continue
        adapter = TypeAdapter(route.response_model)
        value = adapter.validate_json(r.content)
        assert adapter.dump_json(value, by_alias=True) == r.content, route.path


def test_reads_and_key_lookups_do_not_wait_for_a_writer(service: Service, tmp_path: Path) -> None:
    trace_id = _trace(service, tmp_path)
    engine = make_engine(service.url)
    with session_scope(engine) as s:
        _, fresh = create_key(s, project="a")  # never used yet: its first use reads the key
    writer = session_scope(engine)
    session = writer.__enter__()
    try:
        create_key(session, project="a")  # an open write transaction (SQLite: the lock)
        session.flush()
        for path in (f"/v1/traces/{trace_id}", "/v1/traces", "/v1/tuning-jobs", "/readyz"):
            r = service.client.get(path, headers=service.auth(fresh))
            assert r.status_code == 200, (path, r.text)
    finally:
        writer.__exit__(None, None, None)
        engine.dispose()


def test_readyz_names_the_migration_the_database_is_at(service: Service) -> None:
    from alembic import command

    from storage.db import _alembic_config, head_revision

    assert service.client.get("/readyz").json()["detail"] == f"migration {head_revision()}"
    command.downgrade(_alembic_config(service.url), "0040_latency_tables")
    r = service.client.get("/readyz")
    assert r.status_code == 503 and "database at migration '0040_latency_tables'" in r.text
    engine = make_engine(service.url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE alembic_version")
    engine.dispose()
    r = service.client.get("/readyz")
    assert r.status_code == 503 and "database at migration None" in r.text
