"""Migration 0100: the change counters that builds of 2026-11 made in 0070-0090 are
dropped (no trigger, sequence, function or table left, on either back-end), the list
routes' composite indexes exist, and going down to 0090 and up again works."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from storage.db import _alembic_config, make_engine, upgrade_database

NEW_INDEXES = {
    "api_keys": {"ix_api_keys_project_id"},
    "jobs": {"ix_jobs_project_id", "ix_jobs_project_status_id"},
    "schedules": {"ix_schedules_project_id"},
    "traces": {"ix_traces_project_id", "ix_traces_project_stream_id"},
    "recommendations": {"ix_recommendations_project_created"},
}
# What those builds' 0070/0080 (PostgreSQL) and 0090 (SQLite) made, for `jobs`.
LEGACY = {
    "postgresql": (
        "CREATE FUNCTION servetune_table_changed() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN PERFORM nextval(TG_ARGV[0]::regclass); RETURN NULL; END $$",
        "CREATE FUNCTION servetune_row_changed() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN PERFORM nextval(TG_ARGV[0]::regclass); RETURN NULL; END $$",
        "CREATE SEQUENCE servetune_changes_jobs",
        "CREATE TRIGGER servetune_changes AFTER INSERT OR DELETE ON jobs FOR EACH STATEMENT "
        "EXECUTE FUNCTION servetune_table_changed('servetune_changes_jobs')",
        "CREATE TRIGGER servetune_changes_rows AFTER UPDATE ON jobs FOR EACH ROW "
        "EXECUTE FUNCTION servetune_row_changed('servetune_changes_jobs', 'lease_expires_at')",
    ),
    "sqlite": (
        "CREATE TABLE servetune_changes (name TEXT PRIMARY KEY, changes INTEGER NOT NULL)",
        "CREATE TRIGGER servetune_changes_jobs_update AFTER UPDATE ON jobs BEGIN "
        "UPDATE servetune_changes SET changes = changes + 1 WHERE name = 'jobs'; END",
    ),
}


def _counter_objects(engine: sa.Engine) -> list[str]:
    """Whatever the counters were made of that is still there."""
    if engine.dialect.name == "sqlite":
        sql = "SELECT name FROM sqlite_master WHERE name LIKE 'servetune_changes%'"
    else:
        sql = (
            "SELECT relname FROM pg_class WHERE relname LIKE 'servetune_changes%' "
            "UNION ALL SELECT tgname FROM pg_trigger WHERE tgname LIKE 'servetune_changes%' "
            "UNION ALL SELECT proname FROM pg_proc WHERE proname LIKE 'servetune_%changed'"
        )
    with engine.connect() as conn:
        return sorted(conn.execute(sa.text(sql)).scalars())


def _indexes(engine: sa.Engine, table: str) -> set[str]:
    return {ix["name"] for ix in sa.inspect(engine).get_indexes(table)}


def test_counters_go_and_the_list_indexes_come(db_url: str) -> None:
    command.upgrade(_alembic_config(db_url), "0090_sqlite_change_counters")
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:  # a database those builds migrated
            for statement in LEGACY[engine.dialect.name]:
                conn.exec_driver_sql(statement)
        assert len(_counter_objects(engine)) == len(LEGACY[engine.dialect.name])
        upgrade_database(db_url)
        assert _counter_objects(engine) == []
        for table, names in NEW_INDEXES.items():
            assert names <= _indexes(engine, table), table
        assert "ix_jobs_project" not in _indexes(engine, "jobs")  # a prefix of the new ones
        command.downgrade(_alembic_config(db_url), "0090_sqlite_change_counters")
        assert "ix_jobs_project" in _indexes(engine, "jobs")
        assert not NEW_INDEXES["jobs"] & _indexes(engine, "jobs")
        upgrade_database(db_url)
        assert NEW_INDEXES["jobs"] <= _indexes(engine, "jobs") and _counter_objects(engine) == []
    finally:
        engine.dispose()
