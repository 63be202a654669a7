"""`servetune serve` (the REST API) and `servetune worker` (the job queue)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Annotated

import typer

from api.cli.common import console, fail


def _settings():
    from api.settings import SettingsError, get_settings

    try:
        return get_settings()
    except SettingsError as exc:
        fail(str(exc))


def serve(
    host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port")] = 8000,
    worker: Annotated[
        bool | None,
        typer.Option(
            "--worker/--no-worker",
            help="run a job worker thread in-process (default: only with SQLite)",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            max=64,
            help="API processes (PostgreSQL only)",
        ),
    ] = 1,
) -> None:
    """Run the REST API (migrations are applied on start)."""
    import uvicorn

    from api.app import create_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    settings = _settings()
    if workers > 1 and settings.database_url.startswith("sqlite"):
        fail("--workers > 1 needs PostgreSQL (SERVETUNE_DATABASE_URL); SQLite has one writer")
    console.print(f"servetune API on http://{host}:{port}  (docs: /docs, results: /ui/jobs/ID)")
    common = {
        "host": host,
        "port": port,
        "log_level": log_level,
        "access_log": False,
    }
    if workers == 1:
        uvicorn.run(create_app(settings, embedded_worker=worker), **common)
        return
    if worker is not None:  # the worker processes build their app from the environment
        os.environ["SERVETUNE_EMBEDDED_WORKER"] = "true" if worker else "false"
    uvicorn.run("api.app:create_app", factory=True, workers=workers, **common)


def worker(
    lease_s: Annotated[
        float | None, typer.Option(help="job lease in seconds (default SERVETUNE_LEASE_S)")
    ] = None,
    poll_s: Annotated[float | None, typer.Option(help="polling period in seconds")] = None,
    no_schedules: Annotated[
        bool, typer.Option("--no-schedules", help="run jobs only; never fire schedules")
    ] = False,
) -> None:
    """Run jobs from the database queue until SIGINT/SIGTERM (run as many as you like)."""
    from api.worker import Worker, WorkerOptions, default_executors
    from storage.db import make_engine, upgrade_database

    settings = _settings()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    upgrade_database(settings.database_url)
    engine = make_engine(settings.database_url)
    try:
        options = WorkerOptions(
            lease_s=lease_s or settings.lease_s,
            poll_s=poll_s or settings.worker_poll_s,
            run_schedules=not no_schedules,
        )
    except ValueError as exc:
        fail(str(exc))
    runner = Worker(
        engine,
        storage_url=settings.database_url,
        executors=default_executors(),
        options=options,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    console.print(f"worker {runner.name} polling {engine.url.render_as_string(hide_password=True)}")
    runner.run(stop)
    engine.dispose()
