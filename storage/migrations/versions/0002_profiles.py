"""profile runs and kernel samples

Revision ID: 0002_profiles
Revises: 0001_traces
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_profiles"
down_revision = "0001_traces"
branch_labels = None
depends_on = None

_INT_COLUMNS = (
    ("num_repeats", sa.Integer()),
    ("tp", sa.Integer()),
    ("num_tokens", sa.BigInteger()),
    ("n", sa.BigInteger()),
    ("k", sa.BigInteger()),
    ("batch_size", sa.Integer()),
    ("q_len", sa.BigInteger()),
    ("kv_len", sa.BigInteger()),
    ("num_heads", sa.Integer()),
    ("num_kv_heads", sa.Integer()),
    ("head_dim", sa.Integer()),
    ("num_gpus", sa.Integer()),
    ("message_bytes", sa.BigInteger()),
)


def upgrade() -> None:
    op.create_table(
        "profile_runs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("accelerator", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("num_samples", sa.Integer(), nullable=False),
        sa.Column("device", sa.JSON(), nullable=False),
    )
    op.create_table(
        "kernel_samples",
        sa.Column(
            "run_id",
            sa.Integer(),
            sa.ForeignKey(
                "profile_runs.id", ondelete="CASCADE", name="fk_kernel_samples_run_id_profile_runs"
            ),
            primary_key=True,
        ),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("op", sa.String(32), nullable=False),
        sa.Column("median_ms", sa.Float(), nullable=False),
        sa.Column("p10_ms", sa.Float(), nullable=False),
        sa.Column("p90_ms", sa.Float(), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        *(sa.Column(name, kind, nullable=False) for name, kind in _INT_COLUMNS),
    )


def downgrade() -> None:
    op.drop_table("kernel_samples")
    op.drop_table("profile_runs")
