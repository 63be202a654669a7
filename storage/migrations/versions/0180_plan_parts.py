"""plan parts: a job may have a parent job (a plan's fleet replays run as jobs)

Revision ID: 0180_plan_parts
Revises: 0170_plan_jobs

A `plan_part` job replays one fleet of a plan job (its `params` a `PlanPart`
document, its `result` the `FleetReplay`); `parent_id` names the plan job. Existing jobs
have no parent. The column is added in place, without a foreign key: on SQLite a
constraint would mean rebuilding `jobs`, whose drop cascades to the rows that reference
it (recommendations, plans).
"""

import sqlalchemy as sa
from alembic import op

revision = "0180_plan_parts"
down_revision = "0170_plan_jobs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("parent_id", sa.Integer(), nullable=True))
    op.create_index("ix_jobs_parent_id", "jobs", ["parent_id", "id"])


def downgrade() -> None:
    # Parts have no place in the older layout.
    op.execute("DELETE FROM jobs WHERE kind = 'plan_part'")
    op.drop_index("ix_jobs_parent_id", table_name="jobs")
    op.drop_column("jobs", "parent_id")
