"""plan jobs: a job kind of its own, its plan linked to it, and schedules that plan

Revision ID: 0170_plan_jobs
Revises: 0160_plans

The jobs table keeps its columns: a job's `kind` says how its `params` and `progress`
documents read (a tuning job's as before). A plan job's result is its `plans` row,
which now names the job (`job_id`; None for `servetune plan`'s). A schedule's `plan`
(a `PlanRequest` document) makes it queue plan jobs instead of tuning jobs.
"""

import sqlalchemy as sa
from alembic import op

revision = "0170_plan_jobs"
down_revision = "0160_plans"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("plans") as b:
        b.add_column(sa.Column("job_id", sa.Integer(), nullable=True))
        b.create_foreign_key("fk_plans_job_id_jobs", "jobs", ["job_id"], ["id"], ondelete="CASCADE")
    op.create_index("ix_plans_job_id", "plans", ["job_id"], unique=True)
    with op.batch_alter_table("schedules") as b:
        b.add_column(sa.Column("plan", sa.JSON(), nullable=True))
    op.create_index("ix_jobs_project_kind_id", "jobs", ["project", "kind", "id"])


def downgrade() -> None:
    # Plan jobs, their plans and planning schedules have no place in the older layout.
    op.execute("DELETE FROM plans WHERE job_id IS NOT NULL")
    op.execute("DELETE FROM schedules WHERE plan IS NOT NULL AND CAST(plan AS TEXT) <> 'null'")
    op.execute("DELETE FROM jobs WHERE kind = 'plan'")
    op.drop_index("ix_jobs_project_kind_id", table_name="jobs")
    with op.batch_alter_table("schedules") as b:
        b.drop_column("plan")
    op.drop_index("ix_plans_job_id", table_name="plans")
    with op.batch_alter_table("plans") as b:
        b.drop_constraint("fk_plans_job_id_jobs", type_="foreignkey")
        b.drop_column("job_id")
