"""One streaming pass over the raw bytes: size limit, content hash, binary and encoding checks.

Also reads the column names (CSV header, first JSONL record's keys, Parquet
schema) that format detection needs, and refuses a text file cut off inside its
last record (no line end after it, and a CSV row short of the header's fields or
a JSONL line that is not complete JSON): such a row would otherwise be read with
its last value cut short. Nothing else here parses data rows.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from optimizer.traces.errors import TraceFormatError, clip, clip_list
from optimizer.traces.formats import FileKind

_CHUNK_BYTES = 8 << 20
TOO_DEEP = "JSON nested too deeply; expected one flat JSON object per line"
_HEAD_BYTES = 1 << 20  # enough for a header line or a first JSONL record
_JSONL_SUFFIXES = {".jsonl", ".ndjson", ".json"}
_PARQUET_SUFFIXES = {".parquet", ".pq"}
_PARQUET_MAGIC = b"PAR1"
_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGIC = b"PK\x03\x04"
_BOM = "\ufeff"
_CONTROL_CHARS = re.compile("[\x00-\x08\x0b\x0e-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class FileFacts:
    """What the byte-level pass learned about a trace file."""

    kind: FileKind
    num_bytes: int
    content_hash: str  # sha256 hex of the file bytes
    columns: tuple[str, ...]  # header names / first record's keys / parquet columns


def inspect_file(path: Path, max_bytes: int) -> FileFacts:
    """Check the raw file and return its kind, hash and column names (TraceFormatError if bad)."""
    if path.is_dir():
        raise TraceFormatError(
            path, "is a folder; expected a trace file (CSV, JSONL or Parquet) inside it"
        )
    if not path.is_file():
        raise TraceFormatError(path, "no such file (expected a readable trace file)")
    num_bytes = path.stat().st_size
    if num_bytes > max_bytes:
        raise TraceFormatError(
            path, f"file is {num_bytes:,} bytes; the size limit is {max_bytes:,} bytes"
        )
    if num_bytes == 0:
        raise TraceFormatError(path, "empty file (0 bytes); expected a header and data rows")
    with path.open("rb") as fh:
        head = fh.read(_HEAD_BYTES)
    if head.startswith(_PARQUET_MAGIC):
        return FileFacts(FileKind.PARQUET, num_bytes, _hash_only(path), _parquet_columns(path))
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise TraceFormatError(
            path, "UTF-16 text (it starts with a UTF-16 byte-order mark); re-encode it as UTF-8"
        )
    if head.startswith(_GZIP_MAGIC) or head.startswith(_ZIP_MAGIC):
        raise TraceFormatError(
            path, "file is compressed (gzip/zip); decompress it to CSV or JSONL first"
        )
    content_hash, num_lines, last_newline = _hash_text(path)
    text_head = head.decode("utf-8", errors="ignore").lstrip(_BOM)
    control = _CONTROL_CHARS.search(text_head)
    if control is not None:
        raise TraceFormatError(
            path,
            f"binary data: control character {control.group()!r} at character "
            f"{control.start()}; expected a UTF-8 text CSV/JSONL file or a Parquet file",
        )
    if not text_head.strip():
        raise TraceFormatError(path, "empty file (only whitespace); expected data rows")
    kind = _text_kind(path, text_head)
    columns = _jsonl_keys(path) if kind is FileKind.JSONL else _csv_header(path)
    if last_newline + 1 < num_bytes:
        _check_last_line(path, kind, columns, last_newline + 1, num_lines + 1)
    return FileFacts(kind, num_bytes, content_hash, columns)


def _hash_only(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _hash_text(path: Path) -> tuple[str, int, int]:
    """sha256 of the bytes, rejecting NUL bytes (binary data) and invalid UTF-8 on the way;
    also the number of line ends and the byte offset of the last one (-1: none)."""
    digest = hashlib.sha256()
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    num_lines = 0
    last_newline = -1
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK_BYTES):
            digest.update(chunk)
            nul = chunk.find(b"\x00")
            if nul >= 0:
                line = num_lines + chunk.count(b"\n", 0, nul) + 1
                raise TraceFormatError(
                    path,
                    f"binary data: NUL byte at byte offset {offset + nul} (line {line}); "
                    "expected a UTF-8 text CSV/JSONL file or a Parquet file",
                )
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as exc:
                line = num_lines + chunk.count(b"\n", 0, exc.start) + 1
                bad = chunk[exc.start : exc.start + 1].hex()
                raise TraceFormatError(
                    path,
                    f"not UTF-8: byte 0x{bad} at byte offset {offset + exc.start} "
                    f"(line {line}); expected UTF-8 text (re-encode the file, e.g. from "
                    "Latin-1 or UTF-16)",
                ) from None
            num_lines += chunk.count(b"\n")
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                last_newline = offset + newline
            offset += len(chunk)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise TraceFormatError(
            path, "not UTF-8: the file ends inside a multi-byte character; expected UTF-8 text"
        ) from None
    return digest.hexdigest(), num_lines, last_newline


def _check_last_line(
    path: Path, kind: FileKind, columns: tuple[str, ...], start: int, line_no: int
) -> None:
    """Refuse a file whose unterminated last line (from byte `start`) is cut mid-record.

    A complete last line without a line end is fine. CSV: the last record has fewer
    fields than the header, or ends inside a quoted field. JSONL: the last line is
    not complete JSON. A file of one line is left to the header / first-record checks.
    """
    if start == 0:
        return
    with path.open("rb") as fh:
        fh.seek(start)
        text = fh.read().decode("utf-8")
    if not text.strip() or text.endswith("\r"):
        return
    where = f"the last line (line {line_no})"
    cut = "with no line end after it: the file looks cut off mid-record; send the complete file"
    if kind is FileKind.JSONL:
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(
                path, f"{where} is not complete JSON ({exc.msg}), {cut}"
            ) from None
        except RecursionError:
            pass  # complete or not, the row pass names it
        return
    fields = _last_csv_record(path, where, cut) if '"' in text else next(csv.reader([text]), [])
    if fields is not None and len(fields) < len(columns):
        raise TraceFormatError(
            path, f"{where} has {len(fields)} of the header's {len(columns)} fields, {cut}"
        )


def _last_csv_record(path: Path, where: str, cut: str) -> list[str] | None:
    """The file's last CSV record (a full pass, only for a last line with quotes);
    TraceFormatError when the file ends inside a quoted field; None when an earlier
    malformed row stops the pass (the row pass names it)."""
    last: list[str] = []
    with path.open(encoding="utf-8-sig", newline="") as fh:
        try:
            for fields in csv.reader(fh, strict=True):
                last = fields
        except csv.Error as exc:
            if "unexpected end of data" in str(exc):
                raise TraceFormatError(path, f"{where} ends inside a quoted field, {cut}") from None
            return None
    return last


def _text_kind(path: Path, text_head: str) -> FileKind:
    suffix = path.suffix.lower()
    if suffix in _JSONL_SUFFIXES:
        return FileKind.JSONL
    if suffix == ".csv":
        return FileKind.CSV
    return FileKind.JSONL if text_head.lstrip().startswith("{") else FileKind.CSV


def _csv_header(path: Path) -> tuple[str, ...]:
    """The header line, read whole however long (the file is within the size limit)."""
    with path.open(encoding="utf-8-sig", newline="") as fh:
        line = fh.readline()
    try:
        names = tuple(next(csv.reader([line]), []))
    except csv.Error as exc:
        raise TraceFormatError(path, f"the header line is not valid CSV: {exc}") from None
    if not any(name.strip() for name in names):
        raise TraceFormatError(path, "the first line is blank; expected a CSV header line")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise TraceFormatError(
                path,
                f"duplicate column {clip(name)!r} in the header {clip_list(names)}; "
                "expected each column name once",
                column=name,
            )
        seen.add(name)
    return names


def ragged_row(path: Path, row: int) -> tuple[int, int] | None:
    """(fields, header fields) when CSV data row `row` (1-based) has another number of
    fields than the header; None otherwise, or when the file is not CSV."""
    if path.suffix.lower() in _JSONL_SUFFIXES:
        return None
    try:
        with path.open(encoding="utf-8-sig", newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, [])
            for i, fields in enumerate(reader, start=1):
                if i == row:
                    return (len(fields), len(header)) if len(fields) != len(header) else None
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return None


def _reject_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [key for key, _ in pairs]
    for key in keys:
        if keys.count(key) > 1:
            raise _DuplicateKeyError(key)
    return dict(pairs)


class _DuplicateKeyError(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _first_record_line(path: Path) -> str:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                return line.lstrip(_BOM)
    return ""


def _jsonl_keys(path: Path) -> tuple[str, ...]:
    line = _first_record_line(path)
    try:
        record = json.loads(line, object_pairs_hook=_reject_duplicate_keys)
    except _DuplicateKeyError as exc:
        raise TraceFormatError(
            path,
            f"duplicate key {clip(exc.key)!r} in the first record; expected each key once",
            row=1,
            column=exc.key,
        ) from None
    except json.JSONDecodeError as exc:
        raise TraceFormatError(
            path, f"invalid JSON ({exc.msg}); expected one JSON object per line", row=1
        ) from None
    except RecursionError:
        raise TraceFormatError(path, TOO_DEEP, row=1) from None
    if not isinstance(record, dict):
        raise TraceFormatError(
            path,
            f"found a JSON {type(record).__name__}; expected one JSON object per line",
            row=1,
        )
    return tuple(record)


def _parquet_columns(path: Path) -> tuple[str, ...]:
    try:
        return tuple(pl.read_parquet_schema(path))
    except Exception as exc:  # any reader failure means "not readable parquet"
        raise TraceFormatError(
            path, f"not a readable Parquet file ({type(exc).__name__}: {exc})"
        ) from None
