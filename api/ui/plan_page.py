"""The plan job page, rendered on the server as the tuning job page is (`api.ui.render`'s
document, sections and tables): the job's status and step, then its plan's own lines and
tables as `servetune plan` prints them (`optimizer.plan.tables`), the picture as inline
SVG (`optimizer.plan.report`: demand and GPUs over time, attainment per window) and the
reactive policy's KEDA ScaledObject. A plan of another schema version is not read: the
page says so and links the JSON. No script.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from api.ui.render import (
    REFRESH_S,
    _document,
    _e,
    _section,
    _table,
    _text_table,
    forget_form,
)
from optimizer.plan import FleetPlan, PlanError, PlanProgress, keda_yaml
from optimizer.plan.outcome import PLAN_SCHEMA_VERSION
from optimizer.plan.report import attainment_svg, demand_svg
from optimizer.plan.tables import (
    capacity_table,
    fleets_table,
    headline,
    lower_bound_lines,
    policy_lines,
    windows_table,
)
from storage.service_records import JobInfo

# The picture's legend and labels (optimizer.plan.report's classes).
_PICTURE_CSS = (
    "<style>.picture svg{width:100%;height:auto}.picture svg text{font-size:11px}"
    ".picture .key{margin-right:14px;font-size:13px}.picture .key i{display:inline-block;"
    "width:14px;height:4px;margin-right:5px;vertical-align:middle}</style>"
)


@dataclass(frozen=True, slots=True)
class StoredPlan:
    """A plan job's stored plan: read (`plan`), or why it is not (`note`)."""

    plan: FleetPlan | None
    note: str


def read_plan(text: str | None) -> StoredPlan | None:
    """The stored plan document as this build reads it (None: the job has none)."""
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        return StoredPlan(None, f"The stored plan is not readable JSON ({exc}).")
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != PLAN_SCHEMA_VERSION:
        return StoredPlan(
            None,
            f"This plan was written by another servetune (plan schema_version {version!r}; "
            f"this build reads version {PLAN_SCHEMA_VERSION}), so this page cannot summarise "
            "it. Its JSON is kept as it was stored: see the link below.",
        )
    try:
        return StoredPlan(FleetPlan.from_dict(data), "")
    except PlanError as exc:
        return StoredPlan(None, f"The stored plan could not be read: {exc}.")


def _progress(job: JobInfo) -> str:
    p = job.progress
    step = (
        f"step {p.steps_done}: {p.stage}" if isinstance(p, PlanProgress) else "waiting for a worker"
    )
    parts = []
    if job.trigger_reason:
        parts.append(f"fired by schedule: {job.trigger_reason}")
    if not job.status.finished:
        parts.append(f"this page reloads every {REFRESH_S} s until the plan is made")
    r = job.params
    asked = (
        f"{r.model} on {r.gpu}, TTFT <= {r.slo_ttft_ms:g} ms and TPOT <= {r.slo_tpot_ms:g} ms "
        f"for {r.attainment:.0%} of requests, windows of {r.window_s:g} s, at most "
        f"{r.gpu_budget} GPUs"
    )
    body = [
        f'<p><span id="status" class="status {_e(job.status.value)}">{_e(job.status.value)}'
        f'</span> <span id="progress-text" class="muted">{_e(step)}</span></p>',
        f'<p id="progress-detail" class="muted">{" · ".join(_e(x) for x in parts)}</p>',
        f'<p id="asked" class="muted">{_e(asked)}</p>',
    ]
    if job.error:
        body.append(f'<p id="error" class="err">{_e(job.error)}</p>')
    return _section("progress-card", "Progress", "\n".join(body))


def _figures(plan: FleetPlan) -> str:
    """The lower bound in replicas (units) and GPUs."""
    lb = plan.lower_bound
    dollars = "-" if lb.dollars is None else f"${lb.dollars:,.0f}"
    rows = [
        ("peak units", str(max(lb.units))),
        ("mean units (time-weighted)", f"{lb.mean_gpus / lb.unit_gpus:,.2f}"),
        ("peak GPUs", str(lb.peak_gpus)),
        ("mean GPUs", f"{lb.mean_gpus:,.2f}"),
        ("GPU-hours", f"{lb.gpu_hours:,.1f}"),
        ("$", dollars),
    ]
    return _table(("figure", "value"), ((_e(k), _e(v)) for k, v in rows), id_="lower-bound")


def _lines(lines: tuple[str, ...], id_: str) -> str:
    return f'<div id="{id_}">' + "".join(f"<p>{_e(line)}</p>" for line in lines) + "</div>"


def _titled(table, id_: str) -> str:
    note = f'<p class="muted">{_e(table.note)}</p>' if table.note else ""
    return _section(f"{id_}-card", table.title, _text_table(table, id_) + note)


def _plan(plan: FleetPlan) -> str:
    out = [_section("headline-card", "Plan", _lines(headline(plan), "headline"))]
    out.append(_titled(capacity_table(plan), "capacity"))
    lower = _lines(lower_bound_lines(plan), "lower-bound-lines") + _figures(plan)
    out.append(_section("lower-bound-card", "(b) Lower bound", lower))
    out.append(_titled(fleets_table(plan), "fleets"))
    picture = (
        f'{_PICTURE_CSS}<div class="picture" id="demand">{demand_svg(plan)}</div>'
        "<h3>Attainment per window</h3>"
        f'<div class="picture" id="attainment">{attainment_svg(plan)}</div>'
    )
    out.append(_section("picture-card", "(d) Demand and GPUs over time", picture))
    per_window = windows_table(plan)
    if per_window is not None:
        out.append(_titled(per_window, "windows"))
    yaml_text = keda_yaml(plan.policy, plan.unit.config)
    policy = _lines(policy_lines(plan), "policy") + f'<pre id="keda">{_e(yaml_text)}</pre>'
    out.append(_section("policy-card", "(e) Reactive policy: KEDA ScaledObject", policy))
    return "".join(out)


def plan_page(job: JobInfo, stored: StoredPlan | None) -> str:
    """The whole page of plan job `job` (`stored`: its plan, None while it has none)."""
    parts = [_progress(job)]
    json_link = (
        f'<p class="muted">The plan as JSON: <a id="json-link" href="/ui/plans/{job.id}'
        f"/result.json\">result.json</a> (the API's <code>GET /v1/plans/{job.id}/result"
        "</code>).</p>"
    )
    if stored is not None and stored.plan is None:
        body = f'<p id="old-result" class="err">{_e(stored.note)}</p>\n{json_link}'
        parts.append(_section("result-note", "Plan", body))
    elif stored is not None and stored.plan is not None:
        parts.append(_plan(stored.plan))
        parts.append(f'<section id="json">{json_link}</section>\n')
    return _document(
        f"plan job {job.id}",
        "".join(parts),
        refresh=not job.status.finished,
        forget=forget_form(f"/ui/plans/{job.id}"),
    )
