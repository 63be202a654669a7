"""retired, now empty: PostgreSQL: heartbeats to `jobs` left its change counter alone
(a row trigger), for the API's read cache, since removed; 0100 drops
what builds of 2026-11 made here

Revision ID: 0080_heartbeats_uncounted
Revises: 0070_change_counters
"""

revision = "0080_heartbeats_uncounted"
down_revision = "0070_change_counters"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
