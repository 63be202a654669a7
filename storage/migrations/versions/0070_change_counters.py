"""PostgreSQL: a change counter per table, advanced by every statement that writes it
(see storage/changes.py); nothing on SQLite

Revision ID: 0070_change_counters
Revises: 0060_tuning_run_without_trace
"""

from alembic import op

revision = "0070_change_counters"
down_revision = "0060_tuning_run_without_trace"
branch_labels = None
depends_on = None

# Every table at this revision (a later migration adding a table adds its counter too).
TABLES = (
    "api_keys", "calibrations", "jobs", "kernel_samples", "latency_models",
    "latency_tables", "observations", "profile_runs", "recommendations", "schedules",
    "trace_requests", "traces", "tuning_runs", "validation_runs",
)  # fmt: skip


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        "CREATE FUNCTION servetune_table_changed() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN PERFORM nextval(TG_ARGV[0]::regclass); RETURN NULL; END $$"
    )
    for table in TABLES:
        op.execute(f"CREATE SEQUENCE servetune_changes_{table}")
        # Called once: `last_value` then moves with every later call (a sequence never
        # called reports its start value, which its first call returns too).
        op.execute(f"SELECT nextval('servetune_changes_{table}')")
        op.execute(
            f"CREATE TRIGGER servetune_changes "
            f"AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION "
            f"servetune_table_changed('servetune_changes_{table}')"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.execute(f"DROP TRIGGER servetune_changes ON {table}")
        op.execute(f"DROP SEQUENCE servetune_changes_{table}")
    op.execute("DROP FUNCTION servetune_table_changed()")
