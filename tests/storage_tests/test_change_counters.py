"""Per-table change counters (storage.changes): every table has one on PostgreSQL, every
kind of write moves it whoever writes, and the tables a statement reads are named."""

from __future__ import annotations

import sqlalchemy as sa

from optimizer.records import TraceFormat
from storage.changes import COUNTED_TABLES_SQL, counter_columns, tables_read
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


def _counters(engine) -> dict[str, int]:
    with engine.connect() as conn:
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

    def new_trace(engine) -> None:
        with session_scope(engine) as s:
            store_trace(
                s, name="t", source_format=TraceFormat.AZURE, content_hash="h",
                columns=make_columns(20), stats=make_stats(20),
            )  # fmt: skip

    def sql(statement: str):
        def run(engine) -> None:
            with engine.begin() as conn:
                conn.exec_driver_sql(statement)

        return run

    def rolled_back(engine) -> None:
        with engine.connect() as conn:
            conn.exec_driver_sql("UPDATE api_keys SET name = 'x'")
            conn.rollback()

    def only_reads(engine) -> None:
        with read_scope(engine) as s:
            s.execute(sa.text("SELECT count(*) FROM traces")).scalar()

    assert _moved(engine, new_key) == {"api_keys"}
    assert _moved(engine, new_trace) == {"traces", "trace_requests"}
    assert _moved(engine, sql("UPDATE api_keys SET name = name || '~'")) == {"api_keys"}
    assert _moved(engine, sql("UPDATE jobs SET status = 'x' WHERE false")) == {"jobs"}  # no row
    assert _moved(engine, sql("DELETE FROM traces")) == {"traces", "trace_requests"}  # cascade
    assert _moved(engine, sql("TRUNCATE schedules CASCADE")) >= {"schedules"}
    assert _moved(engine, rolled_back) == {"api_keys"}  # counted anyway: never missed
    assert _moved(engine, only_reads) == set()
    new_trace(engine)
    with session_scope(engine) as s:
        (trace_id,) = s.execute(sa.text("SELECT id FROM traces")).scalars()

    def deleted(engine) -> None:
        with session_scope(engine) as s:
            delete_trace(s, trace_id)

    assert _moved(engine, deleted) == {"traces", "trace_requests"}
    engine.dispose()


def test_sqlite_has_no_counters(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_database(url)
    engine = make_engine(url)
    with engine.connect() as conn:
        names = conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type='trigger'")
        assert list(names) == []
    engine.dispose()
