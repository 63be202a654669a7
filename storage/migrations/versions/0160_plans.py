"""fleet plans: each plan's request and outcome as JSON documents

Revision ID: 0160_plans
Revises: 0150_synthetic_traces
"""

import sqlalchemy as sa
from alembic import op

revision = "0160_plans"
down_revision = "0150_synthetic_traces"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plans",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("project", sa.String(100), nullable=False),
        sa.Column("trace_id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("gpu", sa.String(200), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("outcome", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_plans_trace_id", "plans", ["trace_id"])
    op.create_index("ix_plans_project_id", "plans", ["project", "id"])


def downgrade() -> None:
    op.drop_index("ix_plans_project_id", table_name="plans")
    op.drop_index("ix_plans_trace_id", table_name="plans")
    op.drop_table("plans")
