"""A plan's picture: demand (requests/s per window) and GPUs over time (the lower bound,
and the GPUs each fleet held in its replay), and each fleet's attainment per window
against the target. As a PNG (matplotlib) and as a self-contained HTML page
(inline SVG and the plan's tables; no script, no CDN)."""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from optimizer.plan.keda import keda_yaml
from optimizer.plan.outcome import FleetPlan
from optimizer.plan.tables import (
    capacity_table,
    fleets_table,
    headline,
    lower_bound_lines,
    policy_lines,
    windows_table,
)
from optimizer.search.tables import TextTable

_COLOURS = {
    "lower bound": "#228833",
    "static": "#cc3311",
    "scheduled": "#3366aa",
    "reactive": "#ee7733",
}


@dataclass(frozen=True, slots=True)
class Series:
    """A step line: `ys[i]` from `xs[i]` (hours) to `xs[i + 1]`."""

    name: str
    xs: tuple[float, ...]  # len(ys) + 1 edges
    ys: tuple[float, ...]


def demand(plan: FleetPlan) -> Series:
    return Series(
        "demand",
        _edges(plan),
        tuple(w.rate for w in plan.windows),
    )


def _edges(plan: FleetPlan) -> tuple[float, ...]:
    return (*(w.start_s / 3600 for w in plan.windows), plan.windows[-1].end_s / 3600)


def gpu_series(plan: FleetPlan) -> tuple[Series, ...]:
    """GPUs over time: the lower bound per window, and the units each fleet held in its
    replay (x GPUs per unit), clipped to the trace."""
    gpus = plan.lower_bound.unit_gpus
    out = [Series("lower bound", _edges(plan), tuple(float(g) for g in plan.lower_bound.gpus))]
    end = plan.windows[-1].end_s
    for f in plan.fleets:
        xs, ys = [0.0], [float(f.schedule.count_at(0.0) * gpus)]
        for t, c in zip(f.schedule.times_s, f.schedule.counts, strict=True):
            if 0.0 < t < end:
                xs.append(t / 3600)
                ys.append(float(c * gpus))
        xs.append(end / 3600)
        out.append(Series(f.kind.value, tuple(xs), tuple(ys)))
    return tuple(out)


def attainment_series(plan: FleetPlan) -> tuple[Series, ...]:
    """Each fleet's attainment per window (NaN for a window without requests: a gap in
    both pictures)."""
    out = []
    for f in plan.fleets:
        ys = tuple(float("nan") if a is None else a for a in f.window_attainment)
        out.append(Series(f.kind.value, _edges(plan), ys))
    return tuple(out)


def _title(plan: FleetPlan) -> str:
    r = plan.request
    est = ", roofline estimate" if plan.latency.is_estimate else ""
    synthetic = ", synthetic trace" if plan.trace.synthetic else ""
    return f"{r.model} on {r.gpu}: demand and GPUs per {r.window_s:g} s window{est}{synthetic}"


def write_png(plan: FleetPlan, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from optimizer.search.report import set_titles

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), dpi=110, sharex=True)
    d = demand(plan)
    top.stairs(d.ys, d.xs, fill=True, color="#bbbbbb", label="demand, req/s")
    top.set_ylabel("requests/s")
    right = top.twinx()
    for s in gpu_series(plan):
        right.stairs(
            s.ys, s.xs, baseline=None, color=_COLOURS.get(s.name, "#777777"), lw=1.6, label=s.name
        )
    right.set_ylabel("GPUs")
    right.set_ylim(0, max(max(s.ys) for s in gpu_series(plan)) * 1.15 + 0.5)
    lines = top.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    top.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)
    top.grid(alpha=0.3)
    for s in attainment_series(plan):
        bottom.stairs(
            s.ys, s.xs, baseline=None, color=_COLOURS.get(s.name, "#777777"), lw=1.4, label=s.name
        )
    bottom.axhline(plan.request.attainment, color="#000000", ls="--", lw=1, label="target")
    bottom.set_ylabel("attainment per window")
    bottom.set_xlabel("hours from the trace's first request")
    bottom.set_ylim(0, 1.02)
    bottom.legend(loc="lower left", fontsize=8)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    set_titles(
        fig,
        [
            (top, _title(plan)),
            (bottom, "Attainment per window"),
        ],
    )
    fig.savefig(path)
    plt.close(fig)
    return path


# -- HTML -------------------------------------------------------------------------------

_W, _H, _PAD_L, _PAD_R, _PAD_T, _PAD_B = 900, 260, 56, 56, 16, 34


def _x(value: float, x_max: float) -> float:
    return _PAD_L + (_W - _PAD_L - _PAD_R) * value / x_max


def _y(value: float, y_max: float) -> float:
    return _PAD_T + (_H - _PAD_T - _PAD_B) * (1 - value / y_max)


def _path(s: Series, x_max: float, y_max: float) -> str:
    """An SVG path of a step line (NaN values leave gaps)."""
    parts, pen = [], False
    for i, v in enumerate(s.ys):
        if v != v:  # NaN
            pen = False
            continue
        x0, x1, y = _x(s.xs[i], x_max), _x(s.xs[i + 1], x_max), _y(v, y_max)
        parts.append(f"{'L' if pen else 'M'}{x0:.1f},{y:.1f} L{x1:.1f},{y:.1f}")
        pen = True
    return " ".join(parts)


def _axes(x_max: float, y_max: float, y_label: str, right: str = "") -> str:
    ticks = []
    for k in range(5):
        v = y_max * k / 4
        ticks.append(
            f'<text x="{_PAD_L - 6}" y="{_y(v, y_max) + 4:.1f}" text-anchor="end">{v:,.3g}</text>'
        )
    step = max(1, round(x_max / 12))
    for h in range(0, int(x_max) + 1, step):
        ticks.append(f'<text x="{_x(h, x_max):.1f}" y="{_H - 12}" text-anchor="middle">{h}h</text>')
    label = (
        f'<text x="14" y="{_H / 2}" transform="rotate(-90 14 {_H / 2})" '
        f'text-anchor="middle">{html.escape(y_label)}</text>'
    )
    right_label = ""
    if right:
        right_label = (
            f'<text x="{_W - 10}" y="{_H / 2}" transform="rotate(90 {_W - 10} {_H / 2})" '
            f'text-anchor="middle">{html.escape(right)}</text>'
        )
    box = (
        f'<rect x="{_PAD_L}" y="{_PAD_T}" width="{_W - _PAD_L - _PAD_R}" '
        f'height="{_H - _PAD_T - _PAD_B}" fill="none" stroke="#999"/>'
    )
    return box + "".join(ticks) + label + right_label


def _legend(names: list[tuple[str, str]]) -> str:
    return "".join(
        f'<span class="key"><i style="background:{c}"></i>{html.escape(n)}</span>' for n, c in names
    )


def demand_svg(plan: FleetPlan) -> str:
    """Demand (grey bars, left axis) and GPUs over time (lines, right axis)."""
    d = demand(plan)
    x_max = d.xs[-1]
    rate_max = max(max(d.ys), 1e-9) * 1.1
    series = gpu_series(plan)
    gpu_max = max(max(max(s.ys) for s in series), 1.0) * 1.1
    bars = []
    for i, v in enumerate(d.ys):
        x0, x1 = _x(d.xs[i], x_max), _x(d.xs[i + 1], x_max)
        y = _y(v, rate_max)
        bars.append(
            f'<rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 0.5):.1f}" '
            f'height="{_H - _PAD_B - y:.1f}" fill="#cccccc"><title>'
            f"{html.escape(plan.windows[i].label())}: {v:,.2f} req/s</title></rect>"
        )
    lines = [
        f'<path d="{_path(s, x_max, gpu_max)}" fill="none" stroke="{_COLOURS.get(s.name, "#777")}"'
        f' stroke-width="2"><title>{html.escape(s.name)} GPUs</title></path>'
        for s in series
    ]
    body = "".join(bars) + "".join(lines) + _axes(x_max, rate_max, "requests/s", "GPUs")
    # the right axis' scale
    for k in range(5):
        v = gpu_max * k / 4
        body += f'<text x="{_W - _PAD_R + 6}" y="{_y(v, gpu_max) + 4:.1f}">{v:,.3g}</text>'
    keys = [("demand, req/s", "#cccccc")] + [(s.name, _COLOURS.get(s.name, "#777")) for s in series]
    return _svg(body, keys)


def attainment_svg(plan: FleetPlan) -> str:
    x_max = _edges(plan)[-1]
    series = attainment_series(plan)
    body = "".join(
        f'<path d="{_path(s, x_max, 1.02)}" fill="none" stroke="{_COLOURS.get(s.name, "#777")}"'
        f' stroke-width="2"/>'
        for s in series
    )
    t = _y(plan.request.attainment, 1.02)
    body += (
        f'<line x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{t:.1f}" y2="{t:.1f}" stroke="#000" '
        f'stroke-dasharray="5,4"/>'
    )
    body += _axes(x_max, 1.02, "attainment")
    keys = [(s.name, _COLOURS.get(s.name, "#777")) for s in series] + [("target", "#000000")]
    return _svg(body, keys)


def _svg(body: str, keys: list[tuple[str, str]]) -> str:
    return (
        f'<div class="legend">{_legend(keys)}</div>'
        f'<svg viewBox="0 0 {_W} {_H}" width="100%" role="img">{body}</svg>'
    )


def _table(t: TextTable) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in t.head)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in t.rows
    )
    note = f"<p class='note'>{html.escape(t.note)}</p>" if t.note else ""
    return f"<h2>{html.escape(t.title)}</h2><table><tr>{head}</tr>{rows}</table>{note}"


def _lines(lines: tuple[str, ...]) -> str:
    return "".join(f"<p>{html.escape(line)}</p>" for line in lines)


_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:24px;max-width:1100px;color:#222}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}"
    "th{background:#f3f3f3}.note{color:#555;font-size:13px}svg text{font-size:11px}"
    ".key{margin-right:14px;font-size:13px}.key i{display:inline-block;width:14px;height:4px;"
    "margin-right:5px;vertical-align:middle}pre{background:#f6f6f6;padding:8px;overflow:auto}"
)


def plan_html(plan: FleetPlan) -> str:
    """The whole page (see the module docstring)."""
    parts = [
        f"<h1>{html.escape(_title(plan))}</h1>",
        _lines(headline(plan)),
        "<h2>(d) Demand and GPUs over time</h2>",
        demand_svg(plan),
        "<h2>(d) Attainment per window</h2>",
        attainment_svg(plan),
        _table(capacity_table(plan)),
        _lines(lower_bound_lines(plan)),
        _table(fleets_table(plan)),
    ]
    per_window = windows_table(plan)
    if per_window is not None:
        parts.append(_table(per_window))
    parts.append(_lines(policy_lines(plan)))
    yaml_text = keda_yaml(plan.policy, plan.unit.config)
    parts.append(f"<h2>(e) KEDA ScaledObject</h2><pre>{html.escape(yaml_text)}</pre>")
    body = "".join(parts)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(_title(plan))}"
        f"</title><style>{_STYLE}</style></head><body>{body}</body></html>"
    )


def write_html(plan: FleetPlan, path: Path) -> Path:
    path.write_text(plan_html(plan), encoding="utf-8")
    return path
