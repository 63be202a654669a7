"""The FastAPI application, built by `create_app(settings)`; nothing is built at import."""

from __future__ import annotations

import gc
import json
import logging
import threading
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response

from api.deps import KeyCache
from api.metrics import Metrics, MetricsMiddleware
from api.problems import install_problem_handlers
from api.reads import Reader
from api.routes import (
    deployment_calibrations,
    deployments,
    health,
    jobs,
    keys,
    latency_models,
    plans,
    profiles,
    recommendations,
    schedules,
    traces,
    ui,
)
from api.settings import Settings, get_settings
from api.uploads import clean_spool_at_start
from api.worker import Executor, Worker, WorkerOptions, default_executors
from api.worker.runner import start_worker_thread
from storage.db import head_revision, is_sqlite, make_engine, upgrade_database
from storage.service_records import JobKind

log = logging.getLogger("servetune.api")

DESCRIPTION = """Trace-driven tuning of LLM serving configs as a service.

Every `/v1` route needs an API key: `Authorization: Bearer <key>`
(`servetune keys create --project P`). A key sees only its project's traces,
jobs and schedules. Errors are RFC 9457 `application/problem+json`. Lists are
paged with `limit` and `offset`, or a keyset cursor `after` (a page's `next_after`),
and say `total`, `next_offset` and `next_after`. Job status, job results and the
latest recommendation carry a weak `ETag`: send it back in `If-None-Match` to get a
304 while the answer is unchanged.
"""


def create_app(
    settings: Settings | None = None,
    *,
    embedded_worker: bool | None = None,
    executors: Mapping[JobKind, Executor] | None = None,
) -> FastAPI:
    """Build the app. The database is migrated on startup; with SQLite (or when asked)
    one worker thread runs jobs in-process so one command gives a working service."""
    settings = settings or get_settings()
    run_worker = embedded_worker if embedded_worker is not None else settings.embedded_worker

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        clean_spool_at_start(settings.upload_dir)  # what killed server processes left
        upgrade_database(settings.database_url)
        engine = make_engine(settings.database_url)
        app.state.engine = engine
        reader = Reader(engine)
        app.state.reader = reader
        app.state.head_revision = head_revision()
        stop = threading.Event()
        thread = None
        if run_worker if run_worker is not None else is_sqlite(engine):
            worker = Worker(
                engine,
                storage_url=settings.database_url,
                executors=executors or default_executors(),
                options=WorkerOptions(lease_s=settings.lease_s, poll_s=settings.worker_poll_s),
            )
            thread = start_worker_thread(worker, stop)
            log.info("embedded worker %s running", worker.name)
        # Everything alive now (modules, routes, the engine) lives as long as the app:
        # move it out of the collector's reach, so a full collection under load scans
        # only request garbage (~1 ms) instead of every object (~100 ms pauses, p99).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            stop.set()
            if thread is not None:
                thread.join(timeout=30)
            await reader.aclose()
            engine.dispose()

    app = FastAPI(
        title="servetune",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        openapi_tags=[
            {"name": "traces", "description": "Production request traces and trace streams"},
            {"name": "tuning-jobs", "description": "Optuna searches run by workers"},
            {
                "name": "plans",
                "description": "Fleet plans over time (servetune plan) run by workers",
            },
            {"name": "recommendations", "description": "The newest tuned config per deployment"},
            {
                "name": "schedules",
                "description": "Re-tuning or re-planning on an interval, cron or drift",
            },
            {
                "name": "deployments",
                "description": "Configs running in production and their observed windows",
            },
            {
                "name": "profiles",
                "description": "GPU kernel measurements, shared by all projects (import: admin)",
            },
            {
                "name": "latency-models",
                "description": "Latency models fitted on profiles, shared by all projects "
                "(fit: admin)",
            },
            {"name": "keys", "description": "API keys (admin scope)"},
            {"name": "health", "description": "Liveness, readiness, Prometheus metrics"},
        ],
    )
    app.state.settings = settings
    app.state.metrics = Metrics()
    app.state.key_cache = KeyCache(settings.key_cache_s)
    app.state.fit_lock = threading.Lock()  # one latency-model fit at a time per process
    install_problem_handlers(app)
    routers = (
        health, traces, jobs, plans, recommendations, schedules, deployments,
        deployment_calibrations, profiles, latency_models, keys, ui,
    )  # fmt: skip
    for module in routers:
        app.include_router(module.router)
    _serve_openapi_encoded(app)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)  # outermost
    return app


def _serve_openapi_encoded(app: FastAPI) -> None:
    """/openapi.json as bytes encoded once, as FastAPI's own route encodes them (it keeps
    the schema but encodes the ~100 kB document again on every request: ~1.5 ms, the
    slowest GET under load)."""
    encoded: list[bytes] = []

    async def openapi(_: Request) -> Response:
        if not encoded:
            text = json.dumps(app.openapi(), ensure_ascii=False, allow_nan=False,
                              separators=(",", ":"))  # fmt: skip
            encoded.append(text.encode("utf-8"))
        return Response(encoded[0], media_type="application/json")

    url = app.openapi_url
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != url]
    app.add_route(url, openapi, include_in_schema=False)
