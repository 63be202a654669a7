"""a tuning run may have no trace: a closed-loop benchmark (vllm bench serve
--max-concurrency) is tuned from its parameters, kept in the run's request

Revision ID: 0060_tuning_run_without_trace
Revises: 0050_profile_op_summary
"""

import sqlalchemy as sa
from alembic import op

revision = "0060_tuning_run_without_trace"
down_revision = "0050_profile_op_summary"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tuning_runs") as batch:
        batch.alter_column("trace_id", existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM tuning_runs WHERE trace_id IS NULL")
    with op.batch_alter_table("tuning_runs") as batch:
        batch.alter_column("trace_id", existing_type=sa.Integer(), nullable=False)
