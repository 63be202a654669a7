"""tuning runs: the study, trace, latency model and search settings behind each outcome

Revision ID: 0010_tuning
Revises: 0004_service
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_tuning"
down_revision = "0004_service"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tuning_runs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("study_name", sa.String(200), nullable=False),
        sa.Column("trace_id", sa.Integer(), nullable=False, index=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("search_space", sa.JSON(), nullable=False),
        sa.Column("latency_label", sa.String(200), nullable=False),
        sa.Column("outcome", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("study_name", name="uq_tuning_runs_study_name"),
    )


def downgrade() -> None:
    op.drop_table("tuning_runs")
