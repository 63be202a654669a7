"""The tuning job page, rendered on the server: the job's status and progress, and its
outcome's own sentences and figures (the verdict, the SLO checks, the figures, the
launch commands, the Pareto front as inline SVG), so that curl or a browser without
JavaScript reads the whole summary.

Every sentence is the outcome's (`optimizer.search.verdict`, `EvaluatedTrace`,
`Diagnosis.account`), printed as `servetune tune` and `servetune explain` print it; the
tables follow the CLI's columns and formats. Every text is escaped (`html.escape`).
An outcome of another schema version is not read: the page says so and links the JSON.
The script (job.js) only adds copy buttons and a plot point's details; nothing shown
depends on it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from html import escape
from importlib import resources
from string import Template

from optimizer.search.evaluation import EvalStatus, Evaluation
from optimizer.search.outcome import (
    OUTCOME_SCHEMA_VERSION,
    OutcomeFormatError,
    Recommendation,
    TuneOutcome,
)
from optimizer.search.tables import (
    TextTable,
    capacity_table,
    lost_line,
    pareto_table,
    trials_table,
)
from optimizer.search.verdict import gpus, tuned_text, who
from storage.service_records import JobInfo

REFRESH_S = 5  # a queued or running job's page reloads itself this often
KEY_COOKIE_DAYS = 30  # how long the browser keeps the key the form was given


@lru_cache
def read(name: str) -> str:
    """A file of this package (a template, the shared CSS and scripts)."""
    return resources.files("api.ui").joinpath(name).read_text("utf-8")


@lru_cache
def script_hash() -> str:
    """job.js's CSP source (`'sha256-...'`): the only script the page may run."""
    digest = hashlib.sha256(read("job.js").encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"


def _e(value: object) -> str:
    return escape(str(value))


def _money(value: float | None, unit: str = "/h") -> str:
    return "-" if value is None else f"${value:,.2f}{unit}"


def _num(value: float, fmt: str) -> str:
    return format(value, fmt) if math.isfinite(value) else "-"


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], *, id_: str = "") -> str:
    """A table of already-escaped cells."""
    ident = f' id="{id_}"' if id_ else ""
    out = [f"<table{ident}><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows]
    return "".join(out) + "</table>"


def _section(id_: str, title: str, body: str) -> str:
    return f'<section id="{id_}">\n<h2>{_e(title)}</h2>\n{body}\n</section>\n'


def _document(
    title: str,
    body: str,
    *,
    refresh: bool = False,
    forget: str = "",
    script: bool = False,
) -> str:
    return Template(read("job.html")).substitute(
        title=_e(title),
        refresh=f'\n<meta http-equiv="refresh" content="{REFRESH_S}">' if refresh else "",
        common_css=read("common.css"),
        forget=forget,
        body=body,
        script=f"<script>{read('job.js')}</script>\n" if script else "",
    )


def forget_form(next_path: str) -> str:
    return (
        '<form method="post" action="/ui/key/forget" class="forget">'
        f'<input type="hidden" name="next" value="{_e(next_path)}">'
        '<button id="forget-key" type="submit">forget key</button></form>'
    )


# --- pages without a result -------------------------------------------------------------


def key_page(what: str | None, message: str, next_path: str) -> str:
    """The key form (a plain HTML form: it posts the key, the server keeps it in an
    HttpOnly cookie), with why it is shown; `what` the page asked for ("tuning job 5",
    "plan job 7"; None: none)."""
    title = what or "API key"
    kind = what.rsplit(" ", 1)[0] if what else "job"
    body = (
        '<section id="key-form">\n<h2>API key</h2>\n'
        f'<p id="error" class="err">{_e(message)}</p>\n'
        f'<p class="muted">This page shows a {_e(kind)} of your project. Enter an API key '
        "of that project (<code>servetune keys create --project P</code>); this browser "
        f"then keeps it in an HttpOnly cookie for this site's pages for {KEY_COOKIE_DAYS} days "
        "or until you forget it. "
        "curl can send it instead as <code>Authorization: Bearer &lt;key&gt;</code>.</p>\n"
        '<form id="key-entry" method="post" action="/ui/key">'
        f'<input type="hidden" name="next" value="{_e(next_path)}">'
        '<input id="key-input" name="key" type="password" size="50" placeholder="st_..." '
        'autocomplete="off" required> <button class="primary" type="submit">Use key</button>'
        "</form>\n</section>\n"
    )
    return _document(title, body)


def message_page(title: str, message: str, *, forget: str = "") -> str:
    """A page that only says something (the job is not found, a form was refused)."""
    body = f'<section id="message">\n<p id="error" class="err">{_e(message)}</p>\n</section>\n'
    return _document(title, body, forget=forget)


# --- the job page -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredResult:
    """A finished job's stored outcome: read (`outcome`), or why it is not (`note`)."""

    outcome: TuneOutcome | None
    note: str


def read_result(text: str | None) -> StoredResult | None:
    """The stored outcome document as this build reads it (None: the job has none)."""
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        return StoredResult(None, f"The stored result is not readable JSON ({exc}).")
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != OUTCOME_SCHEMA_VERSION:
        older = isinstance(version, int) and version < OUTCOME_SCHEMA_VERSION
        return StoredResult(
            None,
            f"This result was written by {'an older' if older else 'another'} servetune "
            f"(outcome schema_version "
            f"{version!r}; this build reads version {OUTCOME_SCHEMA_VERSION}), so this page "
            "cannot summarise it. Its JSON is kept as it was stored: see the link below, or "
            "run the tuning job again for a summary.",
        )
    try:
        return StoredResult(TuneOutcome.from_dict(data), "")
    except OutcomeFormatError as exc:
        return StoredResult(None, f"The stored result could not be read: {exc}.")


def _progress(job: JobInfo) -> str:
    p = job.progress
    done = p.trials_done if p else 0
    total = p.trials_total if p else job.params.num_trials
    finished = job.status.finished
    parts = []
    if p is not None and p.stage == "done":
        verified = (
            f"verified recommendation: {gpus(p.recommended_gpus)}"
            if p.recommended_gpus is not None
            else "verified: no fleet within the budget meets the SLOs"
        )
        parts.append(verified)
    elif p is not None:
        if p.screened_fewest_gpus is not None:
            parts.append(
                f"fewest GPUs so far: ~{p.screened_fewest_gpus}, a screen's estimate "
                "(the verified answer comes at the end)"
            )
        if p.stage != "searching" and not finished:
            parts.append(p.stage)
        if p.eta_s is not None and not finished:
            parts.append(f"ETA {p.eta_s:,.0f} s")
    if job.trigger_reason:
        parts.append(f"fired by schedule: {job.trigger_reason}")
    if not finished:
        parts.append(f"this page reloads every {REFRESH_S} s until the job ends")
    body = [
        f'<p><span id="status" class="status {_e(job.status.value)}">{_e(job.status.value)}'
        f'</span> <span id="progress-text" class="muted">trials {done} / {total}</span></p>',
        f'<progress max="{max(total, 1)}" value="{min(done, total)}"></progress>',
        f'<p id="progress-detail" class="muted">{" · ".join(_e(x) for x in parts)}</p>',
        f'<p class="muted">{_e(tuned_text(job.params))}</p>',
    ]
    if job.error:
        body.append(f'<p id="error" class="err">{_e(job.error)}</p>')
    return _section("progress-card", "Progress", "\n".join(body))


def job_page(job: JobInfo, result: StoredResult | None) -> str:
    """The whole page of `job` (`result`: its stored outcome, None while it has none)."""
    parts = [_progress(job)]
    json_link = (
        f'<p class="muted">The result as JSON: <a id="json-link" href="/ui/jobs/{job.id}'
        f"/result.json\">result.json</a> (the API's <code>GET /v1/tuning-jobs/{job.id}"
        "/result</code>).</p>"
    )
    if result is not None and result.outcome is None:
        body = f'<p id="old-result" class="err">{_e(result.note)}</p>\n{json_link}'
        parts.append(_section("result-note", "Result", body))
    elif result is not None and result.outcome is not None:
        parts.append(_outcome(result.outcome))
        parts.append(f'<section id="json">{json_link}</section>\n')
    finished = job.status.finished
    return _document(
        f"tuning job {job.id}",
        "".join(parts),
        refresh=not finished,
        forget=forget_form(f"/ui/jobs/{job.id}"),
        script=result is not None and result.outcome is not None,
    )


def _outcome(o: TuneOutcome) -> str:
    v, rec = o.verdict, o.recommendation
    verdict = [
        f'<p id="headline" class="{"ok" if rec else "err"}">{_e(v.headline)}</p>',
        f'<p id="baseline-sentence">{_e(v.baseline)}</p>',
        f'<p id="evaluated" class="muted">{_e(o.evaluated.describe())}</p>',
        f'<p id="latency" class="muted">Latency model: {_e(_latency(o))}</p>',
    ]
    out = [_section("verdict", "Verdict", "\n".join(verdict))]
    if rec is not None:
        out.append(_recommendation(o, rec))
    if o.pareto:
        out.append(_pareto(o))
    why = []
    if v.runner_up:
        why.append("<h3>Why the recommendation beats the runner-up</h3>")
        why.append(f'<p id="runner-up">{_e(v.runner_up)}</p>')
    if v.what_ifs:
        why.append("<h3>What would change the answer</h3>")
        items = "".join(f"<li>{_e(line)}</li>" for line in v.what_ifs)
        why.append(f'<ul id="what-ifs">{items}</ul>')
    if why:
        out.append(_section("why-card", "Why this answer", "\n".join(why)))
    if o.trials.rows or o.trials.lost:
        out.append(_trials(o))
    account = "".join(f"<p>{_e(line)}</p>" for line in o.diagnosis.account)
    out.append(_section("diagnosis-card", "Diagnosis", f'<div id="diagnosis">{account}</div>'))
    return "".join(out)


def _latency(o: TuneOutcome) -> str:
    est = " (no measured profile: an estimate)" if o.latency.is_estimate else ""
    return o.latency.label + est


def _recommendation(o: TuneOutcome, rec: Recommendation) -> str:
    ev, evaluated = rec.predicted, o.evaluated
    deciding = ev.attainment
    attained = [a for a in (deciding, *ev.attainments) if a is not None]
    attained = [a for i, a in enumerate(attained) if a not in attained[:i]]
    cost = _money(ev.price_per_hour)
    if ev.price_per_hour is None:
        cost = '- (no GPU prices given: search_space {"prices": [[gpu, USD per hour]]} adds $)'
    figures = [
        ("GPUs needed", f"{ev.num_gpus} ({ev.num_units} x {ev.unit_gpus}-GPU unit)"),
        ("cost", cost),
        ("per million output tokens", _money(ev.cost_per_million_output_tokens, "")),
        ("interactivity", f"{_num(ev.interactivity_tok_s, '.1f')} tokens/s per user"),
        *(("attainment", evaluated.attainment_text(a)) for a in attained),
    ]
    body = [_table(("figure", "value"), ((_e(k), _e(val)) for k, val in figures), id_="figures")]
    load = "with the clients" if evaluated.clients else "at the trace's own rate"
    checks = [
        (_e(c.metric), _e(load), _num(c.predicted, ".1f"), f"{c.target:g}", _ok(c.ok))
        for c in rec.slo_checks
    ]
    body.append("<h3>SLO checks</h3>")
    body.append(_table(("metric", "load", "predicted", "SLO", ""), checks, id_="slo-checks"))
    if o.capacity:
        body.append(_capacity(o))
    if rec.launch:
        body.append(
            "<h3>Launch commands</h3>\n<p class=\"muted\">vLLM's or SGLang's, each on the node "
            "it names; GPUs are numbered from 0 on every node.</p>"
        )
        cmds = []
        for c in rec.launch:
            where = f"node {c.node}" + (f", {c.accelerator}" if c.accelerator else "")
            times = f" x{c.count}" if c.count > 1 else ""
            note = f' <span class="muted">({_e(c.note)})</span>' if c.note else ""
            cmds.append(
                f"<div><b>{_e(c.engine)} {_e(c.role)}</b>{_e(times)} on {_e(where)}:{note}"
                f'<pre class="command">{_e(c.command)}</pre></div>'
            )
        body.append(f'<div id="commands">{"".join(cmds)}</div>')
    return _section("recommendation-card", "Recommendation", "\n".join(body))


def _ok(ok: bool) -> str:
    return '<b class="ok">ok</b>' if ok else '<b class="err">over</b>'


def _text_table(table: TextTable, id_: str) -> str:
    """One of the answer's tables (`optimizer.search.tables`), escaped."""
    rows = (tuple(_e(c) for c in row) for row in table.rows)
    return _table(tuple(_e(h) for h in table.head), rows, id_=id_)


def _capacity(o: TuneOutcome) -> str:
    table = capacity_table(o)
    return f"<h3>{_e(table.title)}</h3>\n" + _text_table(table, "capacity")


# --- the Pareto front as inline SVG (report.py's geometry) -----------------------------

W, H, M = 720, 420, 60


@dataclass(frozen=True, slots=True)
class _Point:
    x: float
    y: float
    label: str  # the point's figures, its tooltip
    recommended: bool
    meets: bool


def _priced(o: TuneOutcome) -> bool:
    return bool(o.request.space().prices)


def _figures(o: TuneOutcome, ev: Evaluation) -> str:
    price = f" (${ev.price_per_hour:,.2f}/h)" if ev.price_per_hour is not None else ""
    att = "-" if ev.attainment is None else o.evaluated.attainment_text(ev.attainment)
    meets = "meets the SLOs" if ev.feasible else "misses the SLOs"
    return (
        f"{gpus(ev.num_gpus)}{price}, {_num(ev.interactivity_tok_s, '.1f')} tokens/s per user, "
        f"attainment {att}, TTFT p90 {_num(ev.ttft_p90_ms, ',.0f')} ms, TPOT p90 "
        f"{_num(ev.tpot_p90_ms, '.1f')} ms: {meets}"
    )


def _x(ev: Evaluation, priced: bool) -> float:
    price = ev.price_per_hour
    return price if priced and price is not None else float(ev.num_gpus)


def _chosen(o: TuneOutcome, trial: int | None, defaults: bool) -> bool:
    rec = o.recommendation
    return rec is not None and trial == rec.trial and defaults == rec.defaults


def _points(o: TuneOutcome, priced: bool) -> list[_Point]:
    pts = []
    for p in o.pareto:
        ev = p.predicted
        label = f"{who(p.trial, p.defaults)}: {_figures(o, ev)}"
        chosen = _chosen(o, p.trial, p.defaults)
        pts.append(_Point(_x(ev, priced), ev.interactivity_tok_s, label, chosen, ev.feasible))
    return [p for p in pts if math.isfinite(p.x) and math.isfinite(p.y)]


def _base_point(o: TuneOutcome, priced: bool) -> _Point | None:
    b = o.baseline.predicted
    if b.status is EvalStatus.INVALID:
        return None
    label = f"{o.baseline.description}: {_figures(o, b)}"
    p = _Point(_x(b, priced), b.interactivity_tok_s, label, False, b.feasible)
    return p if math.isfinite(p.x) and math.isfinite(p.y) else None


def pareto_svg(o: TuneOutcome, priced: bool) -> str:
    """The front (cost against tokens/s per user: USD per hour when `priced`, else GPUs)
    and the defaults, each point with its figures as its tooltip (`<title>`)."""
    pts, base = _points(o, priced), _base_point(o, priced)
    every = pts + ([base] if base else [])
    xmax = max((p.x for p in every), default=0.0) * 1.1 or 1.0
    ymax = max((p.y for p in every), default=0.0) * 1.1 or 1.0

    def sx(x: float) -> float:
        return M + x / xmax * (W - 2 * M)

    def sy(y: float) -> float:
        return H - M - y / ymax * (H - 2 * M)

    xlabel = "fleet cost, USD per hour" if priced else "GPUs in the fleet"
    g = [
        f'<svg viewBox="0 0 {W} {H}" role="img" aria-label="Pareto front: {_e(xlabel)} '
        'against median output tokens/s per user" xmlns="http://www.w3.org/2000/svg">',
        f'<line x1="{M}" y1="{H - M}" x2="{W - M}" y2="{H - M}" stroke="#333"/>',
        f'<line x1="{M}" y1="{M}" x2="{M}" y2="{H - M}" stroke="#333"/>',
        f'<text x="{W / 2:.0f}" y="{H - 20}" font-size="13" text-anchor="middle">'
        f"{_e(xlabel)}</text>",
        f'<text x="{M}" y="{M - 20}" font-size="13">median output tokens/s per user</text>',
    ]
    for i in range(5):
        xv, yv = xmax * i / 4, ymax * i / 4
        g.append(
            f'<text x="{sx(xv):.1f}" y="{H - M + 18}" font-size="11" text-anchor="middle">'
            f"{xv:.1f}</text>"
        )
        g.append(
            f'<text x="{M - 6}" y="{sy(yv) + 4:.1f}" font-size="11" text-anchor="end">'
            f"{yv:.0f}</text>"
        )
    line = " ".join(f"{sx(p.x):.1f},{sy(p.y):.1f}" for p in sorted(pts, key=lambda p: p.x))
    g.append(f'<polyline points="{line}" fill="none" stroke="#3366aa"/>')
    for p in pts:
        fill = "#cc3311" if p.recommended else ("#3366aa" if p.meets else "#aab")
        cls = "point recommended" if p.recommended else "point"
        g.append(
            f'<circle class="{cls}" data-point="" cx="{sx(p.x):.1f}" cy="{sy(p.y):.1f}" '
            f'r="{9 if p.recommended else 6}" fill="{fill}"><title>{_e(p.label)}</title>'
            "</circle>"
        )
    if base is not None:
        g.append(
            f'<rect class="point baseline" data-point="" x="{sx(base.x) - 6:.1f}" '
            f'y="{sy(base.y) - 6:.1f}" width="12" height="12" fill="#777">'
            f"<title>{_e(base.label)}</title></rect>"
        )
    return "\n".join(g) + "\n</svg>"


def _pareto(o: TuneOutcome) -> str:
    priced = _priced(o)
    table = pareto_table(o)
    legend = (
        '<p class="legend muted"><span class="dot rec"></span>recommended '
        '<span class="dot"></span>meets the SLOs <span class="dot miss"></span>misses them '
        '<span class="square"></span>vLLM\'s defaults; hover a point for its figures.</p>'
    )
    body = [
        f'<div id="pareto">{pareto_svg(o, priced)}</div>',
        legend,
        '<p id="tip" class="muted"></p>',
        _text_table(table, "pareto-table"),
        f'<p class="muted">{_e(table.note)}</p>',
    ]
    return _section("pareto-card", table.title, "\n".join(body))


def _trials(o: TuneOutcome) -> str:
    t = o.trials
    body = []
    if t.lost:
        items = "".join(f"<li>{_e(lost_line(g))}</li>" for g in t.lost)
        body.append(f'<h3>Trials that lost, by reason</h3>\n<ul id="lost">{items}</ul>')
    if t.rows:
        table = trials_table(o)
        body.append(
            f"<details><summary>{_e(table.title)}</summary>{_text_table(table, 'trials')}</details>"
        )
    return _section("trials-card", "Trials", "\n".join(body))
