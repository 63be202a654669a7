"""Engines, sessions and migrations.

`make_engine(url)` builds an engine for SQLite (WAL, foreign keys on, a busy
timeout so concurrent writers wait instead of failing) or PostgreSQL.
`session_scope(engine)` is one read-write transaction, `read_scope(engine)` one
that only reads (on SQLite it does not queue for the single writer's lock).
`upgrade_database(url)` applies the Alembic migrations shipped in
`storage/migrations`. Nothing here runs at import time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


class StorageError(RuntimeError):
    """The database cannot be reached or is not in the expected state."""


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # Let SQLAlchemy, not pysqlite, decide where transactions begin (see _sqlite_begin):
    # pysqlite's own handling breaks SAVEPOINTs and so atomic ingest.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


# Execution option marking a connection whose transaction only reads (see `read_scope`).
READ_ONLY = "servetune_read_only"


def _sqlite_begin(conn) -> None:
    # IMMEDIATE takes the write lock up front: SQLite has a single writer, and a
    # deferred transaction that upgrades later can fail instead of waiting. A read-only
    # transaction takes no lock: in WAL mode it reads a snapshot and neither waits for
    # the writer nor blocks it (under load, readers queueing for the write lock starve
    # in SQLite's sleeping busy handler: seconds, up to the 30 s busy timeout).
    # Straight on the driver's connection: through `exec_driver_sql` (a cursor, an
    # execution context, a result) it cost ~40% of a one-statement read's overhead.
    begin = "BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE"
    conn.connection.driver_connection.execute(begin)


def make_engine(url: str, *, echo: bool = False) -> Engine:
    """An engine for `url`; creates the SQLite file's parent folder when needed."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:":
            Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url, echo=echo, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    return sa.create_engine(url, echo=echo, pool_pre_ping=True, pool_size=10, max_overflow=20)


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


@contextmanager
def session_scope(bind: Engine | Connection) -> Iterator[Session]:
    """One transaction: commit on success, roll back on any error."""
    with Session(bind, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


@contextmanager
def read_scope(bind: Engine | Connection) -> Iterator[Session]:
    """One transaction that only reads: on SQLite a deferred one (a WAL snapshot, no write
    lock), on PostgreSQL the same as `session_scope`. Do not write in it: on SQLite a write
    fails at once ("database is locked") when another writer is active or has committed
    since the snapshot was taken. On an engine the connection is taken at the first
    query; a connection (kept by its caller for reads, see `api.reads`) is marked
    read-only for good."""
    with session_scope(bind.execution_options(**{READ_ONLY: True})) as session:
        yield session


def connect_reader(engine: Engine, *, busy_timeout_ms: int) -> Connection:
    """A connection of its own for `read_scope`s run one after another on one thread (the
    API's event loop), marked read-only; on SQLite it waits at most `busy_timeout_ms` for
    a lock (a WAL reader waits only while another connection recovers or resets the WAL)."""
    connection = engine.connect().execution_options(**{READ_ONLY: True})
    if is_sqlite(engine):
        connection.exec_driver_sql(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        connection.commit()
    return connection


def _alembic_config(url: str):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade_database(url: str, revision: str = "head") -> None:
    """Apply migrations up to `revision` (idempotent). A database already at the newest
    revision is recognised with one query, without loading Alembic (~0.25 s a command)."""
    if revision == "head" and _at_head(url):
        return
    from alembic import command

    command.upgrade(_alembic_config(url), revision)


def newest_migration() -> str:
    """The revision id of the newest migration file (files are numbered in order)."""
    names = sorted(p.stem for p in (MIGRATIONS_DIR / "versions").glob("[0-9]*.py"))
    if not names:
        raise StorageError("no migrations found")
    return names[-1]


def _at_head(url: str) -> bool:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            version = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    except sa.exc.DBAPIError:
        return False  # no alembic_version table yet: a new database
    finally:
        engine.dispose()
    return version == newest_migration()


def current_revision(url: str) -> str | None:
    """The applied migration revision, or None for an empty database."""
    from alembic.runtime.migration import MigrationContext

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config("sqlite://")).get_current_head()
    if head is None:
        raise StorageError("no migrations found")
    return head
