"""every attainment with its load: the service's documents move to schema_version 3

A stored recommendation's figures (`predicted`, an Evaluation) held bare shares
(`attainment` at the trace's own rate, `sizing_attainment` at the sizing rate, and the
TTFT and TPOT shares at the trace's rate). They become `attainments`, each with the
load and the rate it was measured at, read from the job's stored result (its
`evaluated`: the trace's mean rate, the sizing rate, a closed loop's clients). The
shares alone at the sizing rate were never stored: they are unknown (null). A closed
loop's `out_of_step` range is dropped: no measured run supported it (docs/closed-loop.md);
a downgrade restores it as null. Progress
documents' `fewest_gpus` (a screen's estimate) becomes `screened_fewest_gpus`. Window
documents only change version. Finished jobs' results keep their layout (outcome
schema_version 4) and are served as stored.

Revision ID: 0140_attainment_loads
Revises: 0130_trace_plausibility
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0140_attainment_loads"
down_revision = "0130_trace_plausibility"
branch_labels = None
depends_on = None


def _load(value):
    return json.loads(value) if isinstance(value, str) else value


def _evaluated(bind, job_id) -> dict:
    """The `evaluated` part of the job's stored result ({} when there is none)."""
    jobs = sa.table("jobs", sa.column("id", sa.Integer), sa.column("result", sa.JSON))
    doc = _load(bind.execute(sa.select(jobs.c.result).where(jobs.c.id == job_id)).scalar())
    evaluated = doc.get("evaluated") if isinstance(doc, dict) else None
    return evaluated if isinstance(evaluated, dict) else {}


def _attainments(ev: dict, evaluated: dict) -> list[dict]:
    share = ev.get("attainment") or 0.0
    trace = {
        "share": share,
        "ttft_share": ev.get("ttft_attainment"),
        "tpot_share": ev.get("tpot_attainment"),
        "e2e_share": None,
    }
    # The rate the figures' run was offered: its goodput over its attainment.
    rate = (ev.get("request_goodput") or 0.0) / share if share > 0 else 0.0
    if evaluated.get("clients"):
        return [{"load": "clients", "rate": rate, **trace}]
    mean = (evaluated.get("trace") or {}).get("mean_rate") or rate
    sizing = evaluated.get("sizing_rate")
    out = [{"load": "trace", "rate": mean, **trace}]
    if sizing and sizing != mean and ev.get("sizing_attainment") is not None:
        at_sizing = {"share": ev["sizing_attainment"], "ttft_share": None, "tpot_share": None}
        out.insert(0, {"load": "sizing", "rate": sizing, **at_sizing, "e2e_share": None})
    return out


def _recommendation_v3(doc: dict, bind, job_id) -> dict:
    ev = dict(doc.get("predicted") or {})
    attainments = _attainments(ev, _evaluated(bind, job_id))
    for key in ("attainment", "ttft_attainment", "tpot_attainment", "sizing_attainment"):
        ev.pop(key, None)
    ev.update(attainments=attainments, limit=None)
    kept = {k: v for k, v in doc.items() if k != "out_of_step"}
    return {**kept, "schema_version": 3, "predicted": ev, "defaults": doc.get("trial") is None}


def _recommendation_v2(doc: dict, bind, job_id) -> dict:
    del bind, job_id
    ev = dict(doc.get("predicted") or {})
    attainments = ev.pop("attainments", None) or []
    ev.pop("limit", None)
    ev.pop("reject", None)
    by_load = {a.get("load"): a for a in attainments}
    own = by_load.get("trace") or by_load.get("clients") or {}
    sizing = by_load.get("sizing") or own
    ev.update(
        attainment=own.get("share") or 0.0,
        ttft_attainment=own.get("ttft_share") or 0.0,
        tpot_attainment=own.get("tpot_share") or 0.0,
        sizing_attainment=sizing.get("share") or 0.0,
    )
    out = {k: v for k, v in doc.items() if k != "defaults"}
    return {**out, "schema_version": 2, "predicted": ev, "out_of_step": None}


def _renamed(doc: dict, old: str, new: str, drop: tuple[str, ...] = ()) -> dict:
    """`doc` with key `old` named `new` (where it has it) and `drop` left out."""
    return {(new if k == old else k): v for k, v in doc.items() if k not in drop}


def _progress_v3(doc: dict, bind, job_id) -> dict:
    del bind, job_id
    return {**_renamed(doc, "fewest_gpus", "screened_fewest_gpus"), "schema_version": 3}


def _progress_v2(doc: dict, bind, job_id) -> dict:
    del bind, job_id
    old = _renamed(doc, "screened_fewest_gpus", "fewest_gpus", drop=("recommended_gpus",))
    if old.get("stage") == "done":  # a stage the old build did not report
        old["stage"] = "searching"
    return {**old, "schema_version": 2}


def _version(version: int):
    def convert(doc: dict, bind, job_id) -> dict:
        del bind, job_id
        return {**doc, "schema_version": version}

    return convert


def _rewrite(table: str, column: str, convert, from_version: int) -> None:
    bind = op.get_bind()
    has_job = table == "recommendations"
    columns = [sa.column("id", sa.Integer), sa.column(column, sa.JSON)]
    if has_job:
        columns.append(sa.column("job_id", sa.Integer))
    t = sa.table(table, *columns)
    selected = [t.c.id, t.c[column]] + ([t.c.job_id] if has_job else [])
    for row in bind.execute(sa.select(*selected)).all():
        doc = _load(row[1])
        if isinstance(doc, dict) and doc.get("schema_version") == from_version:
            new = convert(doc, bind, row[2] if has_job else None)
            bind.execute(t.update().where(t.c.id == row[0]).values({column: new}))


_DOCUMENTS = (
    ("jobs", "progress", _progress_v3, _progress_v2),
    ("jobs", "window", _version(3), _version(2)),
    ("recommendations", "recommendation", _recommendation_v3, _recommendation_v2),
    ("recommendations", "window", _version(3), _version(2)),
)


def upgrade() -> None:
    for table, column, to_new, _ in _DOCUMENTS:
        _rewrite(table, column, to_new, 2)


def downgrade() -> None:
    for table, column, _, to_old in _DOCUMENTS:
        _rewrite(table, column, to_old, 3)
