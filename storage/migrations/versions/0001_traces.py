"""traces and trace requests

Revision ID: 0001_traces
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001_traces"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "traces",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("source_format", sa.String(32), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("num_requests", sa.Integer(), nullable=False),
        sa.Column("stats", sa.JSON(), nullable=False),
        sa.UniqueConstraint("content_hash", name="uq_traces_content_hash"),
    )
    op.create_table(
        "trace_requests",
        sa.Column(
            "trace_id",
            sa.Integer(),
            sa.ForeignKey(
                "traces.id", ondelete="CASCADE", name="fk_trace_requests_trace_id_traces"
            ),
            primary_key=True,
        ),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("arrival_s", sa.Float(), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("prefix_hashes", sa.LargeBinary(), nullable=True),
        sa.Column("session_id", sa.String(128), nullable=True),
        sa.Column("acceptance_length", sa.Float(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("trace_requests")
    op.drop_table("traces")
