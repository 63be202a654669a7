"""Per-table change counters (storage.changes): every table has one on both back-ends,
every kind of write moves it whoever writes, and the tables a statement reads are named."""

from __future__ import annotations

import sqlalchemy as sa

from optimizer.records import TraceFormat
from storage.changes import (
    COUNTED_TABLES_SQL,
    SQLITE_COUNTED_TABLES_SQL,
    UNCOUNTED_COLUMNS,
    counter_columns,
    sqlite_counters_sql,
    tables_read,
)
from storage.db import make_engine, read_scope, session_scope, upgrade_database
from storage.keys import create_key
from storage.models import Base
from storage.traces import delete_trace, store_trace
from tests.factories import make_columns, make_stats

ALL = frozenset(Base.metadata.tables)


def test_tables_read_are_named_as_words_of_the_sql() -> None:
    select = "SELECT traces.id, traces.name FROM traces WHERE traces.project = %(p)s"
    assert tables_read([select], ALL) == {"traces"}
    # "traces" is not a word of "trace_requests", nor a table's name part of a column's
    rows = "SELECT trace_requests.arrival_s FROM trace_requests WHERE trace_id = %(t)s"
    assert tables_read([rows], ALL) == {"trace_requests"}
    joined = "SELECT jobs.id FROM jobs JOIN recommendations ON recommendations.job_id = jobs.id"
    assert tables_read([select, joined], ALL) == {"traces", "jobs", "recommendations"}
    assert tables_read(["SELECT pg_current_snapshot()::text"], ALL) == frozenset()
    assert tables_read([], ALL) == frozenset()
    # a table without a counter: its changes cannot be seen, so no tables at all
    assert tables_read([select, joined], frozenset({"traces", "jobs"})) is None


def _new_trace(engine, content_hash: str = "h") -> None:
    with session_scope(engine) as s:
        store_trace(
            s, name="t", source_format=TraceFormat.AZURE, content_hash=content_hash,
            columns=make_columns(20), stats=make_stats(20),
        )  # fmt: skip


def _sql(statement: str):
    """A change: `statement` run and committed."""

    def run(engine) -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(statement)

    return run


def _rolled_back(engine) -> None:
    with engine.connect() as conn:
        conn.exec_driver_sql("UPDATE traces SET name = 'x'")
        conn.rollback()


def _only_reads(engine) -> None:
    with read_scope(engine) as s:
        s.execute(sa.text("SELECT count(*) FROM traces")).scalar()


def _counters(engine) -> dict[str, int]:
    """Every counted table's counter, read as `api.reads.Reader` reads them."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            tables = [name for (name,) in conn.exec_driver_sql(SQLITE_COUNTED_TABLES_SQL)]
            values = conn.exec_driver_sql(sqlite_counters_sql(tables)).one()
        else:
            tables = sorted(name for (name,) in conn.exec_driver_sql(COUNTED_TABLES_SQL))
            values = conn.exec_driver_sql("SELECT " + counter_columns(tables)).one()
        return dict(zip(tables, values, strict=True))


def _moved(engine, change) -> set[str]:
    """The tables whose counters `change(engine)` moved."""
    before = _counters(engine)
    change(engine)
    after = _counters(engine)
    return {t for t in before if after[t] != before[t]}


def test_every_write_moves_its_tables_counter_on_postgresql(postgres_url: str) -> None:
    upgrade_database(postgres_url)
    engine = make_engine(postgres_url)
    assert set(_counters(engine)) == ALL  # every table of the schema has one

    def new_key(engine) -> None:
        with session_scope(engine) as s:
            create_key(s, project="p")

    assert _moved(engine, new_key) == {"api_keys"}
    assert _moved(engine, _new_trace) == {"traces", "trace_requests"}
    assert _moved(engine, _sql("UPDATE api_keys SET name = name || '~'")) == {"api_keys"}
    # Counted per statement, even one that matches no row.
    assert _moved(engine, _sql("UPDATE schedules SET name = 'x' WHERE false")) == {"schedules"}
    assert _moved(engine, _sql("DELETE FROM traces")) == {"traces", "trace_requests"}  # cascade
    assert _moved(engine, _sql("TRUNCATE schedules CASCADE")) >= {"schedules"}
    assert _moved(engine, _rolled_back) == {"traces"}  # counted anyway: never missed
    assert _moved(engine, _only_reads) == set()
    _new_trace(engine)
    with session_scope(engine) as s:
        (trace_id,) = s.execute(sa.text("SELECT id FROM traces")).scalars()

    def deleted(engine) -> None:
        with session_scope(engine) as s:
            delete_trace(s, trace_id)

    assert _moved(engine, deleted) == {"traces", "trace_requests"}
    engine.dispose()


def test_a_jobs_update_is_counted_unless_it_only_moves_the_lease(db_url: str) -> None:
    """Without `lease_expires_at` (migrations 0080, 0090): a heartbeat changes no answer,
    so it moves no counter; any other change does, whoever writes it."""
    from optimizer.search import TuneProgress, TuneRequest
    from storage.jobs import claim_job, enqueue_job, renew_lease, report_progress

    upgrade_database(db_url)
    engine = make_engine(db_url)
    sqlite = engine.dialect.name == "sqlite"
    now = "CURRENT_TIMESTAMP" if sqlite else "now()"
    params = TuneRequest(
        model="llama-3.1-8b",
        gpu_types=("h100",),
        gpu_budget=8,
        slo_ttft_ms=1000,
        slo_tpot_ms=50,
        trace_id=1,
    )
    claims = []

    def enqueue(engine) -> None:
        with session_scope(engine) as s:
            enqueue_job(s, project="counters", params=params)

    def claim(engine) -> None:
        with session_scope(engine) as s:
            claims.append(claim_job(s, worker="w", lease_s=30))

    def heartbeat(engine) -> None:
        with session_scope(engine) as s:
            assert renew_lease(s, claims[-1], lease_s=60).held

    def progress(engine) -> None:
        with session_scope(engine) as s:
            assert report_progress(s, claims[-1], TuneProgress(1, 5))

    with engine.begin() as conn:  # only this test's job, whatever other tests left
        conn.exec_driver_sql("UPDATE jobs SET status = 'cancelled' WHERE status = 'queued'")
    assert _moved(engine, enqueue) == {"jobs"}
    assert _moved(engine, claim) == {"jobs"} and claims[-1] is not None
    assert _moved(engine, heartbeat) == set()
    assert _moved(engine, _sql(f"UPDATE jobs SET lease_expires_at = {now}")) == set()
    assert _moved(engine, progress) == {"jobs"}
    # No value changed: PostgreSQL compares the rows; SQLite counts the columns set.
    assert _moved(engine, _sql("UPDATE jobs SET status = status")) == (
        {"jobs"} if sqlite else set()
    )
    assert _moved(engine, _sql("UPDATE jobs SET status = 'x' WHERE 1 = 0")) == set()
    one = "(SELECT min(id) FROM jobs)"
    assert _moved(
        engine, _sql(f"UPDATE jobs SET lease_expires_at = {now}, error = 'e' WHERE id = {one}")
    ) == {"jobs"}
    assert "jobs" in _moved(engine, _sql(f"DELETE FROM jobs WHERE id = {one}"))  # (+ cascade)
    engine.dispose()


def test_a_read_naming_an_uncounted_column_depends_on_every_commit() -> None:
    lease = "SELECT jobs.id, jobs.lease_expires_at FROM jobs"
    assert tables_read(["SELECT jobs.id FROM jobs"], ALL) == {"jobs"}
    assert tables_read([lease], ALL) is None
    assert tables_read(["SELECT id FROM traces", lease], ALL) is None


def test_every_write_moves_its_tables_counter_on_sqlite(tmp_path) -> None:
    """SQLite counts per row written, in the writer's transaction (migration 0090)."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_database(url)
    engine = make_engine(url)
    # every table of the schema has one but the two written in bulk
    assert set(_counters(engine)) == ALL - {"trace_requests", "kernel_samples"}

    with session_scope(engine) as s:
        create_key(s, project="p")
    before = _counters(engine)
    _new_trace(engine)
    after = _counters(engine)
    assert after["traces"] == before["traces"] + 1
    assert after["api_keys"] == before["api_keys"]
    assert _moved(engine, _sql("UPDATE api_keys SET name = name || '~'")) == {"api_keys"}
    # Per row: an update matching no row writes nothing, and moves nothing.
    assert _moved(engine, _sql("UPDATE schedules SET name = 'x' WHERE 0")) == set()
    assert _moved(engine, _rolled_back) == set()  # rolled back with the change it counted
    assert _moved(engine, _only_reads) == set()
    (trace_id,) = _rows(engine, "SELECT id FROM traces")

    def deleted(engine) -> None:
        with session_scope(engine) as s:
            delete_trace(s, trace_id)

    assert _moved(engine, deleted) == {"traces"}
    _new_trace(engine, "h1")
    _new_trace(engine, "h2")
    before = _counters(engine)
    _sql("DELETE FROM traces")(engine)
    assert _counters(engine)["traces"] == before["traces"] + 2  # one per row
    # A read of a table written in bulk (no counter) depends on every commit.
    rows = "SELECT trace_requests.arrival_s FROM trace_requests"
    assert tables_read([rows], frozenset(_counters(engine))) is None
    engine.dispose()


def _rows(engine, statement: str) -> list:
    with engine.connect() as conn:
        return list(conn.exec_driver_sql(statement).scalars())


def test_sqlites_jobs_update_trigger_names_every_counted_column(tmp_path) -> None:
    """SQLite's trigger lists the columns it counts: a column added to `jobs` without
    recreating the trigger would be missed, so the list must be the schema's, less the
    uncounted ones."""
    import re

    from storage.models import JobRow

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_database(url)
    engine = make_engine(url)
    (trigger,) = _rows(
        engine, "SELECT sql FROM sqlite_master WHERE name = 'servetune_changes_jobs_update'"
    )
    named = re.search(r"UPDATE OF (.*?) ON jobs", trigger).group(1)
    columns = {c.strip().strip('"') for c in named.split(",")}
    expected = {c.name for c in JobRow.__table__.columns} - set(UNCOUNTED_COLUMNS)
    assert columns == expected
    engine.dispose()
