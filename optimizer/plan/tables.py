"""A plan's sentences and tables as plain text cells (`optimizer.search.tables.TextTable`):
`servetune plan` draws them with rich, the HTML page as HTML, so both show the same
figures."""

from __future__ import annotations

from optimizer.plan.fleets import FleetReplay
from optimizer.plan.outcome import FleetPlan
from optimizer.search.tables import TextTable

MAX_WINDOW_ROWS = 48  # longer plans list their windows in plan.json and plan.html only


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _dollars(value: float | None) -> str:
    return "-" if value is None else f"${value:,.0f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def headline(plan: FleetPlan) -> tuple[str, ...]:
    """What was planned, on what, priced how: the lines above the tables."""
    r, t = plan.request, plan.trace
    synthetic = " (synthetic)" if t.synthetic else ""
    est = " (no measured profile: an estimate)" if plan.latency.is_estimate else ""
    return (
        f"Plan for {r.model} on {r.gpu}: TTFT <= {r.slo_ttft_ms:g} ms and TPOT <= "
        f"{r.slo_tpot_ms:g} ms for {r.attainment:.0%} of requests, windows of {r.window_s:g} s",
        f"trace{synthetic}: {t.num_requests:,} requests over {t.span_s / 3600:,.1f} h, "
        f"{t.mean_rate:,.2f} req/s mean, {len(plan.windows)} windows "
        f"({sum(1 for w in plan.windows if w.num_requests == 0)} without requests)",
        f"latency model: {plan.latency.label}{est}",
        f"unit ({plan.unit.source.value}): {plan.unit.reason}",
        plan.cold_start.describe(),
    )


def capacity_table(plan: FleetPlan) -> TextTable:
    """(a) The unit's SLO-bounded capacity per length-mix bucket."""
    gpus = plan.lower_bound.unit_gpus
    rows = []
    for b in plan.bucketing.buckets:
        flag = "" if b.bounded else " (probe limit)"
        rows.append(
            (
                str(b.index),
                str(len(b.windows)),
                f"{b.num_requests:,}",
                f"{b.mean_input_tokens:,.0f} / {b.mean_output_tokens:,.0f}",
                f"{b.capacity_rps:,.2f}{flag}",
                f"{b.capacity_rps / gpus:,.2f}",
                f"{b.attainment:.1%}",
                f"{b.concurrency:,.1f}",
            )
        )
    return TextTable(
        "(a) The unit's SLO-bounded capacity, per length mix",
        (
            "bucket",
            "windows",
            "requests",
            "mean prompt / output",
            "req/s per unit",
            "req/s per GPU",
            "attainment",
            "running+waiting",
        ),
        tuple(rows),
        plan.bucketing.describe(),
    )


def lower_bound_lines(plan: FleetPlan) -> tuple[str, ...]:
    """(b) The perfect-system lower bound in a few figures."""
    lb = plan.lower_bound
    dollars = f", {_dollars(lb.dollars)}" if lb.dollars is not None else ""
    peak = max(plan.windows, key=lambda w: (lb.units[w.index], w.rate))
    return (
        f"(b) Lower bound (a perfect system: units = ceil(rate / capacity) per window): "
        f"{lb.gpu_hours:,.1f} GPU-hours{dollars}; peak {lb.peak_gpus} GPUs in {peak.label()}, "
        f"mean {lb.mean_gpus:,.2f} GPUs",
    )


def windows_table(plan: FleetPlan) -> TextTable | None:
    """Per window: demand, the lower bound and each fleet's attainment (None for a plan
    of more than `MAX_WINDOW_ROWS` windows)."""
    if len(plan.windows) > MAX_WINDOW_ROWS:
        return None
    rows = []
    for w in plan.windows:
        cells = [
            w.label(),
            f"{w.num_requests:,}",
            f"{w.rate:,.2f}",
            "-"
            if plan.bucketing.bucket_of[w.index] is None
            else str(plan.bucketing.bucket_of[w.index]),
            str(plan.lower_bound.gpus[w.index]),
        ]
        cells += [_share(f.window_attainment[w.index]) for f in plan.fleets]
        rows.append(tuple(cells))
    head = ("window", "requests", "req/s", "bucket", "lower-bound GPUs")
    head += tuple(f"{f.kind.value} attainment" for f in plan.fleets)
    return TextTable("(b) Per window", head, tuple(rows))


def _worst(plan: FleetPlan, f: FleetReplay) -> str:
    if f.worst_window is None:
        return "-"
    w = plan.windows[f.worst_window]
    return f"{w.label()}: {_share(f.window_attainment[w.index])}"


def fleets_table(plan: FleetPlan) -> TextTable:
    """(c) The three fleets over the whole trace."""
    gpus = plan.lower_bound.unit_gpus
    busy = sum(1 for w in plan.windows if w.num_requests)
    rows = []
    for f in plan.fleets:
        rows.append(
            (
                f.kind.value,
                str(f.peak_units * gpus),
                _hours(f.gpu_hours),
                _dollars(f.dollars),
                _share(f.attainment),
                f"{f.windows_meeting_target}/{busy}",
                _worst(plan, f),
                str(f.num_cold_starts),
                f.note,
            )
        )
    return TextTable(
        "(c) Fleets replayed on the whole trace",
        (
            "fleet",
            "peak GPUs",
            "GPU-hours",
            "$",
            "attainment",
            "windows meeting target",
            "worst window",
            "cold starts",
            "how",
        ),
        tuple(rows),
        plan.ordering,
    )


def policy_lines(plan: FleetPlan) -> tuple[str, ...]:
    """(e) The reactive policy in words."""
    p = plan.policy
    return (
        f"(e) Reactive policy: {p.metric.value} per unit, target {p.target:g}, "
        f"{p.min_replicas}-{p.max_replicas} units, tolerance {p.tolerance:g}",
        plan.policy_basis.describe(p),
    )
