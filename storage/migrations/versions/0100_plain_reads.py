"""plain reads: the change counters that builds of 2026-11 made in 0070-0090 dropped (the
API keeps no reads); composite indexes for the list routes, ordered by id for offset and
keyset paging

Revision ID: 0100_plain_reads
Revises: 0090_sqlite_change_counters
"""

from alembic import op

revision = "0100_plain_reads"
down_revision = "0090_sqlite_change_counters"
branch_labels = None
depends_on = None

# The tables that had counters (0070 on PostgreSQL: all, each a sequence and a statement
# trigger, `jobs` a row trigger too (0080); 0090 on SQLite: all but the two written in
# bulk, each three row triggers and a row of the counters table).
COUNTED = (
    "api_keys", "calibrations", "jobs", "kernel_samples", "latency_models",
    "latency_tables", "observations", "profile_runs", "recommendations", "schedules",
    "trace_requests", "traces", "tuning_runs", "validation_runs",
)  # fmt: skip
SQLITE_EVENTS = ("insert", "update", "delete")
# (name, table, columns): a list's filters, then its order. Each `project` index alone
# (0004) is a prefix of the new one and goes.
INDEXES = (
    ("ix_api_keys_project_id", "api_keys", ["project", "id"]),
    ("ix_jobs_project_id", "jobs", ["project", "id"]),
    ("ix_jobs_project_status_id", "jobs", ["project", "status", "id"]),
    ("ix_schedules_project_id", "schedules", ["project", "id"]),
    ("ix_traces_project_id", "traces", ["project", "id"]),
    ("ix_traces_project_stream_id", "traces", ["project", "stream", "id"]),
    ("ix_recommendations_project_created", "recommendations", ["project", "created_at", "id"]),
)
REPLACED = (("ix_api_keys_project", "api_keys"), ("ix_jobs_project", "jobs"),
            ("ix_schedules_project", "schedules"))  # fmt: skip


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS servetune_changes_rows ON jobs")
        for table in COUNTED:
            op.execute(f"DROP TRIGGER IF EXISTS servetune_changes ON {table}")
            op.execute(f"DROP SEQUENCE IF EXISTS servetune_changes_{table}")
        op.execute("DROP FUNCTION IF EXISTS servetune_row_changed()")
        op.execute("DROP FUNCTION IF EXISTS servetune_table_changed()")
    elif dialect == "sqlite":
        for table in COUNTED:
            for event in SQLITE_EVENTS:
                op.execute(f"DROP TRIGGER IF EXISTS servetune_changes_{table}_{event}")
        op.execute("DROP TABLE IF EXISTS servetune_changes")
    for name, table in REPLACED:
        op.drop_index(name, table_name=table)
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    """The indexes of 0090 (the counters are not made again: nothing reads them)."""
    for name, table, _ in INDEXES:
        op.drop_index(name, table_name=table)
    for name, table in REPLACED:
        op.create_index(name, table, ["project"])
