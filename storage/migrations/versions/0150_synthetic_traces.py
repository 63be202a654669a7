"""traces record whether `servetune traces synthesize` made them, and from what (the
sample trace, the rate curve's points, days, mean rate, seed); traces stored before are
uploads or built workloads: null

Revision ID: 0150_synthetic_traces
Revises: 0140_attainment_loads
"""

import sqlalchemy as sa
from alembic import op

revision = "0150_synthetic_traces"
down_revision = "0140_attainment_loads"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column: one ALTER TABLE in place on both back-ends, no table copy.
    op.add_column("traces", sa.Column("synthetic", sa.JSON(), nullable=True))


def downgrade() -> None:
    # SQLite >= 3.35 drops a column in place: the requests that reference the traces
    # (ON DELETE CASCADE) stay. A synthetic trace stays as a plain one.
    op.drop_column("traces", "synthetic")
