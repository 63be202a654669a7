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

Reads named by a `key` (the route and everything its answer depends on: project,
ids, filters, paging) are answered from memory while the database has not changed
since they were computed, exactly, never stale:

- SQLite: `PRAGMA data_version` on the reader's connection, which changes whenever
  any other connection (this process's writers, a worker, the CLI) commits to the
  file; ~2 us on the event loop.
- PostgreSQL: `pg_current_snapshot()` read first in the same transaction, which
  changes whenever any write transaction of the cluster commits.

The version is read before the work's own reads, so an answer is kept under a
version no newer than the state it saw: a commit in between makes the next
request compute again, never serve an older answer. A not-found error is kept
the same way (a 404 for another project's id). The cache holds at most
`max_entries` answers (all dropped when it fills).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from functools import cache
from typing import Any, TypeVar

import anyio.to_thread
from anyio import CapacityLimiter
from fastapi import Response
from pydantic import TypeAdapter
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from api.problems import NOT_FOUND_ERRORS, ApiError
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


# Errors a kept answer may be (raised again for each request that reads it).
_KEPT_ERRORS = (*NOT_FOUND_ERRORS, ApiError)
_PG_VERSION_SQL = "SELECT pg_current_snapshot()::text"


class _Kept:
    """A read's answer, or the error it raised, under the database version it was read at."""

    __slots__ = ("error", "value", "version")

    def __init__(self, version: object, value: object, error: BaseException | None) -> None:
        self.version, self.value, self.error = version, value, error

    def get(self) -> Any:
        if self.error is not None:
            raise self.error.with_traceback(None)
        return self.value


class Reader:
    """Read-only database work for routes. Build it inside the event loop that serves the
    routes (the app's lifespan) and `close` it before disposing of the engine."""

    def __init__(self, engine: Engine, *, max_threads: int = 4, max_entries: int = 4096) -> None:
        self._connection: Connection | None = None
        self._engine = engine
        self._kept: dict[Hashable, _Kept] = {}
        self._immutable: dict[Hashable, Any] = {}
        self.max_entries = max_entries
        self.hits = self.misses = 0
        if is_sqlite(engine):
            self._connection = connect_reader(engine, busy_timeout_ms=SQLITE_READ_BUSY_TIMEOUT_MS)
            self._raw = self._connection.connection.driver_connection
        else:
            self._limiter = CapacityLimiter(max_threads)

    async def run(self, work: Callable[[Session], T], *, key: Hashable | None = None) -> T:
        """`work(session)` in one read-only transaction; with a `key`, its answer is kept
        while the database is unchanged (see the module docstring)."""
        if self._connection is not None:
            if key is None:
                with read_scope(self._connection) as session:
                    return work(session)
            version = self._raw.execute("PRAGMA data_version").fetchone()[0]
            kept = self._kept.get(key)
            if kept is not None and kept.version == version:
                self.hits += 1
                return kept.get()
            kept = self._compute(version, work, self._connection)
            self._keep(key, kept)
            return kept.get()
        if key is None:
            return await anyio.to_thread.run_sync(self._pooled, work, limiter=self._limiter)
        kept = await anyio.to_thread.run_sync(self._pooled_kept, key, work, limiter=self._limiter)
        self._keep(key, kept)
        return kept.get()

    async def json(
        self, model: Any, query: Callable[[Session], object], *, key: Hashable | None = None
    ) -> Response:
        """`query(session)`'s result, read as `run` reads it, sent as `response_model=model`."""
        body = await self.run(lambda session: encode_json(model, query(session)), key=key)
        return json_response(body)

    def remember(self, key: Hashable, compute: Callable[[], T]) -> T:
        """`compute()` once per `key`, for answers that never change once written (a
        recommendation row by id and creation time); bounded like the kept reads."""
        if key in self._immutable:
            return self._immutable[key]
        value = compute()
        if len(self._immutable) >= self.max_entries:
            self._immutable.clear()
        self._immutable[key] = value
        return value

    def _compute(self, version: object, work: Callable[[Session], Any], bind) -> _Kept:
        self.misses += 1
        try:
            with read_scope(bind) as session:
                return _Kept(version, work(session), None)
        except _KEPT_ERRORS as exc:
            return _Kept(version, None, exc)

    def _keep(self, key: Hashable, kept: _Kept) -> None:
        if key not in self._kept and len(self._kept) >= self.max_entries:
            self._kept.clear()
        self._kept[key] = kept

    def _pooled_kept(self, key: Hashable, work: Callable[[Session], Any]) -> _Kept:
        # The version first, in the transaction the work then reads in (see the docstring).
        with read_scope(self._engine) as session:
            version = session.connection().exec_driver_sql(_PG_VERSION_SQL).scalar()
            kept = self._kept.get(key)
            if kept is not None and kept.version == version:
                self.hits += 1
                return kept
            self.misses += 1
            try:
                return _Kept(version, work(session), None)
            except _KEPT_ERRORS as exc:
                return _Kept(version, None, exc)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()

    def _pooled(self, work: Callable[[Session], T]) -> T:
        with read_scope(self._engine) as session:
            return work(session)
