"""Lazy scans with declared schemas: a trace file to a frame of its raw mapped columns.

CSV and JSONL scalar columns are declared as strings, so one bad cell never
aborts the scan; `parse.py` casts them with strict=False and reports the first
offending row. When the scan itself fails (a ragged CSV row, a broken JSON
line), a slow pure-Python pass finds the row to report; it only runs on that
error path.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import polars as pl

from optimizer.traces.errors import TraceFormatError, clip_list
from optimizer.traces.formats import FileKind, FormatSpec
from optimizer.traces.sniff import TOO_DEEP, FileFacts

ROW = "__row"  # 0-based data row, kept through repairs so errors can name the file row

_HASH_DTYPE = pl.List(pl.Int64)


def load_frame(path: Path, facts: FileFacts, spec: FormatSpec, max_rows: int) -> pl.DataFrame:
    """The mapped columns (and ROW) of at most max_rows + 1 data rows."""
    columns = list(spec.required_columns)
    lazy = _scan(path, facts, spec).select(columns).with_row_index(ROW)
    try:
        frame = lazy.head(max_rows + 1).collect()
    except pl.exceptions.PolarsError as exc:
        raise _diagnose(path, facts, spec, exc) from None
    hash_col = spec.mapping.hash_ids
    if hash_col is not None and frame.schema[hash_col] == pl.String:
        frame = _decode_hash_strings(path, frame, hash_col)
    return frame


def _scan(path: Path, facts: FileFacts, spec: FormatSpec) -> pl.LazyFrame:
    if facts.kind is FileKind.PARQUET:
        return pl.scan_parquet(path)
    if facts.kind is FileKind.CSV:
        schema = {name: pl.String for name in facts.columns}
        return pl.scan_csv(path, schema=schema, has_header=True, quote_char='"')
    schema: dict[str, pl.DataType] = {name: pl.String() for name in spec.required_columns}
    if spec.mapping.hash_ids is not None:
        schema[spec.mapping.hash_ids] = _HASH_DTYPE
    return pl.scan_ndjson(path, schema=schema)


def _decode_hash_strings(path: Path, frame: pl.DataFrame, column: str) -> pl.DataFrame:
    """A CSV hash column holds JSON arrays as text, e.g. "[3, 17, 42]"."""
    raw = frame[column]
    try:
        decoded = raw.str.json_decode(_HASH_DTYPE) if raw.null_count() < len(raw) else raw
        return frame.with_columns(decoded.cast(_HASH_DTYPE).alias(column))
    except pl.exceptions.PolarsError:
        row, text = _first_bad_hash_text(frame[ROW].to_list(), raw.to_list())
    raise TraceFormatError(
        path,
        f"found {text!r:.60}; expected a JSON list of integer block hashes, e.g. [3, 17, 42]",
        row=row,
        column=column,
    )


def _first_bad_hash_text(rows: list[int], texts: list[str | None]) -> tuple[int | None, str]:
    for index, text in zip(rows, texts, strict=True):
        if text is None:
            continue
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            return index + 1, text
        if not (isinstance(value, list) and all(type(v) is int for v in value)):
            return index + 1, text
    return None, "a value polars could not decode"


def _diagnose(path: Path, facts: FileFacts, spec: FormatSpec, exc: Exception) -> TraceFormatError:
    found = _find_csv_row(path, facts) if facts.kind is FileKind.CSV else None
    if facts.kind is FileKind.JSONL:
        found = _find_jsonl_row(path, spec)
    if found is not None:
        return found
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return TraceFormatError(path, f"cannot read the {facts.kind.value} file: {first}")


def _find_csv_row(path: Path, facts: FileFacts) -> TraceFormatError | None:
    expected = len(facts.columns)
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh)
        row_no = 0
        try:
            next(reader, None)
            for row_no, fields in enumerate(reader, start=1):
                if fields and len(fields) != expected:
                    return TraceFormatError(
                        path,
                        f"found {len(fields)} fields; expected {expected} as in the header "
                        f"{clip_list(facts.columns)}",
                        row=row_no,
                    )
        except csv.Error as exc:
            return TraceFormatError(path, f"malformed CSV: {exc}", row=row_no + 1)
    return None


def _find_jsonl_row(path: Path, spec: FormatSpec) -> TraceFormatError | None:
    hash_col = spec.mapping.hash_ids
    with path.open(encoding="utf-8-sig") as fh:
        records = (line for line in fh if line.strip())
        for row_no, line in enumerate(records, start=1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                return TraceFormatError(
                    path, f"invalid JSON ({exc.msg}); expected one JSON object per line", row=row_no
                )
            except RecursionError:
                return TraceFormatError(path, TOO_DEEP, row=row_no)
            if not isinstance(record, dict):
                kind = type(record).__name__
                return TraceFormatError(
                    path, f"found a JSON {kind}; expected one JSON object per line", row=row_no
                )
            for column in spec.required_columns:
                value = record.get(column)
                if column == hash_col:
                    ok = value is None or (
                        isinstance(value, list)
                        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
                    )
                    expected = "a list of integer block hashes"
                else:
                    ok = not isinstance(value, dict | list)
                    expected = "a number or string"
                if not ok:
                    return TraceFormatError(
                        path,
                        f"found {json.dumps(value)[:60]}; expected {expected}",
                        row=row_no,
                        column=column,
                    )
    return None
