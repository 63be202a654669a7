"""the deployment loop: observed windows kept, per-deployment calibrations, and schedules
over a deployment

Revision ID: 0120_deployment_loop
Revises: 0110_deployments
"""

import sqlalchemy as sa
from alembic import op

revision = "0120_deployment_loop"
down_revision = "0110_deployments"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("deployment_observations") as b:
        b.add_column(sa.Column("window", sa.JSON(), nullable=True))  # ObservedWindow.to_dict()
        b.add_column(sa.Column("calibration_id", sa.Integer(), nullable=True))
    op.create_table(
        "deployment_calibrations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "deployment_id",
            sa.Integer(),
            sa.ForeignKey(
                "deployments.id",
                ondelete="CASCADE",
                name="fk_deployment_calibrations_deployment_id_deployments",
            ),
            nullable=False,
        ),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("fitted_on", sa.Integer(), nullable=False),  # an observation id
        sa.Column("checked_on", sa.Integer(), nullable=True),  # a later observation id
        sa.Column("overhead_s", sa.Float(), nullable=False),
        sa.Column("prefill_scale", sa.Float(), nullable=False),
        sa.Column("decode_scale", sa.Float(), nullable=False),
        sa.Column("fit", sa.JSON(), nullable=False),  # WindowFit.to_dict()
    )
    op.create_index(
        "ix_deployment_calibrations_deployment_id",
        "deployment_calibrations",
        ["deployment_id", "id"],
    )
    with op.batch_alter_table("schedules") as b:
        b.add_column(sa.Column("deployment_id", sa.Integer(), nullable=True))
        b.add_column(sa.Column("error_threshold", sa.Float(), nullable=True))
        b.add_column(sa.Column("baseline_observation_id", sa.Integer(), nullable=True))
        b.create_foreign_key(
            "fk_schedules_deployment_id_deployments",
            "deployments",
            ["deployment_id"],
            ["id"],
            ondelete="CASCADE",
        )


def downgrade() -> None:
    with op.batch_alter_table("schedules") as b:
        b.drop_constraint("fk_schedules_deployment_id_deployments", type_="foreignkey")
        b.drop_column("baseline_observation_id")
        b.drop_column("error_threshold")
        b.drop_column("deployment_id")
    op.drop_index("ix_deployment_calibrations_deployment_id", "deployment_calibrations")
    op.drop_table("deployment_calibrations")
    with op.batch_alter_table("deployment_observations") as b:
        b.drop_column("calibration_id")
        b.drop_column("window")
