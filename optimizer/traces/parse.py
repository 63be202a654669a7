"""parse_trace: one trace file to validated, normalised columns plus their statistics.

Pipeline: `sniff` (size limit, sha256, binary/encoding checks, column names) ->
format resolution (forced, mapping, or detected) -> `frames` (lazy scan of the
mapped columns, declared schemas, row limit) -> `convert` (typed arrays, first
bad row named) -> documented repairs -> `stats.compute_stats` -> `plausibility` (warnings).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from optimizer.records import TraceColumns, TraceFormat, TraceStats, TraceWarning
from optimizer.traces import convert
from optimizer.traces.errors import TraceFormatError, clip_list
from optimizer.traces.formats import (
    FORMAT_SPECS,
    ColumnMapping,
    FileKind,
    FormatSpec,
    check_columns,
    detect_format,
    generic_spec,
    with_native_optionals,
)
from optimizer.traces.frames import ROW, load_frame
from optimizer.traces.plausibility import check_plausibility
from optimizer.traces.sniff import FileFacts, inspect_file
from optimizer.traces.stats import compute_stats, infer_block_size


@dataclass(frozen=True, slots=True)
class IngestLimits:
    """Files larger or longer than these are rejected before any row is stored."""

    max_bytes: int = 2 << 30  # 2 GiB
    max_rows: int = 50_000_000

    def __post_init__(self) -> None:
        if self.max_bytes <= 0 or self.max_rows <= 0:
            raise ValueError(f"ingest limits must be positive, got {self}")


@dataclass(frozen=True, slots=True)
class ParsedTrace:
    """A validated trace, ready to store: arrival_s from 0, sorted (stable) by arrival."""

    format: TraceFormat
    columns: TraceColumns
    stats: TraceStats
    content_hash: str  # sha256 hex of the file bytes
    warnings: tuple[str, ...] = ()
    num_dropped: int = 0
    block_size: int | None = None  # tokens per prefix hash block, when hash_ids exist
    num_bytes: int = field(default=0, compare=False)
    # What real traffic hardly shows (a rate, a span, a length): kept, with a warning
    plausibility_warnings: tuple[TraceWarning, ...] = ()


def parse_trace(
    path: str | Path,
    *,
    format: TraceFormat | None = None,
    mapping: ColumnMapping | None = None,
    limits: IngestLimits = IngestLimits(),
) -> ParsedTrace:
    """Read, validate and normalise one trace file; TraceFormatError says what is wrong.

    `format` forces a format (auto-detected from the header or first record when
    None). `mapping` describes a generic CSV/JSONL/Parquet file and implies
    format GENERIC.
    """
    path = Path(path)
    facts = inspect_file(path, limits.max_bytes)
    spec = _resolve_spec(path, facts, format, mapping)
    frame = load_frame(path, facts, spec, limits.max_rows)
    _check_row_count(path, facts, frame, limits.max_rows)
    return _build(path, facts, spec, frame)


def _resolve_spec(
    path: Path, facts: FileFacts, format: TraceFormat | None, mapping: ColumnMapping | None
) -> FormatSpec:
    if mapping is not None:
        if format not in (None, TraceFormat.GENERIC):
            raise ValueError(f"a column mapping describes a generic trace, not format {format}")
        spec = generic_spec(mapping)
    elif format is None:
        return with_native_optionals(detect_format(path, facts.columns), facts.columns)
    elif format is TraceFormat.GENERIC:
        raise TraceFormatError(
            path,
            "format generic needs a ColumnMapping (arrival, input and output token columns); "
            f"the file has columns {clip_list(facts.columns)}",
        )
    else:
        spec = with_native_optionals(FORMAT_SPECS[TraceFormat(format)], facts.columns)
    check_columns(path, spec, facts.columns)
    return spec


def _check_row_count(path: Path, facts: FileFacts, frame: pl.DataFrame, max_rows: int) -> None:
    if frame.height == 0:
        what = "header only" if facts.kind is FileKind.CSV else "no records"
        raise TraceFormatError(
            path, f"{what}: the file has no data rows; expected at least one request"
        )
    if frame.height > max_rows:
        raise TraceFormatError(
            path,
            f"more than {max_rows:,} data rows; the row limit is {max_rows:,}",
            row=max_rows + 1,
        )


def _build(path: Path, facts: FileFacts, spec: FormatSpec, frame: pl.DataFrame) -> ParsedTrace:
    m = spec.mapping
    warnings: list[str] = []
    arrival = convert.arrival_seconds(path, frame, m.arrival, m.time_unit, m.datetime_format)
    inputs = convert.token_counts(path, frame, m.input_tokens)
    outputs = convert.token_counts(path, frame, m.output_tokens)
    rows = frame[ROW].to_numpy()
    keep: np.ndarray | None = None
    num_dropped = 0
    if spec.drop_zero_output:
        failed = outputs == 0
        num_dropped = int(failed.sum())
        if num_dropped:
            keep = ~failed
            warnings.append(
                f"dropped {num_dropped} failed request(s) with 0 {m.output_tokens!r} "
                f"(first at row {int(rows[failed][0]) + 1})"
            )
            if num_dropped == frame.height:
                raise TraceFormatError(
                    path, f"all {num_dropped} rows are failed requests (0 {m.output_tokens!r})"
                )
            arrival, inputs, outputs, rows = arrival[keep], inputs[keep], outputs[keep], rows[keep]
    convert.require_positive(path, frame, m.input_tokens, inputs, rows)
    convert.require_positive(path, frame, m.output_tokens, outputs, rows)

    hashes = convert.hash_lists(path, frame, m.hash_ids) if m.hash_ids else None
    sessions = convert.session_ids(frame, m.session_id) if m.session_id else None
    accept = None
    if m.acceptance_length:
        accept = convert.acceptance_lengths(path, frame, m.acceptance_length)
    if keep is not None:
        kept = np.flatnonzero(keep)
        hashes = None if hashes is None else [hashes[i] for i in kept]
        sessions = None if sessions is None else [sessions[i] for i in kept]
        accept = None if accept is None else accept[keep]

    order = _arrival_order(arrival, rows, warnings)
    if order is not None:
        arrival, inputs, outputs = arrival[order], inputs[order], outputs[order]
        hashes = None if hashes is None else [hashes[i] for i in order]
        sessions = None if sessions is None else [sessions[i] for i in order]
        accept = None if accept is None else accept[order]
        rows = rows[order]
    arrival = arrival - arrival[0]

    block_size = None
    if hashes is not None:
        block_size = m.block_size or infer_block_size(inputs, hashes)
        _warn_block_mismatch(inputs, hashes, block_size, m.hash_ids, warnings)
    columns = TraceColumns(arrival, inputs, outputs, hashes, sessions, accept)
    stats = compute_stats(
        columns, num_dropped=num_dropped, warnings=warnings, block_size=block_size
    )
    plausibility = check_plausibility(
        columns, stats, format=spec.format, mapping=m, rows=np.asarray(rows) + 1
    )
    return ParsedTrace(
        format=spec.format,
        columns=columns,
        stats=stats,
        content_hash=facts.content_hash,
        warnings=tuple(warnings),
        num_dropped=num_dropped,
        block_size=block_size,
        num_bytes=facts.num_bytes,
        plausibility_warnings=plausibility,
    )


def _arrival_order(arrival: np.ndarray, rows: np.ndarray, warnings: list[str]) -> np.ndarray | None:
    """Stable sort permutation when arrivals are out of order (a repair, with a warning)."""
    backwards = np.flatnonzero(arrival[1:] < arrival[:-1])
    if backwards.size == 0:
        return None
    first_row = int(rows[backwards[0] + 1]) + 1
    warnings.append(
        f"timestamps out of order at {backwards.size} place(s) (first at row {first_row}); "
        "stable-sorted by arrival"
    )
    return np.argsort(arrival, kind="stable")


def _warn_block_mismatch(
    inputs: np.ndarray,
    hashes: list[np.ndarray],
    block_size: int | None,
    column: str | None,
    warnings: list[str],
) -> None:
    if block_size is None:
        return
    counts = np.fromiter((h.shape[0] for h in hashes), np.int64, len(hashes))
    expected = -(-inputs // block_size)
    num_off = int((counts != expected).sum())
    if num_off:
        warnings.append(
            f"{num_off} request(s) where len({column}) != ceil(input tokens / {block_size})"
        )
