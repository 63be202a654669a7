"""retired, now empty: SQLite: a change counter per table (a counters table and row
triggers), for the API's read cache, since removed; 0100 drops
what builds of 2026-11 made here

Revision ID: 0090_sqlite_change_counters
Revises: 0080_heartbeats_uncounted
"""

revision = "0090_sqlite_change_counters"
down_revision = "0080_heartbeats_uncounted"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
