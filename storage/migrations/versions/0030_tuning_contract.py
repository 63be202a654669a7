"""one tuning contract: the service stores the search's own TuneRequest / TuneProgress /
Recommendation documents (schema_version 2)

Before, jobs and schedules held `TuningParams` (gpu, num_gpus), progress held
`JobProgress` (with an always-empty completed_trials) and recommendations a
summary (goodput_per_gpu, launch_commands, a flat `predicted` map); tuning runs
held the CLI's request (gpus, n_trials). This migration rewrites each stored
document in the new layout, in place, losing nothing the new layout can hold.
A recommendation's figures (the search's stand-in for the whole budget) become one
screened unit of that size; schedules re-tune on their whole window from now on (the
old hidden 600-request window stays on the jobs that ran with it). Finished jobs'
results keep their version-1 layout (they lack what a
`TuneOutcome` carries: the baseline's config, the diagnosis' phases) and are
served as stored.

Revision ID: 0030_tuning_contract
Revises: 0020_validation
"""

import json
import math

import sqlalchemy as sa
from alembic import op

revision = "0030_tuning_contract"
down_revision = "0020_validation"
branch_labels = None
depends_on = None

_EVALUATION_FIELDS = (
    "num_gpus", "price_per_hour", "goodput_per_gpu", "goodput_per_dollar",
    "interactivity_tok_s", "attainment", "request_goodput", "ttft_p50_ms", "ttft_p90_ms",
    "ttft_p99_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "itl_p99_ms",
    "num_simulations", "bounded", "error",
)  # fmt: skip


def _schedule_params_v2(old: dict) -> dict:
    """A schedule re-tunes from now on: on the whole window, not the old hidden 600."""
    return {**_params_v2(old), "max_requests": None}


def _params_v2(old: dict) -> dict:
    return {
        "schema_version": 2,
        "model": old["model"],
        "gpu_types": [old["gpu"]],
        "gpu_budget": old.get("num_gpus", 8),
        "slo_ttft_ms": old["slo_ttft_ms"],
        "slo_tpot_ms": old["slo_tpot_ms"],
        "trace_id": old.get("trace_id"),
        "stream": old.get("stream"),
        "window_s": old.get("window_s", 3600.0),
        "slo_e2e_ms": None,
        "attainment": old.get("attainment", 0.9),
        "num_trials": old.get("num_trials", 50),
        "seed": old.get("seed", 0),
        "search_space": {},
        "max_requests": 600,
    }


def _params_v1(new: dict) -> dict:
    return {
        "schema_version": 1,
        "model": new["model"],
        "gpu": new["gpu_types"][0],
        "slo_ttft_ms": new["slo_ttft_ms"],
        "slo_tpot_ms": new["slo_tpot_ms"],
        "trace_id": new.get("trace_id"),
        "stream": new.get("stream"),
        "window_s": new.get("window_s", 3600.0),
        "num_gpus": new["gpu_budget"],
        "attainment": new.get("attainment", 0.9),
        "num_trials": new.get("num_trials", 50),
        "seed": new.get("seed", 0),
    }


def _request_v2(old: dict) -> dict:
    """The CLI's version-1 TuneRequest (gpus, n_trials) in version 2."""
    renames = {"gpus": "gpu_types", "n_trials": "num_trials"}
    new = {renames.get(k, k): v for k, v in old.items()}
    new.update(schema_version=2, stream=None, window_s=3600.0)
    return new


def _request_v1(new: dict) -> dict:
    renames = {"gpu_types": "gpus", "num_trials": "n_trials"}
    old = {renames.get(k, k): v for k, v in new.items() if k not in ("stream", "window_s")}
    old["schema_version"] = 1
    return old


def _progress_v2(old: dict) -> dict:
    return {
        "schema_version": 2,
        "trials_done": old["trials_done"],
        "trials_total": old["trials_total"],
        "best_goodput_per_gpu": old.get("best_goodput_per_gpu"),
        "eta_s": old.get("eta_s"),
    }


def _progress_v1(new: dict) -> dict:
    return {**new, "schema_version": 1, "message": "", "completed_trials": []}


def _version(doc: dict, version: int) -> dict:
    return {**doc, "schema_version": version}


def _recommendation_v2(old: dict) -> dict:
    predicted = old.get("predicted") or {}
    evaluation = {k: predicted.get(k) for k in _EVALUATION_FIELDS}
    evaluation.update(
        status="feasible",
        num_gpus=old.get("num_gpus", evaluation["num_gpus"]),
        goodput_per_gpu=old.get("goodput_per_gpu", evaluation["goodput_per_gpu"]),
        interactivity_tok_s=old.get("interactivity_tok_s", evaluation["interactivity_tok_s"]),
        num_simulations=evaluation["num_simulations"] or 0,
        bounded=True if evaluation["bounded"] is None else bool(evaluation["bounded"]),
        error=evaluation["error"] or "",
    )
    for key in ("attainment", "request_goodput"):
        if evaluation[key] is None:
            evaluation[key] = 0.0
    # The old figures were the search's stand-in for the whole budget: one unit of it.
    evaluation.update(
        stage="screened",
        num_units=1,
        unit_gpus=evaluation["num_gpus"] or 0,
        unit_rate=float(predicted.get("max_rate") or 0.0),
    )
    checks = [
        {"metric": k[len("slo_") :], "predicted": predicted.get(k[len("slo_") :]), "target": v}
        for k, v in predicted.items()
        if k.startswith("slo_")
    ]
    launch = []
    for c in old.get("launch_commands", ()):
        role, _, times = str(c["role"]).partition(" ×")
        launch.append(
            {
                "engine": c["engine"],
                "role": role,
                "count": int(times) if times.isdigit() else 1,
                "command": c["command"],
            }
        )
    return {
        "schema_version": 2,
        "trial": old.get("trial"),
        "config": old.get("config") or {},
        "predicted": evaluation,
        "slo_checks": checks,
        "launch": launch,
    }


def _recommendation_v1(new: dict) -> dict:
    ev = new["predicted"]
    predicted = {
        k: float(v)
        for k, v in ev.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    predicted.update({f"slo_{c['metric']}": c["target"] for c in new.get("slo_checks", ())})
    return {
        "schema_version": 1,
        "trial": new.get("trial"),
        "goodput_per_gpu": ev.get("goodput_per_gpu") or 0.0,
        "interactivity_tok_s": ev.get("interactivity_tok_s") or 0.0,
        "num_gpus": ev.get("num_gpus") or 0,
        "predicted": predicted,
        "launch_commands": [
            {
                "engine": c["engine"],
                "role": c["role"] if c["count"] == 1 else f"{c['role']} ×{c['count']}",
                "command": c["command"],
            }
            for c in new.get("launch", ())
        ],
        "config": new.get("config") or {},
    }


def _load(value):
    return json.loads(value) if isinstance(value, str) else value


def _rewrite(table: str, column: str, convert, from_version: int) -> None:
    bind = op.get_bind()
    meta = sa.MetaData()
    t = sa.Table(
        table, meta, sa.Column("id", sa.Integer, primary_key=True), sa.Column(column, sa.JSON)
    )
    for row_id, doc in bind.execute(sa.select(t.c.id, t.c[column])).all():
        doc = _load(doc)
        if isinstance(doc, dict) and doc.get("schema_version", 1) == from_version:
            bind.execute(t.update().where(t.c.id == row_id).values({column: convert(doc)}))


_DOCUMENTS = (
    ("jobs", "params", _params_v2, _params_v1),
    ("jobs", "progress", _progress_v2, _progress_v1),
    ("jobs", "window", lambda d: _version(d, 2), lambda d: _version(d, 1)),
    ("schedules", "params", _schedule_params_v2, _params_v1),
    ("recommendations", "recommendation", _recommendation_v2, _recommendation_v1),
    ("recommendations", "window", lambda d: _version(d, 2), lambda d: _version(d, 1)),
    ("tuning_runs", "request", _request_v2, _request_v1),
)


def upgrade() -> None:
    for table, column, to_new, _ in _DOCUMENTS:
        _rewrite(table, column, to_new, 1)


def downgrade() -> None:
    for table, column, _, to_old in _DOCUMENTS:
        _rewrite(table, column, to_old, 2)
