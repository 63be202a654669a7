"""Migration 0140: stored recommendations' bare attainments become attainments with the
load and rate they were measured at (read from the job's stored result), progress's
screened estimate is named so; downgrading restores the documents as they were."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import command

from optimizer.search.attainment import Load
from storage.db import _alembic_config, make_engine, session_scope, upgrade_database
from storage.jobs import get_job
from storage.recommendations import latest_recommendation

BEFORE = "0130_trace_plausibility"
CONFIG = {
    "model": "llama-3.1-8b", "mode": "colocated",
    "replica": {"accelerator": "h100", "tp": 1, "max_num_batched_tokens": 8192,
                "max_num_seqs": 1024},
    "num_replicas": 2,
}  # fmt: skip
OLD_PREDICTED = {
    "status": "feasible", "stage": "verified", "num_gpus": 2, "num_units": 2, "unit_gpus": 1,
    "price_per_hour": None, "unit_rate": 3.0, "goodput_per_gpu": 3.0,
    "goodput_per_dollar": None, "interactivity_tok_s": 40.0, "attainment": 0.98,
    "ttft_attainment": 0.99, "tpot_attainment": 0.985, "sizing_attainment": 0.91,
    "request_goodput": 4.9, "output_tokens_per_s": 300.0,
    "cost_per_million_output_tokens": None, "ttft_p50_ms": 100.0, "ttft_p90_ms": 400.0,
    "ttft_p99_ms": 900.0, "tpot_p50_ms": 20.0, "tpot_p90_ms": 30.0, "tpot_p99_ms": 40.0,
    "itl_p99_ms": 60.0, "num_simulations": 3, "bounded": True, "error": "",
}  # fmt: skip
OLD_RECOMMENDATION = {
    "schema_version": 2, "trial": 4, "config": CONFIG, "predicted": OLD_PREDICTED,
    "slo_checks": [{"metric": "ttft_p90_ms", "predicted": 400.0, "target": 2000.0}],
    "launch": [], "out_of_step": None,
}  # fmt: skip
OLD_PROGRESS = {
    "schema_version": 2, "trials_done": 5, "trials_total": 5, "best_goodput_per_gpu": 3.0,
    "eta_s": None, "fewest_gpus": 2, "stage": "searching",
}  # fmt: skip
OLD_WINDOW = {
    "schema_version": 2, "trace_ids": [1], "num_requests": 100, "mean_rate": 5.0,
    "input_mean": 900.0, "input_p90": 2000.0, "output_mean": 200.0, "output_p90": 400.0,
}  # fmt: skip
# The job's stored result (an outcome of schema_version 4): its rates.
RESULT = {
    "schema_version": 4,
    "evaluated": {"trace": {"num_requests": 100, "start_s": 0.0, "span_s": 20.0,
                            "mean_rate": 5.0},
                  "sizing_rate": 7.5, "peak_rate": 7.5, "clients": 0},
}  # fmt: skip
PARAMS = {
    "schema_version": 2, "model": "llama-3.1-8b", "gpu_types": ["h100"], "gpu_budget": 4,
    "slo_ttft_ms": 2000.0, "slo_tpot_ms": 50.0, "trace_id": 1,
}  # fmt: skip


def _seed(url: str) -> None:
    upgrade_database(url, BEFORE)
    now = datetime.now(UTC)
    engine = make_engine(url)
    meta = sa.MetaData()
    meta.reflect(engine, only=["jobs", "recommendations"])
    with engine.begin() as conn:
        conn.execute(
            meta.tables["jobs"].insert(),
            {
                "id": 1, "project": "p", "kind": "tuning", "status": "succeeded",
                "params": PARAMS, "window": OLD_WINDOW, "progress": OLD_PROGRESS,
                "result": RESULT, "created_at": now, "attempts": 1, "cancel_requested": False,
            },
        )  # fmt: skip
        conn.execute(
            meta.tables["recommendations"].insert(),
            {
                "id": 1, "project": "p", "job_id": 1, "source": "trace:1",
                "model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 4, "slo_ttft_ms": 2000.0,
                "slo_tpot_ms": 50.0, "attainment": 0.9, "created_at": now,
                "recommendation": OLD_RECOMMENDATION, "window": OLD_WINDOW,
            },
        )  # fmt: skip
    engine.dispose()


def test_each_stored_attainment_gets_its_load_and_rate(db_url: str) -> None:
    _seed(db_url)
    upgrade_database(db_url)
    engine = make_engine(db_url)
    with session_scope(engine) as s:
        info = latest_recommendation(s, project="p")
        job = get_job(s, 1)
    engine.dispose()
    ev = info.recommendation.predicted
    sizing, trace = ev.attainments
    assert (sizing.load, sizing.rate, sizing.share) == (Load.SIZING, 7.5, 0.91)
    assert math.isnan(sizing.ttft_share)  # never stored at the sizing rate: unknown
    assert (trace.load, trace.rate, trace.share) == (Load.TRACE, 5.0, 0.98)
    assert (trace.ttft_share, trace.tpot_share) == (0.99, 0.985)
    assert ev.attainment is sizing  # the deciding (lowest) one
    assert info.gpu_budget == 4 and info.attainment_target == 0.9
    assert info.recommendation.trial == 4 and not info.recommendation.defaults
    assert job.progress.screened_fewest_gpus == 2 and job.window.trace_ids == (1,)


def test_downgrade_restores_the_documents(db_url: str) -> None:
    _seed(db_url)
    upgrade_database(db_url)
    command.downgrade(_alembic_config(db_url), BEFORE)
    engine = make_engine(db_url)
    meta = sa.MetaData()
    meta.reflect(engine, only=["jobs", "recommendations"])
    with engine.connect() as conn:
        progress, window = conn.execute(
            sa.select(meta.tables["jobs"].c.progress, meta.tables["jobs"].c.window)
        ).one()
        rec = conn.execute(sa.select(meta.tables["recommendations"].c.recommendation)).scalar()
    engine.dispose()
    assert progress == OLD_PROGRESS and window == OLD_WINDOW
    assert rec == OLD_RECOMMENDATION
