"""The trace formats we read: one declared column spec per format, and auto-detection.

Every format, including a user-described generic file, is a `ColumnMapping` from
file columns (CSV header names, JSONL keys or Parquet columns) to the fields of a
trace. Detection compares the file's column names with each format's required
columns; the format whose columns are all present and that matches the most
columns wins (Qwen is Mooncake plus `chat_id`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from optimizer.records import TraceFormat
from optimizer.traces.errors import TraceFormatError, clip_list


class TimeUnit(StrEnum):
    """How an arrival column is written: a number in s/ms/us, or a datetime string."""

    S = "s"
    MS = "ms"
    US = "us"
    DATETIME = "datetime"


class FileKind(StrEnum):
    CSV = "csv"
    JSONL = "jsonl"
    PARQUET = "parquet"


@dataclass(frozen=True, slots=True)
class ColumnMapping:
    """Which file columns hold a trace's fields (the generic format; also each known one).

    `block_size` is the number of tokens per `hash_ids` block (Mooncake 512,
    Qwen 16); when None it is inferred from the data. `datetime_format` is a
    chrono/strftime pattern for DATETIME arrivals; None tries the common ISO forms.
    """

    arrival: str
    input_tokens: str
    output_tokens: str
    time_unit: TimeUnit = TimeUnit.S
    hash_ids: str | None = None
    session_id: str | None = None
    acceptance_length: str | None = None
    block_size: int | None = None
    datetime_format: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "time_unit", TimeUnit(self.time_unit))
        names = self.columns
        if any(not name for name in names):
            raise ValueError(f"column mapping has an empty column name: {names}")
        if len(set(names)) != len(names):
            raise ValueError(f"column mapping names a column twice: {names}")
        if self.block_size is not None and self.block_size <= 0:
            raise ValueError(f"block_size must be a positive token count, got {self.block_size}")

    @property
    def columns(self) -> tuple[str, ...]:
        """The file columns this mapping reads, required ones first."""
        optional = (self.hash_ids, self.session_id, self.acceptance_length)
        required = (self.arrival, self.input_tokens, self.output_tokens)
        return required + tuple(name for name in optional if name is not None)


@dataclass(frozen=True, slots=True)
class FormatSpec:
    """A known trace format: its columns and the repairs that apply to it."""

    format: TraceFormat
    mapping: ColumnMapping
    drop_zero_output: bool = False  # BurstGPT: failed requests carry 0 response tokens

    @property
    def required_columns(self) -> tuple[str, ...]:
        return self.mapping.columns

    def describe(self) -> str:
        unit = self.mapping.time_unit
        cols = ", ".join(self.required_columns)
        return f"{self.format.value} ({cols}; {self.mapping.arrival} in {unit.value})"


FORMAT_SPECS: dict[TraceFormat, FormatSpec] = {
    spec.format: spec
    for spec in (
        FormatSpec(
            TraceFormat.AZURE,
            ColumnMapping(
                "TIMESTAMP",
                "ContextTokens",
                "GeneratedTokens",
                TimeUnit.DATETIME,
                datetime_format="%Y-%m-%d %H:%M:%S%.f",
            ),
        ),
        FormatSpec(
            TraceFormat.SPLITWISE,
            ColumnMapping("arrived_at", "num_prefill_tokens", "num_decode_tokens", TimeUnit.S),
        ),
        FormatSpec(
            TraceFormat.MOONCAKE,
            ColumnMapping(
                "timestamp",
                "input_length",
                "output_length",
                TimeUnit.MS,
                hash_ids="hash_ids",
                block_size=512,
            ),
        ),
        FormatSpec(
            TraceFormat.BURSTGPT,
            ColumnMapping("Timestamp", "Request tokens", "Response tokens", TimeUnit.S),
            drop_zero_output=True,
        ),
        FormatSpec(
            TraceFormat.QWEN,
            ColumnMapping(
                "timestamp",
                "input_length",
                "output_length",
                TimeUnit.S,
                hash_ids="hash_ids",
                session_id="chat_id",
                block_size=16,
            ),
        ),
        FormatSpec(
            TraceFormat.SERVETUNE,
            ColumnMapping("arrival_s", "input_tokens", "output_tokens", TimeUnit.S),
        ),
    )
}

NATIVE_OPTIONAL_ACCEPT = "acceptance_length"


def with_native_optionals(spec: FormatSpec, names: Sequence[str]) -> FormatSpec:
    """The native format's spec extended with the optional columns the file has."""
    if spec.format is not TraceFormat.SERVETUNE:
        return spec
    present = set(names)
    m = spec.mapping
    return FormatSpec(
        spec.format,
        ColumnMapping(
            m.arrival,
            m.input_tokens,
            m.output_tokens,
            m.time_unit,
            hash_ids="hash_ids" if "hash_ids" in present else None,
            session_id="session_id" if "session_id" in present else None,
            acceptance_length=(
                NATIVE_OPTIONAL_ACCEPT if NATIVE_OPTIONAL_ACCEPT in present else None
            ),
        ),
    )


def generic_spec(mapping: ColumnMapping) -> FormatSpec:
    return FormatSpec(TraceFormat.GENERIC, mapping)


def generic_mapping(
    format: TraceFormat | None,
    *,
    arrival: str | None = None,
    input_tokens: str | None = None,
    output_tokens: str | None = None,
    arrival_unit: str | None = None,
) -> ColumnMapping | None:
    """The generic column mapping named by `servetune traces import --arrival --input
    --output --arrival-unit`, and by the REST upload's form fields `arrival`, `input`,
    `output` and `arrival_unit` (the one place both build it).

    None when no column is named and `format` is not GENERIC: a known format, forced or
    detected. Columns without a format imply GENERIC. ValueError, with a message naming
    the options, when only some columns are named, the unit is unknown, a column is
    named twice, or any of them comes with a format other than generic.
    """
    options = {"arrival": arrival, "input": input_tokens, "output": output_tokens}
    given = [name for name, value in options.items() if value]
    if format not in (None, TraceFormat.GENERIC):
        named = given + (["arrival_unit"] if arrival_unit else [])
        if named:
            raise ValueError(
                f"{', '.join(named)}: only for format generic (a column mapping); format "
                f"{format.value} has its own columns (drop them, or use format generic)"
            )
        return None
    if not given and format is None:
        if arrival_unit:
            raise ValueError("arrival_unit needs the columns arrival, input and output")
        return None
    missing = [name for name, value in options.items() if not value]
    if missing:
        raise ValueError(
            "a generic trace needs the column names arrival, input and output "
            f"(missing: {', '.join(missing)})"
        )
    try:
        unit = TimeUnit(arrival_unit or TimeUnit.S)
    except ValueError:
        allowed = ", ".join(u.value for u in TimeUnit)
        raise ValueError(f"arrival_unit {arrival_unit!r}: expected one of {allowed}") from None
    assert arrival and input_tokens and output_tokens
    return ColumnMapping(arrival, input_tokens, output_tokens, time_unit=unit)


def known_formats_text() -> str:
    """One line per format and its expected columns, for error messages."""
    lines = [spec.describe() for spec in FORMAT_SPECS.values()]
    lines.append("generic (any CSV/JSONL/Parquet columns, given by a ColumnMapping)")
    return "; ".join(lines)


def check_columns(path: str | Path, spec: FormatSpec, names: Sequence[str]) -> None:
    """Raise TraceFormatError naming the first column `spec` needs that the file lacks."""
    present = set(names)
    missing = [col for col in spec.required_columns if col not in present]
    if missing:
        raise TraceFormatError(
            path,
            f"missing column(s) {missing} for format {spec.format.value}; "
            f"expected columns {clip_list(spec.required_columns)}, found {clip_list(names)}",
            column=missing[0],
        )


def detect_format(path: str | Path, names: Sequence[str]) -> FormatSpec:
    """The known format whose required columns the file has (the most specific one).

    When no format is complete but one matches at least two of its columns, the
    file is taken to be that format with a column missing, which is the more
    useful error; otherwise the error lists every format and its columns.
    """
    present = set(names)
    best: tuple[int, int, FormatSpec] | None = None
    for spec in FORMAT_SPECS.values():
        required = spec.required_columns
        num_found = sum(col in present for col in required)
        key = (num_found, num_found - len(required), spec)
        if best is None or key[:2] > best[:2]:
            best = key
    assert best is not None
    num_found, num_short, spec = best
    if num_short == 0:
        return spec
    if num_found >= 2:
        check_columns(path, spec, names)
    raise TraceFormatError(
        path,
        f"unknown trace format: columns {clip_list(names)} match no known format; "
        f"expected one of: {known_formats_text()}",
    )
