"""deployments: a config running in production, and the windows observed on it

Revision ID: 0110_deployments
Revises: 0100_plain_reads
"""

import sqlalchemy as sa
from alembic import op

revision = "0110_deployments"
down_revision = "0100_plain_reads"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("project", sa.String(100), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column(
            "recommendation_id",
            sa.Integer(),
            sa.ForeignKey(
                "recommendations.id",
                ondelete="SET NULL",
                name="fk_deployments_recommendation_id_recommendations",
            ),
            nullable=True,
        ),
        sa.Column("prometheus_url", sa.String(500), nullable=True),
        sa.Column("label_selector", sa.String(1000), nullable=True),
        sa.Column("created_at", TZ, nullable=False),
    )
    op.create_index("ix_deployments_project_id", "deployments", ["project", "id"])
    op.create_table(
        "deployment_observations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "deployment_id",
            sa.Integer(),
            sa.ForeignKey(
                "deployments.id",
                ondelete="CASCADE",
                name="fk_deployment_observations_deployment_id_deployments",
            ),
            nullable=False,
        ),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("window_s", sa.Float(), nullable=False),
        sa.Column("before_sha256", sa.String(64), nullable=False),
        sa.Column("after_sha256", sa.String(64), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.Column("request_rate", sa.Float(), nullable=False),
        sa.Column("ttft_p90_observed_s", sa.Float(), nullable=True),
        sa.Column("ttft_p90_predicted_s", sa.Float(), nullable=True),
        sa.Column("itl_p90_observed_s", sa.Float(), nullable=True),
        sa.Column("itl_p90_predicted_s", sa.Float(), nullable=True),
    )
    op.create_index(
        "ix_deployment_observations_deployment_id",
        "deployment_observations",
        ["deployment_id", "id"],
    )


def downgrade() -> None:
    op.drop_index("ix_deployment_observations_deployment_id", "deployment_observations")
    op.drop_table("deployment_observations")
    op.drop_index("ix_deployments_project_id", "deployments")
    op.drop_table("deployments")
