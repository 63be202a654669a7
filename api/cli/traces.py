"""`servetune traces`: import, list, show and export production traces; synthesize long
ones from a short sample."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from api.cli.common import console, fail, output_file, session
from optimizer.records import TraceFormat, TraceInfo, TraceWarning

app = typer.Typer(
    help="Production traces: import, inspect, export, synthesize.", no_args_is_help=True
)


class ExportFormat(StrEnum):
    PARQUET = "parquet"
    CSV = "csv"


def _kind(info: TraceInfo) -> str:
    """What `traces list` and `show` print as the trace's format: `synthetic` for one
    `traces synthesize` made (its stored format, generic, says nothing about it)."""
    return "synthetic" if info.synthetic is not None else str(info.source_format)


def _origin_rows(info: TraceInfo) -> list[tuple[str, str]]:
    """How a synthetic trace was made, as `traces show` rows (none for an upload)."""
    o = info.synthetic
    if o is None:
        return []
    curve = o.rate_curve
    return [
        ("synthetic from", f"trace {o.from_trace_id}: {o.from_trace_name}"),
        (
            "synthetic as",
            f"{o.days:g} days at {o.mean_rate:g} req/s on average, rate curve {curve.name} "
            f"({curve.axis.value}, {len(curve.hours)} points), seed {o.seed}",
        ),
    ]


def _summary_table(info: TraceInfo) -> Table:
    s = info.stats
    table = Table(title=f"trace {info.id}: {info.name} ({_kind(info)})", show_header=True)
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = _origin_rows(info)
    rows += [
        ("requests", f"{s.num_requests:,}"),
        ("duration", f"{s.duration_s:,.1f} s"),
        ("mean rate", f"{s.mean_rate:.2f} req/s"),
        ("inter-arrival CV", f"{s.interarrival_cv:.2f}"),
        (
            "peak rate 1 s / 10 s / 60 s",
            f"{s.peak_rate_1s:.1f} / {s.peak_rate_10s:.1f} / {s.peak_rate_60s:.1f} req/s",
        ),
    ]
    for label, t in (("input tokens", s.input_tokens), ("output tokens", s.output_tokens)):
        rows.append(
            (
                f"{label} mean / p50 / p90 / p99 / max",
                f"{t.mean:,.1f} / {t.p50:,} / {t.p90:,} / {t.p99:,} / {t.max:,}",
            )
        )
        rows.append((f"{label} total", f"{t.total:,}"))
    if s.prefix_hit_ratio is not None:
        rows.append(("ideal prefix-cache hit", f"{s.prefix_hit_ratio:.3f}"))
    if s.num_dropped:
        rows.append(("rows dropped", f"{s.num_dropped:,}"))
    for label, value in rows:
        table.add_row(label, value)
    table.caption = (
        f"content sha256 {info.content_hash[:16]}…  created {info.created_at:%Y-%m-%d %H:%M} UTC"
    )
    return table


def print_plausibility(warnings: tuple[TraceWarning, ...]) -> None:
    """One yellow `warning:` line per figure real traffic hardly shows (nothing blocks)."""
    for w in warnings:
        console.print(f"[yellow]warning:[/] {w.message}", highlight=False, soft_wrap=True)


@app.command("import")
def import_(
    path: Annotated[Path, typer.Argument(help="trace file (CSV, JSONL or Parquet)")],
    format: Annotated[
        TraceFormat | None, typer.Option("--format", help="force a format instead of detecting it")
    ] = None,
    name: Annotated[str | None, typer.Option(help="name to store (default: file name)")] = None,
    arrival: Annotated[str | None, typer.Option(help="generic: arrival column")] = None,
    arrival_unit: Annotated[
        str | None, typer.Option(help="generic: s (default), ms, us or datetime")
    ] = None,
    input_col: Annotated[
        str | None, typer.Option("--input", help="generic: input tokens column")
    ] = None,
    output_col: Annotated[
        str | None, typer.Option("--output", help="generic: output tokens column")
    ] = None,
) -> None:
    """Validate and store a trace (idempotent: the same file returns the stored trace).

    Figures real traffic hardly shows (a request rate over 1,000 req/s, all requests at
    one instant, under 0.01 req/s over days, a request longer than any model's context)
    are stored with the trace and printed as warnings; with a numeric arrival column the
    warning says what the trace would be in the other units."""
    from api.services.ingest import ingest_trace
    from api.settings import get_settings
    from optimizer.traces import IngestLimits, TraceFormatError, generic_mapping

    try:
        mapping = generic_mapping(
            format,
            arrival=arrival,
            input_tokens=input_col,
            output_tokens=output_col,
            arrival_unit=arrival_unit,
        )
    except ValueError as exc:
        fail(f"{exc} (options --arrival, --input, --output, --arrival-unit)")
    settings = get_settings()
    limits = IngestLimits(max_bytes=settings.max_upload_bytes, max_rows=settings.max_trace_rows)
    if not path.exists():
        fail(f"{path}: no such file")
    try:
        with session() as s:
            result = ingest_trace(s, path, name=name, format=format, mapping=mapping, limits=limits)
    except TraceFormatError as exc:
        fail(str(exc))
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    if result.num_dropped:
        console.print(f"[yellow]dropped {result.num_dropped:,} rows[/] (see warnings)")
    verb = "stored as" if result.created else "already stored as"
    console.print(f"{verb} trace [bold]{result.trace.id}[/]")
    console.print(_summary_table(result.trace))
    print_plausibility(result.plausibility_warnings)


@app.command("list")
def list_(
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
    offset: Annotated[int, typer.Option(min=0)] = 0,
) -> None:
    """List stored traces."""
    from storage.traces import list_traces

    with session() as s:
        traces = list_traces(s, limit=limit, offset=offset)
    table = Table("id", "name", "format", "requests", "duration s", "req/s", "created (UTC)")
    for t in traces:
        table.add_row(
            str(t.id),
            t.name,
            _kind(t),
            f"{t.stats.num_requests:,}",
            f"{t.stats.duration_s:,.1f}",
            f"{t.stats.mean_rate:.2f}",
            f"{t.created_at:%Y-%m-%d %H:%M}",
        )
    console.print(table if traces else "no traces stored yet: `servetune traces import PATH`")


@app.command("synthesize")
def synthesize(
    from_trace: Annotated[
        int, typer.Option("--from", help="stored sample trace whose lengths are resampled")
    ],
    days: Annotated[float, typer.Option(help="span in days, up to 31")],
    mean_rate: Annotated[float, typer.Option(help="requests/s on average over the span")],
    rate_curve: Annotated[
        str,
        typer.Option(help="'diurnal' (peak 14:00, trough 02:00, 4x) or a curve CSV file"),
    ],
    seed: Annotated[int, typer.Option(help="same seed, same trace")] = 0,
    name: Annotated[
        str | None, typer.Option(help="name to store (default: synthetic-week-from-ID)")
    ] = None,
) -> None:
    """Make a long trace from a short sample and store it, labelled synthetic.

    Each request takes the (prompt, output) token pair of a sample request drawn at
    random (prefix hashes, sessions and acceptance lengths are not carried over); the
    arrivals are a seeded Poisson process whose rate follows the curve, scaled to
    --mean-rate. A curve file is CSV: a header `hour_of_day|hour_of_week|hour,
    relative_rate`, then one point a line, linearly interpolated (hour_of_week 0 is
    Monday 00:00; `hour` counts from the trace's start and must cover it). The same
    request again returns the stored trace."""
    from api.services.synthesize import synthesize_trace
    from api.settings import get_settings
    from optimizer.traces.synthesize import (
        DIURNAL,
        RateCurveError,
        SynthesisError,
        read_rate_curve,
    )
    from storage.traces import TraceNotFound

    try:
        curve = DIURNAL if rate_curve == "diurnal" else read_rate_curve(rate_curve)
    except RateCurveError as exc:
        fail(f"--rate-curve {exc}")
    max_rows = get_settings().max_trace_rows
    try:
        with session() as s:
            result = synthesize_trace(
                s,
                from_trace_id=from_trace,
                curve=curve,
                days=days,
                mean_rate=mean_rate,
                seed=seed,
                name=name,
                max_requests=max_rows,
            )
    except TraceNotFound as exc:
        fail(f"--from {from_trace}: {exc}")
    except (SynthesisError, RateCurveError) as exc:
        fail(str(exc))
    verb = "stored as" if result.created else "already stored as"
    console.print(f"{verb} trace [bold]{result.trace.id}[/] (synthetic)")
    console.print(_summary_table(result.trace))


def _get(trace_id: int) -> TraceInfo:
    from storage.traces import TraceNotFound, get_trace

    try:
        with session() as s:
            return get_trace(s, trace_id)
    except TraceNotFound as exc:
        fail(str(exc))


@app.command("show")
def show(trace_id: Annotated[int, typer.Argument(help="trace id")]) -> None:
    """Show a trace's statistics and what its ingest found implausible."""
    info = _get(trace_id)
    console.print(_summary_table(info))
    print_plausibility(info.plausibility_warnings)


@app.command("export")
def export(
    trace_id: Annotated[int, typer.Argument(help="trace id")],
    to: Annotated[ExportFormat, typer.Option("--to", help="file format")] = ExportFormat.PARQUET,
    out: Annotated[Path | None, typer.Option("--out", help="output path")] = None,
) -> None:
    """Write a stored trace to Parquet or CSV (generic columns; re-importable)."""
    from api.services.export import write_trace
    from storage.traces import load_trace_columns

    info = _get(trace_id)
    with session() as s:
        columns = load_trace_columns(s, trace_id)
    target = output_file(out or Path(f"trace-{trace_id}.{to.value}"))
    write_trace(columns, target, csv=to is ExportFormat.CSV)
    console.print(f"wrote {len(columns):,} requests of trace {info.id} to {target}")
