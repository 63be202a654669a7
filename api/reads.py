"""Read routes' database work, answered as JSON.

A read route is `async` and awaits the app's `Reader`:

- `await reader.run(work)`: `work(session)`, reading only (on SQLite one read-only
  transaction, `storage.db.read_scope`), returning what `work` returns;
- `await reader.json(model, query)`: the same, `query(session)`'s result encoded
  with `model`'s `TypeAdapter` exactly as FastAPI encodes a `response_model` (JSON,
  by alias); the route keeps `response_model=model` for its OpenAPI schema.

Where the work runs depends on the database:

- SQLite: on the event loop, on one connection the reader keeps. A read-only
  transaction there is a WAL snapshot that never waits for the writer, on a local
  file: 0.1-0.5 ms of CPU, less than a hand-off to a thread and back under load. A
  short busy timeout bounds the stall in the rare cases where SQLite makes even a WAL
  reader wait.
- PostgreSQL: reads wait on the network, so they run as SQLAlchemy's asyncio extension
  runs synchronous code (`run_sync`: the work in a greenlet on the loop, each round
  trip awaited on psycopg's async connection; in threads each round trip waited for
  the GIL while the loop was busy). They run in autocommit: each statement is one
  round trip and sees its own snapshot (no BEGIN and COMMIT around it: ~0.2 ms of
  CPU less a read). A page and its total are two statements, so a write committed
  between them can make the total differ by that write from the page.

Nothing is kept between reads: every request reads the database. Errors raised by the
work (a storage not-found, an `ApiError`) reach the problem handlers as from any route.

The answers clients poll (a job's status, its result and the latest recommendation: the
result page polls the first two, deploy scripts the last) use HTTP's own caching
(`polled_json`): a weak validator, `ETag: W/"<hash of the body>"`, and `Cache-Control:
private, max-age=POLL_MAX_AGE_S` with `Vary: Authorization` (one project's answer: only
the caller's own cache may keep it, per API key). A request whose `If-None-Match` names
the current ETag (or `*`) gets `304 Not Modified` with no body. The database is still read
for every request (the ETag is the body's own hash): a 304 saves the transfer and the
client's parsing, and is never stale.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

from fastapi import Request, Response
from pydantic import TypeAdapter
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from storage.db import connect_reader, is_sqlite, read_scope

T = TypeVar("T")
# How long a read on the event loop waits for a SQLite lock before failing (a WAL reader
# only waits while another connection recovers or resets the WAL).
SQLITE_READ_BUSY_TIMEOUT_MS = 200
# PostgreSQL: connections for reads, per API process.
PG_CONNECTIONS = 8


@cache
def _encoder(model: Any) -> Callable[..., bytes]:
    return TypeAdapter(model).dump_json


def encode_json(model: Any, value: object) -> bytes:
    """`value` as FastAPI sends it for `response_model=model`."""
    return _encoder(model)(value, by_alias=True)


def json_response(body: bytes) -> Response:
    return Response(body, media_type="application/json")


# How long a client may reuse a polled answer without asking: short, as progress moves.
POLL_MAX_AGE_S = 1


def etag_of(body: bytes) -> str:
    return f'W/"{hashlib.blake2b(body, digest_size=16).hexdigest()}"'


def matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an `If-None-Match` header names `etag`, compared weakly (RFC 9110 13.1.2:
    `W/"x"` and `"x"` match)."""
    if if_none_match is None:
        return False
    opaque = etag.removeprefix("W/")
    for candidate in if_none_match.split(","):
        candidate = candidate.strip()
        if candidate == "*" or candidate.removeprefix("W/") == opaque:
            return True
    return False


def polled_json(request: Request, body: bytes) -> Response:
    """`body` as a JSON answer with its validator, or a 304 when the client holds it."""
    etag = etag_of(body)
    headers = {
        "ETag": etag,
        "Cache-Control": f"private, max-age={POLL_MAX_AGE_S}",
        "Vary": "Authorization",
    }
    if matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    response = json_response(body)
    response.headers.update(headers)
    return response


class Reader:
    """Read-only database work for routes. Build it inside the event loop that serves the
    routes (the app's lifespan); `await aclose()` before disposing of the engine."""

    def __init__(self, engine: Engine) -> None:
        self._connection: Connection | None = None
        self._async_engine: Any = None  # PostgreSQL: sqlalchemy.ext.asyncio.AsyncEngine
        if is_sqlite(engine):
            self._connection = connect_reader(engine, busy_timeout_ms=SQLITE_READ_BUSY_TIMEOUT_MS)
        else:
            from sqlalchemy.ext.asyncio import create_async_engine

            # A fixed pool, and reads beyond it wait their turn, first come first served (a
            # burst of 50 reads opened and closed dozens of overflow connections, ~2 ms
            # each; the pool's own wait let some reads wait far longer than others).
            self._async_engine = create_async_engine(
                engine.url, pool_size=PG_CONNECTIONS, max_overflow=0, isolation_level="AUTOCOMMIT"
            )
            self._turns = asyncio.Semaphore(PG_CONNECTIONS)

    async def run(self, work: Callable[[Session], T]) -> T:
        """`work(session)`, reading only: one transaction on SQLite, autocommit statements
        on PostgreSQL."""
        if self._connection is not None:
            with read_scope(self._connection) as session:
                return work(session)
        try:
            return await self._pg_read(work)
        except DBAPIError as exc:
            # A pooled connection a server restart dropped (no pre-ping: one round trip
            # less per read): once more on a new one, as a pre-ping would have found.
            if not exc.connection_invalidated:
                raise
            return await self._pg_read(work)

    async def json(self, model: Any, query: Callable[[Session], object]) -> Response:
        """`query(session)`'s result, read as `run` reads it, sent as
        `response_model=model`."""
        return json_response(await self.run(lambda session: encode_json(model, query(session))))

    async def aclose(self) -> None:
        if self._connection is not None:
            self._connection.close()
        if self._async_engine is not None:
            await self._async_engine.dispose()

    async def _pg_read(self, work: Callable[[Session], T]) -> T:
        def read(connection: Connection) -> T:
            with Session(connection, expire_on_commit=False) as session:
                return work(session)

        async with self._turns, self._async_engine.connect() as connection:
            return await connection.run_sync(read)
