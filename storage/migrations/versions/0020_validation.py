"""validation: observations, predicted-vs-measured comparisons, calibrations

Revision ID: 0020_validation
Revises: 0010_tuning
"""

import sqlalchemy as sa
from alembic import op

revision = "0020_validation"
down_revision = "0010_tuning"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "observations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("num_requests", sa.Integer(), nullable=False),
        sa.Column("num_failed", sa.Integer(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("requests", sa.JSON(), nullable=False),
    )
    op.create_table(
        "validation_runs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "observation_id",
            sa.Integer(),
            sa.ForeignKey(
                "observations.id",
                ondelete="CASCADE",
                name="fk_validation_runs_observation_id_observations",
            ),
            nullable=True,
        ),
        sa.Column("workload", sa.String(400), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("latency", sa.String(400), nullable=False),
        sa.Column("comparison", sa.JSON(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
    )
    op.create_table(
        "calibrations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("shape_name", sa.String(200), nullable=False),
        sa.Column("accelerator", sa.String(64), nullable=False),
        sa.Column("tp", sa.Integer(), nullable=False),
        sa.Column(
            "latency_model_id",
            sa.Integer(),
            sa.ForeignKey(
                "latency_models.id",
                ondelete="CASCADE",
                name="fk_calibrations_latency_model_id_latency_models",
            ),
            nullable=True,
        ),
        sa.Column("overhead_s", sa.Float(), nullable=False),
        sa.Column("prefill_scale", sa.Float(), nullable=False),
        sa.Column("decode_scale", sa.Float(), nullable=False),
        sa.Column("loss_before", sa.Float(), nullable=False),
        sa.Column("loss_after", sa.Float(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
    )
    op.create_index("ix_calibrations_accelerator", "calibrations", ["accelerator"])


def downgrade() -> None:
    op.drop_index("ix_calibrations_accelerator", table_name="calibrations")
    op.drop_table("calibrations")
    op.drop_table("validation_runs")
    op.drop_table("observations")
