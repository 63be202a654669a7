"""fitted latency models

Revision ID: 0003_latency_models
Revises: 0002_profiles
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_latency_models"
down_revision = "0002_profiles"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "latency_models",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column(
            "profile_run_id",
            sa.Integer(),
            sa.ForeignKey(
                "profile_runs.id",
                ondelete="SET NULL",
                name="fk_latency_models_profile_run_id_profile_runs",
            ),
            nullable=True,
        ),
        sa.Column("shape_name", sa.String(200), nullable=False),
        sa.Column("accelerator", sa.String(64), nullable=False),
        sa.Column("tp_degrees", sa.JSON(), nullable=False),
        sa.Column("features", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("schema_version", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.UniqueConstraint("name", "version", name="uq_latency_models_name_version"),
    )
    op.create_index("ix_latency_models_accelerator", "latency_models", ["accelerator"])


def downgrade() -> None:
    op.drop_index("ix_latency_models_accelerator", table_name="latency_models")
    op.drop_table("latency_models")
