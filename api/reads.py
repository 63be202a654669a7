"""Read routes: read-only database work done cheaply, answered as encoded JSON.

A sync route taking a `SessionDep` costs four hand-offs to the thread pool per
request (the session's enter and exit, the route, FastAPI validating the
returned value), fought over by up to 40 threads for the GIL; under 50
concurrent clients on two cores that took longer than the reads themselves. A
read route is `async` instead and awaits its app's `Reader`:

- `await reader.json(model, query)`: `query(session)` in one read-only
  transaction (`storage.db.read_scope`), its result encoded with `model`'s
  `TypeAdapter` exactly as FastAPI encodes a `response_model` (JSON, by alias);
  the route keeps `response_model=model` for its OpenAPI schema;
- `await reader.run(work)`: the same transaction, returning what `work` returns.

Where the work runs depends on the database:

- SQLite: on the event loop, on one connection the reader keeps. A read-only
  transaction there is a WAL snapshot that never waits for the writer, on a
  local file: 0.1-0.5 ms of CPU. Handing it to a thread cost more than that
  (measured ~0.45 ms a request): each sqlite3 call releases the GIL, and the
  thread then waits for the busy event loop to give it back. Its own connection
  means a read never waits for the shared pool (which threads fill), and a short
  busy timeout bounds the stall in the rare cases where SQLite makes even a
  WAL reader wait.
- PostgreSQL: reads wait on the network, so they go to `max_threads` threads (a
  limiter of the reader's own, FIFO) with pooled sessions. Four measured best at 50
  clients on two cores (p99 ~75 ms; eight ~90-120 ms, sixteen ~150 ms: more threads
  contend for the GIL).

Errors raised by the work (a storage not-found, an `ApiError`) reach the
problem handlers as from any route.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

import anyio.to_thread
from anyio import CapacityLimiter
from fastapi import Response
from pydantic import TypeAdapter
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from storage.db import connect_reader, is_sqlite, read_scope

T = TypeVar("T")
# How long a read on the event loop waits for a SQLite lock before failing (a WAL reader
# only waits while another connection recovers or resets the WAL).
SQLITE_READ_BUSY_TIMEOUT_MS = 200


@cache
def _encoder(model: Any) -> Callable[..., bytes]:
    return TypeAdapter(model).dump_json


def encode_json(model: Any, value: object) -> bytes:
    """`value` as FastAPI sends it for `response_model=model`."""
    return _encoder(model)(value, by_alias=True)


def json_response(body: bytes) -> Response:
    return Response(body, media_type="application/json")


class Reader:
    """Read-only database work for routes. Build it inside the event loop that serves the
    routes (the app's lifespan) and `close` it before disposing of the engine."""

    def __init__(self, engine: Engine, *, max_threads: int = 4) -> None:
        self._connection: Connection | None = None
        self._engine = engine
        if is_sqlite(engine):
            self._connection = connect_reader(engine, busy_timeout_ms=SQLITE_READ_BUSY_TIMEOUT_MS)
        else:
            self._limiter = CapacityLimiter(max_threads)

    async def run(self, work: Callable[[Session], T]) -> T:
        """`work(session)` in one read-only transaction."""
        if self._connection is not None:
            with read_scope(self._connection) as session:
                return work(session)
        return await anyio.to_thread.run_sync(self._pooled, work, limiter=self._limiter)

    async def json(self, model: Any, query: Callable[[Session], object]) -> Response:
        """`query(session)`'s result, read as `run` reads it, sent as `response_model=model`."""
        return json_response(await self.run(lambda session: encode_json(model, query(session))))

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()

    def _pooled(self, work: Callable[[Session], T]) -> T:
        with read_scope(self._engine) as session:
            return work(session)
