"""table engines: whose kernels a profile run's tables and a latency model time

Revision ID: 0190_table_engines
Revises: 0180_plan_parts

`profile_runs.engine` and `latency_models.engine`: "vllm", "sglang" or "trtllm" for
AIConfigurator's tables (each engine's own folder), "" for tables of no serving engine
(servetune's profiler, Vidur's). A deployment is priced by the tables of the engine it
runs (`api.services.latency`). Existing AIConfigurator runs were imported from vLLM's
folders, unless their default name says SGLang's or TensorRT-LLM's
("aiconfigurator-core 0.12.0: h100_sxm sglang"); a model takes its run's engine.
"""

import sqlalchemy as sa
from alembic import op

revision = "0190_table_engines"
down_revision = "0180_plan_parts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("profile_runs", "latency_models"):
        op.add_column(table, sa.Column("engine", sa.String(16), nullable=False, server_default=""))
    op.execute(
        "UPDATE profile_runs SET engine = CASE "
        "WHEN name LIKE '% sglang' THEN 'sglang' WHEN name LIKE '% trtllm' THEN 'trtllm' "
        "ELSE 'vllm' END WHERE source = 'aiconfigurator'"
    )
    op.execute(
        "UPDATE latency_models SET engine = (SELECT p.engine FROM profile_runs p "
        "WHERE p.id = latency_models.profile_run_id) "
        "WHERE profile_run_id IS NOT NULL AND EXISTS "
        "(SELECT 1 FROM profile_runs p WHERE p.id = latency_models.profile_run_id)"
    )


def downgrade() -> None:
    for table in ("latency_models", "profile_runs"):
        op.drop_column(table, "engine")
