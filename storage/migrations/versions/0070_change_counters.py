"""retired, now empty: PostgreSQL: a change counter per table (a sequence advanced by a
statement trigger), for the API's read cache, since removed; 0100 drops
what builds of 2026-11 made here

Revision ID: 0070_change_counters
Revises: 0060_tuning_run_without_trace
"""

revision = "0070_change_counters"
down_revision = "0060_tuning_run_without_trace"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
