"""SQLite: a change counter per table (but the two written in bulk), advanced by every
row written (see storage/changes.py); nothing on PostgreSQL, which has had them since 0070

Revision ID: 0090_sqlite_change_counters
Revises: 0080_heartbeats_uncounted
"""

from alembic import op

revision = "0090_sqlite_change_counters"
down_revision = "0080_heartbeats_uncounted"
branch_labels = None
depends_on = None

# Every table at this revision but the two written in bulk, a row per request of a trace
# and per kernel sample: a trigger per row doubled the time to store a 1M-row trace. A
# read of those depends on every commit. (A later migration adding a table adds its
# counter too.)
TABLES = (
    "api_keys", "calibrations", "jobs", "latency_models", "latency_tables",
    "observations", "profile_runs", "recommendations", "schedules", "traces",
    "tuning_runs", "validation_runs",
)  # fmt: skip
# The columns of `jobs` at this revision whose update is counted: all but the lease's
# expiry, which a worker's heartbeat sets alone (a migration adding a column to `jobs`
# recreates its update trigger; a test compares this list with the schema).
JOBS_COUNTED = (
    "id", "project", "kind", "status", "params", "window", "progress", "result", "error",
    "created_at", "started_at", "finished_at", "lease_owner", "attempts",
    "cancel_requested", "schedule_id", "trigger_reason",
)  # fmt: skip
EVENTS = ("insert", "update", "delete")


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.execute(
        "CREATE TABLE servetune_changes (name TEXT PRIMARY KEY, changes INTEGER NOT NULL) "
        "WITHOUT ROWID"
    )
    for table in TABLES:
        op.execute(f"INSERT INTO servetune_changes (name, changes) VALUES ('{table}', 0)")
        for event in EVENTS:
            when = event.upper()
            if table == "jobs" and event == "update":
                when += " OF " + ", ".join(f'"{c}"' for c in JOBS_COUNTED)
            op.execute(
                f"CREATE TRIGGER servetune_changes_{table}_{event} AFTER {when} ON {table} "
                f"BEGIN UPDATE servetune_changes SET changes = changes + 1 "
                f"WHERE name = '{table}'; END"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        for event in EVENTS:
            op.execute(f"DROP TRIGGER servetune_changes_{table}_{event}")
    op.execute("DROP TABLE servetune_changes")
