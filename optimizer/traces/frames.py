"""Lazy scans with declared schemas: a trace file to a frame of its raw mapped columns.

CSV and JSONL scalar columns are declared as strings, so one bad cell never
aborts the scan; `parse.py` casts them with strict=False and reports the first
offending row. When the scan itself fails (a ragged CSV row, a broken JSON
line), a slow pure-Python pass finds the row to report; it only runs on that
error path.

`hash_ids` is a list of integer block hashes, in JSONL a JSON list and in CSV the
JSON list's text. It may also be an object of named lists, one per prompt part,
e.g. {"system": [1, 2], "context": [3], "question": [4, 5]}: the lists are joined
in the object's key order as written (here [1, 2, 3, 4, 5]), and each must hold
non-negative integers. Such a JSONL file fails the fast scan (hash_ids declared
a list); it is scanned again without that column, which is then read and checked
in Python (a slower path, taken only for such files and on errors).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import polars as pl

from optimizer.traces.errors import TraceFormatError, clip, clip_list
from optimizer.traces.formats import FileKind, FormatSpec
from optimizer.traces.sniff import TOO_DEEP, FileFacts

ROW = "__row"  # 0-based data row, kept through repairs so errors can name the file row

_HASH_DTYPE = pl.List(pl.Int64)
_MAX_HASH = 2**63 - 1
_HASH_EXPECTED = "a list of integer block hashes, or an object of such lists (one per prompt part)"


def load_frame(path: Path, facts: FileFacts, spec: FormatSpec, max_rows: int) -> pl.DataFrame:
    """The mapped columns (and ROW) of at most max_rows + 1 data rows."""
    hash_col = spec.mapping.hash_ids
    try:
        frame = _collect(path, facts, spec, max_rows, hash_as_text=False)
    except pl.exceptions.PolarsError as exc:
        if facts.kind is not FileKind.JSONL or hash_col is None:
            raise _diagnose(path, facts, spec, exc) from None
        try:  # e.g. hash_ids as objects of named lists: read that column in Python
            frame = _collect(path, facts, spec, max_rows, hash_as_text=True)
        except pl.exceptions.PolarsError as exc:
            raise _diagnose(path, facts, spec, exc) from None
        values = _jsonl_hash_values(path, hash_col, frame.height)
        return frame.with_columns(_joined_hashes(path, hash_col, values))
    if hash_col is not None and frame.schema[hash_col] == pl.String:
        frame = _decode_hash_strings(path, frame, hash_col)
    return frame


def _collect(
    path: Path, facts: FileFacts, spec: FormatSpec, max_rows: int, *, hash_as_text: bool
) -> pl.DataFrame:
    lazy = _scan(path, facts, spec, hash_as_text).select(list(spec.required_columns))
    return lazy.with_row_index(ROW).head(max_rows + 1).collect()


def _scan(path: Path, facts: FileFacts, spec: FormatSpec, hash_as_text: bool) -> pl.LazyFrame:
    if facts.kind is FileKind.PARQUET:
        return pl.scan_parquet(path)
    if facts.kind is FileKind.CSV:
        schema = {name: pl.String for name in facts.columns}
        return pl.scan_csv(path, schema=schema, has_header=True, quote_char='"')
    schema: dict[str, pl.DataType] = {name: pl.String() for name in spec.required_columns}
    if spec.mapping.hash_ids is not None and not hash_as_text:
        schema[spec.mapping.hash_ids] = _HASH_DTYPE
    return pl.scan_ndjson(path, schema=schema)


class _BadHashes(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _is_hash_list(value: object, *, low: int) -> bool:
    return isinstance(value, list) and all(type(v) is int and low <= v <= _MAX_HASH for v in value)


def _join_hash_ids(value: object) -> list[int] | None:
    """One row's decoded hash_ids as one list: a list as it is, an object's named lists
    joined in key order; None stays None (missing). _BadHashes says what is wrong."""
    if value is None:
        return None
    if isinstance(value, list) and _is_hash_list(value, low=-_MAX_HASH - 1):
        return value
    if not isinstance(value, dict):
        raise _BadHashes(f"found {clip(json.dumps(value), 60)}; expected {_HASH_EXPECTED}")
    joined: list[int] = []
    for key, part in value.items():
        if not _is_hash_list(part, low=0):
            raise _BadHashes(
                f"key {clip(key, 60)!r} holds {clip(json.dumps(part), 60)}; expected a list "
                "of non-negative integer block hashes"
            )
        joined.extend(part)
    return joined


def _decode_hash_strings(path: Path, frame: pl.DataFrame, column: str) -> pl.DataFrame:
    """A CSV hash column holds JSON arrays as text, e.g. "[3, 17, 42]", or JSON objects
    of named lists (decoded and joined in Python)."""
    raw = frame[column]
    if raw.str.strip_chars_start().str.starts_with("{").any():
        values = _csv_hash_values(path, frame, column)
        return frame.with_columns(_joined_hashes(path, column, values))
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


def _joined_hashes(path: Path, column: str, values: Iterable[tuple[int, object]]) -> pl.Series:
    """(0-based row, decoded hash_ids) pairs checked and joined into one list per row."""
    joined: list[list[int] | None] = []
    for index, value in values:
        try:
            joined.append(_join_hash_ids(value))
        except _BadHashes as exc:
            raise TraceFormatError(path, exc.message, row=index + 1, column=column) from None
    return pl.Series(column, joined, dtype=_HASH_DTYPE)


def _csv_hash_values(path: Path, frame: pl.DataFrame, column: str) -> Iterator[tuple[int, object]]:
    for index, text in zip(frame[ROW].to_list(), frame[column].to_list(), strict=True):
        try:
            yield index, None if text is None else json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            raise TraceFormatError(
                path,
                f"found {clip(text, 60)!r}; expected {_HASH_EXPECTED}",
                row=index + 1,
                column=column,
            ) from None


def _jsonl_hash_values(path: Path, column: str, num_rows: int) -> Iterator[tuple[int, object]]:
    """`column` of the first `num_rows` records, read from the file as written (the scan's
    JSON text of it is not exact: it writes 1.0 as 1)."""
    with path.open(encoding="utf-8-sig") as fh:
        records = (line for line in fh if line.strip())
        for index, line in zip(range(num_rows), records, strict=False):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(
                    path,
                    f"invalid JSON ({exc.msg}); expected one JSON object per line",
                    row=index + 1,
                ) from None
            except RecursionError:
                raise TraceFormatError(path, TOO_DEEP, row=index + 1) from None
            yield index, record.get(column) if isinstance(record, dict) else None


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
                    try:
                        _join_hash_ids(value)
                    except _BadHashes as exc:
                        return TraceFormatError(path, exc.message, row=row_no, column=column)
                elif isinstance(value, dict | list):
                    return TraceFormatError(
                        path,
                        f"found {json.dumps(value)[:60]}; expected a number or string",
                        row=row_no,
                        column=column,
                    )
    return None
