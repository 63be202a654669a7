"""Read routes: read-only database work done cheaply, answered as encoded JSON.

A sync route taking a `SessionDep` costs four hand-offs to the thread pool per
request (the session's enter and exit, the route, FastAPI validating the
returned value), fought over by up to 40 threads for the GIL; under 50
concurrent clients on two cores that took longer than the reads themselves. A
read route is `async` instead and awaits its app's `Reader`:

- `await reader.json(model, query, key=...)`: `query(session)` in one read-only
  transaction (`storage.db.read_scope`), its result encoded with `model`'s
  `TypeAdapter` exactly as FastAPI encodes a `response_model` (JSON, by alias);
  the route keeps `response_model=model` for its OpenAPI schema;
- `await reader.response(work, key=...)`: the JSON bytes `work` returns, sent as
  the whole response;
- `await reader.run(work)`: the same transaction, returning what `work` returns;
- `await reader.each(read_many, item, key=...)`: `read_many(session, items)[item]`,
  a kept read whose misses of one `read_many` are read together on PostgreSQL (one
  statement for many rows: the jobs a commit made stale, say).

The work runs on the event loop, never in a thread:

- SQLite: on one connection the reader keeps. A read-only transaction there is a
  WAL snapshot that never waits for the writer, on a local file: 0.1-0.5 ms of
  CPU. Handing it to a thread cost more than that (measured ~0.45 ms a request):
  each sqlite3 call releases the GIL, and the thread then waits for the busy
  event loop to give it back. A short busy timeout bounds the stall in the rare
  cases where SQLite makes even a WAL reader wait.
- PostgreSQL: reads wait on the network, so they run as SQLAlchemy's asyncio
  extension runs synchronous ORM code (`AsyncSession.run_sync`: the work in a
  greenlet on the loop, each round trip awaited on psycopg's async connection).
  In threads they waited for the GIL after every round trip (up to the 5 ms
  switch interval each while the loop was busy): ~3-10 ms a read under load.
  Each transaction is read-only and REPEATABLE READ: all its statements (a page
  and its total) see one snapshot. Kept reads that miss are read in batches, one
  transaction for all the misses queued when it starts (see `_pg_batches`).

Errors raised by the work (a storage not-found, an `ApiError`) reach the
problem handlers as from any route.

Reads named by a `key` (the route and everything its answer depends on: project,
ids, filters, paging) are answered from memory while what they read has not
changed since they were computed, exactly, never stale:

- SQLite: `PRAGMA data_version` on the reader's connection, which changes whenever
  any other connection (this process's writers, a worker, the CLI) commits to the
  file, and the tables' change counters (`storage.changes`) read after it when it
  has changed (`SqliteVersion`); read once per turn of the event loop
  (`_sqlite_version`). A miss notes the SQL it ran, hence the tables it read, and
  its answer stands while no commit has happened since, or while the counters of
  the tables it read are unchanged: a worker's progress report to `jobs` leaves
  the answers read from `traces` standing, and its heartbeat every answer.
- PostgreSQL: `pg_current_snapshot()` with the tables' change counters
  (`storage.changes`) read after it in the same statement, and before it by the
  previous such read (`PgVersion`), over an
  autocommit connection of the reader's own, one read shared by every request
  that arrived before it started (or the snapshot alone, first in the work's
  transaction, while that connection is down). A miss notes the SQL it ran, hence
  the tables it read. Its answer stands while no transaction of the cluster has
  ended since its version was read (`PgSnapshot.unchanged_at`: a write transaction
  that has only begun changes nothing yet, its commit does), or while the counters
  of the tables it read are unchanged and every transaction running at its version
  still runs (`PgVersion.unchanged_at`): a worker's progress report to `jobs`
  leaves the answers read from `traces` standing (and its heartbeat, uncounted,
  every answer: see `storage.changes`).

The version is read before the work's own reads, so an answer is kept under a
version no newer than the state it saw: a commit in between makes the next
request compute again, never serve an older answer. A not-found error is kept
the same way (a 404 for another project's id). Concurrent misses of one key at
one version share one read. The cache holds at most `max_entries` answers (all
dropped when it fills).

While `api.fastpath` serves a request, its reads are noted in a `ReadLog`: a
response that is one kept read's answer (`json`, `response`) at one version can then
be sent again before routing while that version stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any, TypeVar

from fastapi import Response
from pydantic import TypeAdapter
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from api.problems import NOT_FOUND_ERRORS, ApiError
from storage.changes import (
    COUNTED_TABLES_SQL,
    SQLITE_COUNTED_TABLES_SQL,
    counter_columns,
    sqlite_counters_sql,
    tables_read,
)
from storage.db import READ_ONLY, connect_reader, is_sqlite, read_scope
from storage.service_records import Principal

T = TypeVar("T")
# How long a read on the event loop waits for a SQLite lock before failing (a WAL reader
# only waits while another connection recovers or resets the WAL).
SQLITE_READ_BUSY_TIMEOUT_MS = 200
# PostgreSQL misses: at most this many reads per transaction, and transactions at once.
PG_BATCH_SIZE = 64
MAX_PG_BATCHES = 2


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


@dataclass(frozen=True, slots=True)
class PgSnapshot:
    """A PostgreSQL snapshot as `pg_current_snapshot()` writes it (`xmin:xmax:xip,...`):
    the transactions with ids below `xmax` and not in `xip` had ended when it was taken."""

    xmin: int
    xmax: int
    xip: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> PgSnapshot:
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(t) for t in xip.split(",") if t))

    def unchanged_at(self, later: PgSnapshot) -> bool:
        """True when no transaction ended between this snapshot and `later`, taken after
        it: both see the same committed state. A transaction that has only begun writing
        (it took an id: `xmax` moved past it, and it is in `later.xip`) changes nothing
        yet; one that ended may have committed (an aborted one counts too)."""
        if later.xmax < self.xmax:
            return later == self
        if any(t not in later.xip for t in self.xip):
            return False
        return all(t in later.xip for t in range(self.xmax, later.xmax))


@dataclass(frozen=True, slots=True)
class PgVersion:
    """PostgreSQL's version: a snapshot, and the change counters of the tables `names`
    (`storage.changes`) read before it (`before`; empty when unknown) and after it
    (`after`); no counters where they cannot be read (before migration 0070, or inside a
    read's own transaction)."""

    snapshot: PgSnapshot
    names: tuple[str, ...] = ()
    before: tuple[int, ...] = ()
    after: tuple[int, ...] = ()

    def unchanged_at(self, later: PgVersion, tables: frozenset[str] | None) -> bool:
        """True when the tables `tables` (None: every table) hold the same committed rows
        at `later`, read after this version, as at this one.

        Either no transaction ended in between (`PgSnapshot.unchanged_at`), or each table's
        counter after `later`'s snapshot equals its counter before this one and no
        transaction running at this snapshot has ended. A transaction that committed a
        write to one of them in between advanced that counter while it ran: after this
        version's counters were read (the counter differs: a sequence only grows, and
        `later.after` was read after the commit), or before, and then it was still running
        at this snapshot (it had a transaction id since its first write, and had not
        committed, else this snapshot would see its rows) and has ended since."""
        then, now = self.snapshot, later.snapshot
        if then.unchanged_at(now):
            return True
        if tables is None or not self.before or later.names != self.names or not later.after:
            return False
        if now.xmax < then.xmax or any(t not in now.xip for t in then.xip):
            return False  # not later, or a transaction running at this version has ended
        return _same_counters(tables, self.names, self.before, later.after)


@dataclass(frozen=True, slots=True)
class SqliteVersion:
    """SQLite's version: `PRAGMA data_version` on the reader's connection, which changes
    whenever another connection commits, and the change counters of the tables `names`
    (`storage.changes`; none before migration 0090) read after it."""

    data_version: int
    names: tuple[str, ...] = ()
    counters: tuple[int, ...] = ()

    def unchanged_at(self, later: SqliteVersion, tables: frozenset[str] | None) -> bool:
        """True when the tables `tables` (None: every table) hold the same committed rows
        at `later`, read after this version, as at this one: no commit at all in between
        (the same data version), or none to those tables (the same counters: a counter is
        written in the transaction that writes its table, and commits one at a time)."""
        if later.data_version == self.data_version:
            return True
        if tables is None or not self.counters or later.names != self.names:
            return False
        return _same_counters(tables, self.names, self.counters, later.counters)


def _same_counters(
    tables: frozenset[str], names: tuple[str, ...], old: tuple[int, ...], new: tuple[int, ...]
) -> bool:
    """True when every table of `tables` has a counter (`names`) and it is the same in
    `old` and `new`."""
    for table in tables:
        if table not in names:
            return False
        at = names.index(table)
        if new[at] != old[at]:
            return False
    return True


@dataclass(slots=True)
class ReadLog:
    """What one request read, noted by `Reader` (and the caller's authentication) while
    `api.fastpath` serves it: the versions its kept reads were answered at and the tables
    they read, whether any read was not kept, whether its response is one kept read's
    answer (`Reader.response`, or the refusal of an unknown API key) and whose key it ran
    under."""

    versions: set[object] = field(default_factory=set)
    tables: frozenset[str] | None = frozenset()  # what its kept reads read (None: unknown)
    unkept: bool = False
    answered: bool = False
    authenticated: bool = False  # the caller's API key was looked up: `principal` holds it
    principal: Principal | None = None  # None (once authenticated): an unknown key

    def replayable_at(self) -> object | None:
        """The one database version the whole response stands for, or None when it is not
        a function of the request and that version alone."""
        if not self.answered or self.unkept or len(self.versions) != 1:
            return None
        return next(iter(self.versions))

    def note(self, version: object, tables: frozenset[str] | None) -> None:
        self.versions.add(version)
        self.tables = None if tables is None or self.tables is None else self.tables | tables


_LOG: ContextVar[ReadLog | None] = ContextVar("servetune_read_log", default=None)


@contextlib.contextmanager
def logging_reads() -> Iterator[ReadLog]:
    """Note this context's reads (the request being served) in a fresh `ReadLog`."""
    log = ReadLog()
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)


def note_caller(principal: Principal | None) -> None:
    """The request being served runs under `principal`'s API key; None: its key is unknown,
    and the refusal is its answer (read, like any kept answer, at the key read's version)."""
    log = _LOG.get()
    if log is not None:
        log.authenticated, log.principal = True, principal
        if principal is None:
            log.answered = True


class _Kept:
    """A read's answer, or the error it raised, under the database version it was read at,
    and the tables it read (PostgreSQL; None: unknown, it depends on every table)."""

    __slots__ = ("error", "tables", "value", "version")

    def __init__(self, version: object, value: object, error: BaseException | None) -> None:
        self.version, self.value, self.error = version, value, error
        self.tables: frozenset[str] | None = None

    def get(self) -> Any:
        if self.error is not None:
            raise self.error.with_traceback(None)
        return self.value


_STATEMENTS = "servetune_statements"  # Connection.info: the SQL run by the current miss


def _note_statement(conn: Connection, cursor, statement: str, *_: object) -> None:
    statements = conn.info.get(_STATEMENTS)
    if statements is not None:
        statements.append(statement)


@dataclass(slots=True)
class _Miss:
    """A kept read to compute on PostgreSQL, in the next batch (see `Reader._pg_batches`):
    `work`, or `item`'s answer of `read_many` (`Reader.each`)."""

    version: object
    work: Callable[[Session], Any]
    future: asyncio.Future[_Kept]
    read_many: ReadMany | None = None
    item: Hashable = None


# Answers for many items in one go (`Reader.each`): item -> value, or the error to raise.
ReadMany = Callable[[Session, list[Any]], Mapping[Any, Any]]


def _one_of(read_many: ReadMany, item: Hashable, session: Session) -> Any:
    answer = read_many(session, [item])[item]
    if isinstance(answer, BaseException):
        raise answer
    return answer


class Reader:
    """Read-only database work for routes. Build it inside the event loop that serves the
    routes (the app's lifespan); `await aclose()` then `close()` it before disposing of
    the engine."""

    def __init__(self, engine: Engine, *, max_entries: int = 4096) -> None:
        self._engine = engine
        self._kept: dict[Hashable, _Kept] = {}
        self._immutable: dict[Hashable, Any] = {}
        self._running: dict[Hashable, tuple[object, asyncio.Future[_Kept]]] = {}
        self._queued: list[_Miss] = []  # PostgreSQL: misses for the next batch
        self._batchers: set[asyncio.Task[None]] = set()
        self._batching = 0  # batchers started and not yet past their last look at the queue
        self.max_entries = max_entries
        self.hits = self.misses = 0
        self._connection: Connection | None = None
        self._async_engine: Any = None  # PostgreSQL: sqlalchemy.ext.asyncio.AsyncEngine
        self._version_conn: Any = None  # PostgreSQL: a psycopg.AsyncConnection, on first use
        self._waiting: asyncio.Future[PgVersion | None] | None = None  # the next read's callers
        self._pump: asyncio.Task[None] | None = None
        if is_sqlite(engine):
            self._connection = connect_reader(engine, busy_timeout_ms=SQLITE_READ_BUSY_TIMEOUT_MS)
            self._raw = self._connection.connection.driver_connection
            self._turn_version: SqliteVersion | None = None  # read in this turn of the loop
            self._last_version: SqliteVersion | None = None  # the last one read
            self._sqlite_counted, self._counters_sql = self._sqlite_counted_tables()
            self._sqlite_counted_set = frozenset(self._sqlite_counted)
            if self._sqlite_counted:  # the statements each miss runs: the tables it read
                event.listen(self._connection, "before_cursor_execute", _note_statement)
            event.listen(engine, "commit", self._committed)
        else:
            from sqlalchemy.ext.asyncio import create_async_engine

            self._async_engine = create_async_engine(engine.url)
            self._read_engine = self._async_engine.execution_options(
                isolation_level="REPEATABLE READ", postgresql_readonly=True
            )
            self._conninfo = engine.url.set(drivername="postgresql").render_as_string(
                hide_password=False
            )
            self._connecting = asyncio.Lock()
            # The statements each miss runs (see `_read_batch`): the tables it read.
            event.listen(self._async_engine.sync_engine, "before_cursor_execute", _note_statement)
            self._counted: tuple[str, ...] = ()  # tables with change counters (on connecting)
            self._version_sql = _PG_VERSION_SQL
            self._counters: tuple[int, ...] = ()  # read by the last version read, if any

    # -- reading -------------------------------------------------------------------------
    async def run(self, work: Callable[[Session], T], *, key: Hashable | None = None) -> T:
        """`work(session)` in one read-only transaction; with a `key`, its answer is kept
        while the database is unchanged (see the module docstring)."""
        log = _LOG.get()
        if key is None:
            if log is not None:
                log.unkept = True
            if self._connection is not None:
                with read_scope(self._connection) as session:
                    return work(session)
            return await self._pg_read(work)
        return await self._kept_answer(key, work)

    async def each(self, read_many: ReadMany, item: Hashable, *, key: Hashable) -> Any:
        """`read_many(session, items)[item]`, read as `run` reads a kept read under `key`
        (an answer that is an error of those kept, a not-found, is raised). On PostgreSQL
        the misses of one `read_many` queued for the same batch are read by one call: one
        statement for many rows where `run` would take one each."""
        return await self._kept_answer(key, partial(_one_of, read_many, item), (read_many, item))

    async def _kept_answer(
        self, key: Hashable, work: Callable, many: tuple[ReadMany, Hashable] | None = None
    ) -> Any:
        kept, version = await self._kept_read(key, work, many)
        log = _LOG.get()
        if log is not None:
            log.note(version, kept.tables)
        return kept.get()

    async def _kept_read(
        self, key: Hashable, work: Callable, many: tuple[ReadMany, Hashable] | None = None
    ) -> tuple[_Kept, object]:
        """The answer for `key`, and the version read for this call that it stands for."""
        version = await self.version()
        if version is None:  # the version connection is down: read it in the transaction
            return await self._pg_kept(key, work)
        kept = self._current(key, version)
        if kept is None:
            if self._connection is not None:
                kept = self._sqlite_read(version, work)
            else:
                kept = await self._read_once(key, version, work, many)
            self._keep(key, kept)
        return kept, version

    def _current(self, key: Hashable, version: object) -> _Kept | None:
        """The answer kept for `key` if the database is unchanged since it was read."""
        kept = self._kept.get(key)
        if kept is None or not self.unchanged(kept.version, version, kept.tables):
            return None
        self.hits += 1
        return kept

    def unchanged(self, old: object, now: object, tables: frozenset[str] | None = None) -> bool:
        """True when what was read at the earlier version `old` from `tables` (None: from
        any table) is the same at version `now` (`SqliteVersion.unchanged_at`,
        `PgVersion.unchanged_at`)."""
        return old.unchanged_at(now, tables)

    async def version(self) -> object | None:
        """The database's version now (see the module docstring): read after this call
        began; None when it cannot be read (PostgreSQL's version connection is down)."""
        if self._connection is not None:
            return self._sqlite_version()
        return await self._pg_version()

    def _sqlite_version(self) -> SqliteVersion:
        """`PRAGMA data_version`, and the change counters after it when it has changed,
        read once per turn of the event loop (each read takes and drops a WAL read lock:
        ~30 us of system calls on a virtual machine). Every request served in a turn
        arrived before it began (the loop polls its sockets between turns), so a version
        read in the turn is read after the request arrived, as `version` promises;
        `_drop_turn_version`, queued with `call_soon` when the version is read, runs
        before anything that arrives later. A commit through this process's engine drops
        it at once (`_committed`): a read after its own write sees it. While the data
        version stands no commit has happened since the counters were read (after it),
        so they stand too."""
        version = self._turn_version
        if version is None:
            data_version = self._raw.execute("PRAGMA data_version").fetchone()[0]
            version = self._last_version
            if version is None or version.data_version != data_version:
                version = self._last_version = self._sqlite_counters(data_version)
            self._turn_version = version
            asyncio.get_running_loop().call_soon(self._drop_turn_version)
        return version

    def _sqlite_counted_tables(self) -> tuple[tuple[str, ...], str]:
        """The tables whose changes SQLite counts (none before migration 0090), and the
        statement that reads their counters."""
        try:
            counted = tuple(name for (name,) in self._raw.execute(SQLITE_COUNTED_TABLES_SQL))
        except sqlite3.OperationalError:  # no counters table
            return (), ""
        return counted, sqlite_counters_sql(counted)

    def _sqlite_counters(self, data_version: int) -> SqliteVersion:
        if not self._sqlite_counted:
            return SqliteVersion(data_version)
        counters = self._raw.execute(self._counters_sql).fetchone()
        return SqliteVersion(data_version, self._sqlite_counted, counters)

    def _drop_turn_version(self) -> None:
        self._turn_version = None

    def _committed(self, conn: Connection) -> None:
        if not conn.get_execution_options().get(READ_ONLY):  # a read's end changes nothing
            self._turn_version = None

    async def response(self, work: Callable[[Session], bytes], *, key: Hashable) -> Response:
        """`work(session)`'s JSON bytes, read as `run` reads them under `key`, sent as the
        whole response: the answer (or kept error) is then a function of the request's
        path and query, the caller's grant and the database version alone, which lets
        `api.fastpath` send it again (`ReadLog`) to any caller with that grant. So the
        work must depend on the caller only through its project and admin scope
        (`Principal.project`, `Principal.is_admin`), never on which of its keys called."""
        self.answering()
        return json_response(await self.run(work, key=key))

    def answering(self) -> None:
        """The response being built (or the error raised) is a function of the request and
        the answers of its kept reads alone, as `response` says: `api.fastpath` may send
        it again while they stand."""
        log = _LOG.get()
        if log is not None:
            log.answered = True

    async def json(
        self, model: Any, query: Callable[[Session], object], *, key: Hashable
    ) -> Response:
        """`query(session)`'s result, read as `response` reads it, sent as
        `response_model=model`."""
        return await self.response(lambda session: encode_json(model, query(session)), key=key)

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

    def remembered(self, key: Hashable) -> Any | None:
        """What `remember` holds for `key`; None when it holds nothing."""
        return self._immutable.get(key)

    def _keep(self, key: Hashable, kept: _Kept) -> None:
        if key not in self._kept and len(self._kept) >= self.max_entries:
            self._kept.clear()
        self._kept[key] = kept

    def _sqlite_read(self, version: object, work: Callable[[Session], Any]) -> _Kept:
        """`work`'s answer, with the tables its statements read (None without counters)."""
        info = self._connection.info
        statements = info[_STATEMENTS] = []
        try:
            with read_scope(self._connection) as session:
                kept = self._compute(version, work, session)
        finally:
            del info[_STATEMENTS]
        if self._sqlite_counted:
            kept.tables = tables_read(statements, self._sqlite_counted_set)
        return kept

    # -- PostgreSQL ----------------------------------------------------------------------
    async def _pg_read(self, work: Callable[[Session], T]) -> T:
        try:
            return await self._pg_transaction(work)
        except DBAPIError as exc:
            # A pooled connection a server restart dropped (no pre-ping: one round trip
            # less per read): once more on a new one, as a pre-ping would have found.
            if not exc.connection_invalidated:
                raise
            return await self._pg_transaction(work)

    async def _pg_transaction(self, work: Callable[[Session], T]) -> T:
        from sqlalchemy.ext.asyncio import AsyncSession

        session = AsyncSession(self._read_engine, expire_on_commit=False)
        async with session, session.begin():
            return await session.run_sync(work)

    async def _pg_kept(self, key: Hashable, work: Callable) -> tuple[_Kept, PgVersion]:
        """`work`'s answer with the version read first in the same transaction (the version
        connection is down; no change counters: the snapshot is taken before they could be
        read), and a kept answer used if current."""

        def read(session: Session) -> tuple[_Kept, PgVersion]:
            text = session.connection().exec_driver_sql(_PG_VERSION_SQL).scalar()
            version = PgVersion(PgSnapshot.parse(text))
            kept = self._current(key, version)
            if kept is None:
                kept = self._compute(version, work, session)
                self._keep(key, kept)
            return kept, version

        return await self._pg_read(read)

    def _compute(self, version: object, work: Callable, session: Session) -> _Kept:
        self.misses += 1
        try:
            return _Kept(version, work(session), None)
        except _KEPT_ERRORS as exc:
            return _Kept(version, None, exc)

    async def _read_once(
        self, key: Hashable, version: object, work: Callable, many: tuple | None = None
    ) -> _Kept:
        """`work`'s answer under `version`, read once for every concurrent caller of the
        same key and version (a burst of misses after a commit costs one read per key, not
        one per request), in the next batch of misses."""
        running = self._running.get(key)
        if running is None or running[0] != version:
            future: asyncio.Future[_Kept] = asyncio.get_running_loop().create_future()
            self._queued.append(_Miss(version, work, future, *(many or ())))
            if self._batching < MAX_PG_BATCHES:
                self._batching += 1
                task = asyncio.create_task(self._pg_batches())
                self._batchers.add(task)
                task.add_done_callback(self._batchers.discard)
            running = self._running[key] = (version, future)
            future.add_done_callback(lambda done: self._forget(key, done))
        return await asyncio.shield(running[1])

    def _forget(self, key: Hashable, done: asyncio.Future[_Kept]) -> None:
        if self._running.get(key, (None, None))[1] is done:
            del self._running[key]
        if not done.cancelled():
            done.exception()  # retrieved: no "never retrieved" log when every caller left

    async def _pg_batches(self) -> None:
        """Read queued misses, up to `PG_BATCH_SIZE` at a time, each batch in one read-only
        REPEATABLE READ transaction until none is queued. One transaction costs two round
        trips, a pooled connection and a greenlet (~1 ms of CPU a read when each read had
        its own; ~0.45 ms in batches of 50). Its snapshot is taken after every queued
        miss read its version, so each answer is kept under a version no newer than the
        state it saw; every read of the batch sees the same state.

        `_batching` counts down in the same step as the last look at the queue finds it
        empty (not when the task is done, a loop turn later): a miss queued after that
        look starts a batcher of its own, never waits for one that has stopped."""
        try:
            while self._queued:
                batch, self._queued = self._queued[:PG_BATCH_SIZE], self._queued[PG_BATCH_SIZE:]
                try:
                    await self._pg_batch(batch)
                except BaseException as exc:
                    for miss in batch:
                        if not miss.future.done():
                            miss.future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
        finally:
            self._batching -= 1

    async def _pg_batch(self, batch: list[_Miss]) -> None:
        """Every miss of `batch` answered: its kept answer, or the error its own read raised.
        A read whose statement fails (which aborts the transaction) fails alone: the rest
        are read in a new transaction. A connection a server restart dropped is replaced
        once (no pre-ping: one round trip less per batch)."""
        replaced = False
        while batch:
            broken: DBAPIError | None = None
            try:
                async with self._read_engine.connect() as connection:
                    broken = await connection.run_sync(self._read_batch, batch)
                    await connection.rollback()  # it only read
            except DBAPIError as exc:
                broken = broken or exc
            left = [miss for miss in batch if not miss.future.done()]
            progressed, batch = len(left) < len(batch), left
            if broken is None:
                continue
            if broken.connection_invalidated:
                if not replaced:
                    replaced = True
                    continue
            elif progressed:  # one read failed alone
                continue
            for miss in batch:  # the database cannot be read
                miss.future.set_exception(broken)
            return

    def _read_batch(self, connection: Connection, batch: list[_Miss]) -> DBAPIError | None:
        """Answer `batch`'s misses in one transaction until a statement fails: that error
        (also its reads' answer, unless the connection was dropped). The misses of one
        `read_many` (`each`) are read together, where the first of them stands."""
        connection.begin()  # each session below joins it, and leaves it open
        counted = frozenset(self._counted)
        info = connection.info  # (not reachable through a connection once it is dropped)
        for at, miss in enumerate(batch):
            if miss.future.done():  # read together with an earlier one
                continue
            together = [miss]
            if miss.read_many is not None:
                together += [m for m in batch[at + 1 :] if m.read_many == miss.read_many]
            statements = info[_STATEMENTS] = []
            with Session(connection, expire_on_commit=False) as session:
                try:
                    if miss.read_many is None:
                        answers = [self._compute(miss.version, miss.work, session)]
                    else:
                        answers = self._compute_many(together, session)
                except DBAPIError as exc:
                    if not exc.connection_invalidated:
                        for m in together:
                            m.future.set_exception(exc)
                    return exc
                except Exception as exc:
                    for m in together:
                        m.future.set_exception(exc)
                    continue
                finally:
                    del info[_STATEMENTS]
            tables = tables_read(statements, counted)
            for m, kept in zip(together, answers, strict=True):
                kept.tables = tables
                m.future.set_result(kept)
        return None

    def _compute_many(self, misses: list[_Miss], session: Session) -> list[_Kept]:
        answers = misses[0].read_many(session, [m.item for m in misses])
        self.misses += len(misses)
        out = []
        for m in misses:
            answer = answers[m.item]
            if isinstance(answer, BaseException):
                if not isinstance(answer, _KEPT_ERRORS):
                    raise answer
                out.append(_Kept(m.version, None, answer))
            else:
                out.append(_Kept(m.version, answer, None))
        return out

    async def _pg_version(self) -> PgVersion | None:
        """PostgreSQL's current snapshot, read after this call began, over an autocommit
        connection of the reader's own: one read for every caller that arrived before it
        started (concurrent callers share the next read, not one already under way);
        None when it cannot be read."""
        waiting = self._waiting
        if waiting is None:
            waiting = self._waiting = asyncio.get_running_loop().create_future()
            if self._pump is None:
                self._pump = asyncio.create_task(self._pump_versions())
        return await asyncio.shield(waiting)

    async def _pump_versions(self) -> None:
        try:
            while self._waiting is not None:
                # Taken off before the read starts: every waiter arrived before it.
                batch, self._waiting = self._waiting, None
                batch.set_result(await self._read_version())
        finally:
            self._pump = None

    async def _read_version(self) -> PgVersion | None:
        """The snapshot and the change counters, in one statement: its snapshot is taken
        when it starts, the counters are read (not transactional) as it runs, after it.
        The counters read just before the snapshot are those of the previous version read
        on the same connection (none on a new connection)."""
        import psycopg

        try:
            if self._version_conn is None or self._version_conn.closed:
                async with self._connecting:
                    if self._version_conn is None or self._version_conn.closed:
                        await self._connect_version_conn()
            cursor = await self._version_conn.execute(self._version_sql)
            text, *after = await cursor.fetchone()
            snapshot = PgSnapshot.parse(text)
            if not self._counted:
                return PgVersion(snapshot)
            before, self._counters = self._counters, tuple(after)
            return PgVersion(snapshot, self._counted, before, self._counters)
        except (psycopg.Error, OSError):
            await self._close_version_conn()
            return None

    async def _connect_version_conn(self) -> None:
        import psycopg

        conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        cursor = await conn.execute(COUNTED_TABLES_SQL)
        self._counted = tuple(sorted(name for (name,) in await cursor.fetchall()))
        self._version_sql = _PG_VERSION_SQL
        if self._counted:
            self._version_sql += ", " + counter_columns(self._counted)
        self._counters = ()
        self._version_conn = conn

    async def _close_version_conn(self) -> None:
        conn, self._version_conn = self._version_conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(Exception):  # a broken connection: nothing to release
                await conn.close()

    # -- closing -------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Close what needs the event loop (PostgreSQL's connections)."""
        for task in list(self._batchers):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        queued, self._queued = self._queued, []
        for miss in queued:
            miss.future.set_exception(RuntimeError("the reader was closed"))
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        await self._close_version_conn()
        if self._async_engine is not None:
            await self._async_engine.dispose()

    def close(self) -> None:
        if self._connection is not None:
            event.remove(self._engine, "commit", self._committed)
            self._connection.close()
