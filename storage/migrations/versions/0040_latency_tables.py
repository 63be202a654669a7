"""compiled latency tables: a cache shared by every process and machine on the database

Revision ID: 0040_latency_tables
Revises: 0030_tuning_contract
"""

import sqlalchemy as sa
from alembic import op

revision = "0040_latency_tables"
down_revision = "0030_tuning_contract"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "latency_tables",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("key", sa.String(400), nullable=False),
        sa.Column(
            "latency_model_id",
            sa.Integer(),
            sa.ForeignKey(
                "latency_models.id",
                ondelete="CASCADE",
                name="fk_latency_tables_latency_model_id_latency_models",
            ),
            nullable=True,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("num_bytes", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.UniqueConstraint("key", name="uq_latency_tables_key"),
    )
    op.create_index("ix_latency_tables_latency_model_id", "latency_tables", ["latency_model_id"])


def downgrade() -> None:
    op.drop_index("ix_latency_tables_latency_model_id", table_name="latency_tables")
    op.drop_table("latency_tables")
