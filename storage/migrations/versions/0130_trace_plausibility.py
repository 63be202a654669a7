"""traces carry the plausibility warnings ingest found (a rate, a span, a length that
real traffic hardly shows); traces stored before have none

Revision ID: 0130_trace_plausibility
Revises: 0120_deployment_loop
"""

import sqlalchemy as sa
from alembic import op

revision = "0130_trace_plausibility"
down_revision = "0120_deployment_loop"
branch_labels = None
depends_on = None

# storage.models.traces.NO_PLAUSIBILITY_WARNINGS_SQL when written (schema_version 1)
NONE_SQL = """'{"schema_version": 1, "warnings": []}'"""


def upgrade() -> None:
    # One ALTER TABLE on both back-ends (SQLite adds a NOT NULL column with a constant
    # default in place); every existing row reads the default: no warnings.
    op.add_column(
        "traces",
        sa.Column(
            "plausibility_warnings", sa.JSON(), nullable=False, server_default=sa.text(NONE_SQL)
        ),
    )


def downgrade() -> None:
    # SQLite >= 3.35 drops a column in place: no table copy, so the requests that
    # reference the traces (ON DELETE CASCADE) stay.
    op.drop_column("traces", "plausibility_warnings")
