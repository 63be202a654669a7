"""Raw mapped columns to validated numpy arrays, naming the first bad row on failure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from optimizer.traces.errors import TraceFormatError, clip
from optimizer.traces.formats import TimeUnit
from optimizer.traces.frames import ROW
from optimizer.traces.sniff import ragged_row

# Tried in order on datetime strings until every row parses (first = Azure's own form).
DATETIME_FORMATS = (
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y-%m-%dT%H:%M:%S%.f",
    "%Y-%m-%d %H:%M:%S%.f%#z",
    "%Y-%m-%dT%H:%M:%S%.f%#z",
)
# The most tokens one request may have: what a 32-bit database column holds (PostgreSQL's
# integer), far above any context length. The same limit on every back-end.
MAX_TOKENS = 2**31 - 1
MAX_ABS_TIME_S = 1e11
MAX_SPAN_S = 10 * 31_557_600.0  # ten years
_UNIT_SCALE = {TimeUnit.S: 1.0, TimeUnit.MS: 1e-3, TimeUnit.US: 1e-6}


def _raise_at(path: Path, frame: pl.DataFrame, bad: pl.Series, column: str, expected: str) -> None:
    """Raise for the first row where `bad` is true, quoting the raw value."""
    index = int(bad.arg_true()[0])
    raw = frame[column][index]
    row = int(frame[ROW][index]) + 1
    if raw is None:
        ragged = ragged_row(path, row)
        if ragged is not None:  # a missing field, not an empty one
            raise TraceFormatError(
                path, f"found {ragged[0]} fields; expected {ragged[1]} as in the header", row=row
            )
    found = "an empty value" if raw is None else repr(clip(raw))
    raise TraceFormatError(path, f"found {found}; expected {expected}", row=row, column=column)


def _require_present(path: Path, frame: pl.DataFrame, column: str, expected: str) -> None:
    missing = frame[column].is_null()
    if missing.any():
        _raise_at(path, frame, missing, column, expected)


def numbers(path: Path, frame: pl.DataFrame, column: str, expected: str) -> pl.Series:
    """A column as finite Float64 (strings parsed; blanks and junk rejected)."""
    _require_present(path, frame, column, expected)
    raw = frame[column]
    if raw.dtype == pl.String:
        values = raw.cast(pl.Float64, strict=False)
        if values.null_count():
            values = raw.str.strip_chars().cast(pl.Float64, strict=False)
    elif raw.dtype.is_numeric():
        values = raw.cast(pl.Float64)
    else:
        raise TraceFormatError(
            path, f"found values of type {raw.dtype}; expected {expected}", column=column
        )
    bad = values.is_null() | ~values.is_finite()
    if bad.any():
        _raise_at(path, frame, bad, column, expected)
    return values


def token_counts(path: Path, frame: pl.DataFrame, column: str) -> np.ndarray:
    """Whole-number token counts as int64 (positivity is checked after documented drops)."""
    expected = f"a positive whole number of tokens, at most {MAX_TOKENS:,}"
    values = numbers(path, frame, column, expected)
    bad = (values != values.floor()) | (values.abs() > MAX_TOKENS)
    if bad.any():
        _raise_at(path, frame, bad, column, expected)
    return values.cast(pl.Int64).to_numpy()


def require_positive(
    path: Path, frame: pl.DataFrame, column: str, counts: np.ndarray, rows: np.ndarray
) -> None:
    """Reject zero or negative counts; `rows` maps each count to its 0-based file row."""
    bad = np.flatnonzero(counts <= 0)
    if bad.size:
        first = int(bad[0])
        raise TraceFormatError(
            path,
            f"found {int(counts[first])} tokens; expected a positive whole number of tokens",
            row=int(rows[first]) + 1,
            column=column,
        )


def arrival_seconds(
    path: Path, frame: pl.DataFrame, column: str, unit: TimeUnit, datetime_format: str | None
) -> np.ndarray:
    """Arrivals in seconds as float64, relative to the earliest one (any order). Times must
    be physical: within +-1e11 s of zero (Unix times in s, ms or us are) and spanning at
    most `MAX_SPAN_S`."""
    if unit is not TimeUnit.DATETIME:
        expected = f"a number of {unit.value} (arrival time)"
        values = numbers(path, frame, column, expected)
        scaled = values * _UNIT_SCALE[unit]
        far = scaled.abs() > MAX_ABS_TIME_S
        if far.any():
            _raise_at(path, frame, far, column, f"{expected} within +-1e11 s of zero")
        seconds = scaled.to_numpy()
        rel = seconds - seconds.min()
    else:
        epoch_ns = _datetime_ns(path, frame, column, datetime_format)
        rel = (epoch_ns - epoch_ns.min()).astype(np.float64) * 1e-9
    span = float(rel.max()) if rel.size else 0.0
    if span > MAX_SPAN_S:
        raise TraceFormatError(
            path,
            f"arrival times span {span:.3g} s ({span / 31_557_600:.3g} years); expected a trace "
            f"of at most {MAX_SPAN_S / 31_557_600:g} years (check --arrival-unit)",
            column=column,
        )
    return rel


def _datetime_ns(
    path: Path, frame: pl.DataFrame, column: str, datetime_format: str | None
) -> np.ndarray:
    expected = f"a datetime like 2023-11-16 18:17:03.9799600 ({datetime_format or 'ISO 8601'})"
    _require_present(path, frame, column, expected)
    raw = frame[column]
    if isinstance(raw.dtype, pl.Datetime):
        return raw.dt.epoch("ns").to_numpy()
    if raw.dtype != pl.String:
        raise TraceFormatError(
            path, f"found values of type {raw.dtype}; expected {expected}", column=column
        )
    formats = [datetime_format] if datetime_format else []
    formats += [fmt for fmt in DATETIME_FORMATS if fmt != datetime_format]
    parsed: pl.Series | None = None
    for fmt in formats:
        attempt = raw.str.to_datetime(fmt, strict=False, time_unit="ns").dt.epoch("ns")
        parsed = attempt if parsed is None else parsed.fill_null(attempt)
        if not parsed.null_count():
            return parsed.to_numpy()
    assert parsed is not None
    _raise_at(path, frame, parsed.is_null(), column, expected)
    raise AssertionError("unreachable")


def hash_lists(path: Path, frame: pl.DataFrame, column: str) -> list[np.ndarray]:
    """Per-row int64 prefix block hashes (an empty list is allowed, a missing one is not)."""
    _require_present(path, frame, column, "a list of integer block hashes")
    series = frame[column]
    lengths = series.list.len().to_numpy()
    flat = series.explode(empty_as_null=False)
    if flat.null_count():
        row_of_null = np.repeat(np.arange(len(series)), lengths)[flat.is_null().to_numpy()][0]
        raise TraceFormatError(
            path,
            "found a null inside hash_ids; expected integer block hashes",
            row=int(frame[ROW][int(row_of_null)]) + 1,
            column=column,
        )
    offsets = np.cumsum(lengths)[:-1]
    return np.split(flat.to_numpy().astype(np.int64, copy=False), offsets)


def session_ids(frame: pl.DataFrame, column: str) -> list[str | None]:
    return frame[column].cast(pl.String).to_list()


def acceptance_lengths(path: Path, frame: pl.DataFrame, column: str) -> np.ndarray:
    """Tokens per speculative step, >= 1; a blank cell means unknown (nan)."""
    raw = frame[column]
    expected = "a number of tokens per speculative step >= 1"
    values = raw.cast(pl.Float64, strict=False) if raw.dtype == pl.String else raw
    if not values.dtype.is_numeric():
        raise TraceFormatError(path, f"found type {raw.dtype}; expected {expected}", column=column)
    values = values.cast(pl.Float64)
    bad = (values.is_null() & raw.is_not_null()) | (values < 1.0).fill_null(False)
    if bad.any():
        _raise_at(path, frame, bad, column, expected)
    return values.fill_null(float("nan")).to_numpy()
