"""`servetune traces`: import, list, show and export production traces."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from api.cli.common import console, fail, output_file, session
from optimizer.records import TraceFormat, TraceInfo, TraceWarning

app = typer.Typer(help="Production traces: import, inspect, export.", no_args_is_help=True)


class ExportFormat(StrEnum):
    PARQUET = "parquet"
    CSV = "csv"


def _summary_table(info: TraceInfo) -> Table:
    s = info.stats
    table = Table(title=f"trace {info.id}: {info.name} ({info.source_format})", show_header=True)
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
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
            str(t.source_format),
            f"{t.stats.num_requests:,}",
            f"{t.stats.duration_s:,.1f}",
            f"{t.stats.mean_rate:.2f}",
            f"{t.created_at:%Y-%m-%d %H:%M}",
        )
    console.print(table if traces else "no traces stored yet: `servetune traces import PATH`")


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
