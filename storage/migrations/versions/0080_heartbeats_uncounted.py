"""PostgreSQL: an update to `jobs` moves its change counter only when it changes more than
the lease's expiry (a worker's heartbeat changes no answer the API gives); nothing on
SQLite

Revision ID: 0080_heartbeats_uncounted
Revises: 0070_change_counters
"""

from alembic import op

revision = "0080_heartbeats_uncounted"
down_revision = "0070_change_counters"
branch_labels = None
depends_on = None

_STATEMENTS = (
    "CREATE TRIGGER servetune_changes AFTER {events} ON jobs FOR EACH STATEMENT "
    "EXECUTE FUNCTION servetune_table_changed('servetune_changes_jobs')"
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    # Per row, after the statement (before the commit, as the counters' proof needs): the
    # row without the uncounted column, compared whole, so a column added later is counted.
    op.execute(
        "CREATE FUNCTION servetune_row_changed() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN "
        "IF (to_jsonb(OLD) - TG_ARGV[1]) IS DISTINCT FROM (to_jsonb(NEW) - TG_ARGV[1]) THEN "
        "PERFORM nextval(TG_ARGV[0]::regclass); END IF; "
        "RETURN NULL; END $$"
    )
    op.execute("DROP TRIGGER servetune_changes ON jobs")
    op.execute(_STATEMENTS.format(events="INSERT OR DELETE OR TRUNCATE"))
    op.execute(
        "CREATE TRIGGER servetune_changes_rows AFTER UPDATE ON jobs FOR EACH ROW "
        "EXECUTE FUNCTION servetune_row_changed('servetune_changes_jobs', 'lease_expires_at')"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER servetune_changes_rows ON jobs")
    op.execute("DROP TRIGGER servetune_changes ON jobs")
    op.execute(_STATEMENTS.format(events="INSERT OR UPDATE OR DELETE OR TRUNCATE"))
    op.execute("DROP FUNCTION servetune_row_changed()")
