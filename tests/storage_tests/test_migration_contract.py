"""Migration 0030: documents stored before the one tuning contract are rewritten in place
(jobs, schedules, recommendations, tuning runs) and read back by today's code."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import command

from optimizer.search import TuneRequest
from storage.db import _alembic_config, make_engine, session_scope, upgrade_database
from storage.jobs import get_job, get_result
from storage.recommendations import latest_recommendation
from storage.schedules import get_schedule
from storage.tuning import get_tuning_run

OLD_PARAMS = {
    "schema_version": 1, "model": "llama-3.1-8b", "gpu": "h100", "slo_ttft_ms": 2000.0,
    "slo_tpot_ms": 50.0, "trace_id": None, "stream": "prod", "window_s": 600.0, "num_gpus": 4,
    "attainment": 0.9, "num_trials": 20, "seed": 3,
}  # fmt: skip
OLD_PROGRESS = {
    "schema_version": 1, "trials_done": 5, "trials_total": 20, "best_goodput_per_gpu": 1.5,
    "eta_s": 12.0, "message": "", "completed_trials": [],
}  # fmt: skip
OLD_WINDOW = {
    "schema_version": 1, "trace_ids": [1, 2], "num_requests": 100, "mean_rate": 2.0,
    "input_mean": 900.0, "input_p90": 2000.0, "output_mean": 200.0, "output_p90": 400.0,
}  # fmt: skip
CONFIG = {
    "model": "llama-3.1-8b", "mode": "colocated",
    "replica": {"accelerator": "h100", "tp": 1, "max_num_batched_tokens": 8192,
                "max_num_seqs": 1024},
    "num_replicas": 4,
}  # fmt: skip
OLD_RECOMMENDATION = {
    "schema_version": 1, "trial": 7, "goodput_per_gpu": 2.5, "interactivity_tok_s": 40.0,
    "num_gpus": 4,
    "predicted": {"ttft_p90_ms": 850.0, "tpot_p90_ms": 31.0, "attainment": 0.95,
                  "max_rate": 10.0, "slo_ttft_p90_ms": 2000.0, "slo_tpot_p90_ms": 50.0},
    "launch_commands": [
        {"engine": "vllm", "role": "replica ×4", "command": "vllm serve m"},
        {"engine": "sglang", "role": "replica ×4", "command": "python -m sglang.launch_server"},
    ],
    "config": CONFIG,
}  # fmt: skip
OLD_RESULT = {"schema_version": 1, "pareto": [], "recommendation": None, "num_trials": 20}
OLD_REQUEST = {
    "schema_version": 1, "trace_id": 1, "model": "llama-3.1-8b", "gpus": ["h100"],
    "gpu_budget": 8, "slo_ttft_ms": 2000.0, "slo_tpot_ms": 50.0, "slo_e2e_ms": None,
    "attainment": 0.9, "n_trials": 40, "seed": 0, "search_space": {"tp": [1, 2]},
    "max_requests": 600,
}  # fmt: skip


def _seed_version_1(url: str) -> None:
    upgrade_database(url, "0020_validation")
    now = datetime.now(UTC)
    engine = make_engine(url)
    meta = sa.MetaData()
    meta.reflect(engine, only=["jobs", "schedules", "recommendations", "tuning_runs"])
    with engine.begin() as conn:
        conn.execute(
            meta.tables["jobs"].insert(),
            {
                "id": 1, "project": "p", "kind": "tuning", "status": "succeeded",
                "params": OLD_PARAMS, "window": OLD_WINDOW, "progress": OLD_PROGRESS,
                "result": OLD_RESULT, "created_at": now, "attempts": 1, "cancel_requested": False,
            },
        )  # fmt: skip
        conn.execute(
            meta.tables["schedules"].insert(),
            {
                "id": 1, "project": "p", "name": "s", "params": OLD_PARAMS, "interval_s": 60.0,
                "trigger": "always", "drift_threshold": 0.2, "paused": False, "created_at": now,
                "num_fired": 0,
            },
        )  # fmt: skip
        conn.execute(
            meta.tables["recommendations"].insert(),
            {
                "id": 1, "project": "p", "job_id": 1, "source": "stream:prod",
                "model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 4, "slo_ttft_ms": 2000.0,
                "slo_tpot_ms": 50.0, "attainment": 0.9, "created_at": now,
                "recommendation": OLD_RECOMMENDATION, "window": OLD_WINDOW,
            },
        )  # fmt: skip
        conn.execute(
            meta.tables["tuning_runs"].insert(),
            {
                "id": 1, "study_name": "old-study", "trace_id": 1, "model": "llama-3.1-8b",
                "status": "done", "request": OLD_REQUEST, "search_space": {},
                "latency_label": "roofline", "created_at": now, "updated_at": now,
            },
        )  # fmt: skip
    engine.dispose()


def test_old_documents_are_rewritten_and_read_back(db_url: str) -> None:
    _seed_version_1(db_url)
    upgrade_database(db_url)
    engine = make_engine(db_url)
    with session_scope(engine) as s:
        job = get_job(s, 1)
        schedule = get_schedule(s, 1)
        rec = latest_recommendation(s, project="p")
        run = get_tuning_run(s, "old-study")
        result = get_result(s, 1)
    engine.dispose()
    assert job.params.gpu_types == ("h100",) and job.params.gpu_budget == 4
    assert job.params.stream == "prod" and job.params.num_trials == 20 and job.params.seed == 3
    assert job.progress.trials_done == 5 and job.progress.best_goodput_per_gpu == 1.5
    assert job.window.trace_ids == (1, 2)
    # The job ran on the old hidden 600-request window; the schedule re-tunes on the whole
    # trace from now on.
    assert job.params.max_requests == 600 and schedule.params.max_requests is None
    assert replace(schedule.params, max_requests=600) == job.params
    r = rec.recommendation
    assert r.trial == 7 and r.config.num_replicas == 4 and r.predicted.goodput_per_gpu == 2.5
    # The old figures were the search's stand-in for the whole budget: one screened unit.
    assert r.predicted.stage.value == "screened" and r.predicted.num_units == 1
    assert [(c.metric, c.predicted, c.target) for c in r.slo_checks] == [
        ("ttft_p90_ms", 850.0, 2000.0),
        ("tpot_p90_ms", 31.0, 50.0),
    ]
    assert [(c.engine, c.role, c.count) for c in r.launch] == [
        ("vllm", "replica", 4),
        ("sglang", "replica", 4),
    ]
    assert TuneRequest.from_dict(run.request).num_trials == 40
    assert result.outcome == OLD_RESULT  # finished results are kept as they were stored


def test_downgrade_restores_the_old_documents(db_url: str) -> None:
    _seed_version_1(db_url)
    upgrade_database(db_url)
    command.downgrade(_alembic_config(db_url), "0020_validation")
    engine = make_engine(db_url)
    meta = sa.MetaData()
    meta.reflect(engine, only=["jobs", "tuning_runs"])
    with engine.connect() as conn:
        params, progress = conn.execute(
            sa.select(meta.tables["jobs"].c.params, meta.tables["jobs"].c.progress)
        ).one()
        request = conn.execute(sa.select(meta.tables["tuning_runs"].c.request)).scalar_one()
    engine.dispose()
    assert params == OLD_PARAMS and progress == OLD_PROGRESS
    assert request == {**OLD_REQUEST, "schema_version": 1}
