"""/healthz (process up), /readyz (database reachable and migrated), /metrics."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from api.deps import EngineDep
from api.problems import problem_response
from api.schemas import Health, Problem
from storage.db import session_scope
from storage.jobs import count_by_status

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="The process is up")
def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    summary="The database answers and is migrated to the newest schema",
    responses={503: {"model": Problem, "description": "database down or not migrated"}},
)
def readyz(request: Request, engine: EngineDep) -> Health | JSONResponse:
    from alembic.runtime.migration import MigrationContext

    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
            current = MigrationContext.configure(conn).get_current_revision()
    except Exception as exc:
        detail = f"database unreachable: {type(exc).__name__}"
        return problem_response(request, 503, detail, kind="not-ready")
    head = request.app.state.head_revision
    if current != head:
        detail = f"database at migration {current!r}, expected {head!r}; run `servetune db upgrade`"
        return problem_response(request, 503, detail, kind="not-ready")
    return Health(status="ready", detail=f"migration {current}")


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    summary="Prometheus metrics (text format 0.0.4)",
    responses={200: {"content": {"text/plain": {}}}},
)
def metrics(request: Request, engine: EngineDep) -> PlainTextResponse:
    gauges: dict[str, dict] = {"servetune_up": {(): 1.0}}
    try:
        with session_scope(engine) as session:
            counts = count_by_status(session)
        gauges["servetune_jobs"] = {(("status", str(s)),): float(n) for s, n in counts.items()}
    except Exception:
        gauges["servetune_database_up"] = {(): 0.0}
    else:
        gauges["servetune_database_up"] = {(): 1.0}
    text = request.app.state.metrics.render(gauges)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")
