"""service: project-scoped trace streams, API keys, job queue, schedules, recommendations

Revision ID: 0004_service
Revises: 0003_latency_models
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_service"
down_revision = "0003_latency_models"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("traces") as batch:
        batch.add_column(
            sa.Column("project", sa.String(100), nullable=False, server_default="default")
        )
        batch.add_column(sa.Column("stream", sa.String(200), nullable=True))
        batch.drop_constraint("uq_traces_content_hash", type_="unique")
        batch.create_unique_constraint(
            "uq_traces_project_content_hash", ["project", "content_hash"]
        )
        batch.create_index("ix_traces_project_stream_created", ["project", "stream", "created_at"])
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("project", sa.String(100), nullable=False, index=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("revoked_at", TZ, nullable=True),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("project", sa.String(100), nullable=False, index=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("window", sa.JSON(), nullable=True),
        sa.Column("progress", sa.JSON(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("started_at", TZ, nullable=True),
        sa.Column("finished_at", TZ, nullable=True),
        sa.Column("lease_owner", sa.String(200), nullable=True),
        sa.Column("lease_expires_at", TZ, nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("schedule_id", sa.Integer(), nullable=True),
        sa.Column("trigger_reason", sa.Text(), nullable=True),
    )
    op.create_index("ix_jobs_status_lease", "jobs", ["status", "lease_expires_at"])
    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("project", sa.String(100), nullable=False, index=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("interval_s", sa.Float(), nullable=True),
        sa.Column("cron", sa.String(200), nullable=True),
        sa.Column("trigger", sa.String(16), nullable=False),
        sa.Column("drift_threshold", sa.Float(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("next_run_at", TZ, nullable=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("last_run_at", TZ, nullable=True),
        sa.Column("last_decision", sa.String(16), nullable=True),
        sa.Column("last_reason", sa.Text(), nullable=True),
        sa.Column("last_job_id", sa.Integer(), nullable=True),
        sa.Column("num_fired", sa.Integer(), nullable=False),
    )
    op.create_index("ix_schedules_due", "schedules", ["paused", "next_run_at"])
    op.create_table(
        "recommendations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("project", sa.String(100), nullable=False),
        sa.Column(
            "job_id",
            sa.Integer(),
            sa.ForeignKey("jobs.id", ondelete="CASCADE", name="fk_recommendations_job_id_jobs"),
            nullable=False,
        ),
        sa.Column("source", sa.String(220), nullable=False),
        sa.Column("model", sa.String(100), nullable=False),
        sa.Column("gpu", sa.String(100), nullable=False),
        sa.Column("num_gpus", sa.Integer(), nullable=False),
        sa.Column("slo_ttft_ms", sa.Float(), nullable=False),
        sa.Column("slo_tpot_ms", sa.Float(), nullable=False),
        sa.Column("attainment", sa.Float(), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("recommendation", sa.JSON(), nullable=False),
        sa.Column("window", sa.JSON(), nullable=True),
    )
    op.create_index(
        "ix_recommendations_lookup", "recommendations", ["project", "source", "created_at"]
    )


def downgrade() -> None:
    op.drop_table("recommendations")
    op.drop_table("schedules")
    op.drop_index("ix_jobs_status_lease", table_name="jobs")
    op.drop_table("jobs")
    op.drop_table("api_keys")
    with op.batch_alter_table("traces") as batch:
        batch.drop_index("ix_traces_project_stream_created")
        batch.drop_constraint("uq_traces_project_content_hash", type_="unique")
        batch.create_unique_constraint("uq_traces_content_hash", ["content_hash"])
        batch.drop_column("stream")
        batch.drop_column("project")
