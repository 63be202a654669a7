"""Trace ingest: parse, validate and normalise request traces, and compute their statistics.

Formats (auto-detected from the CSV header or the first JSONL record's keys;
`format=` forces one):

- azure: TIMESTAMP (datetime `2023-11-16 18:17:03.9799600`, no zone; ISO `T` and
  `+00:00` forms also accepted), ContextTokens, GeneratedTokens.
- splitwise (Vidur processed): arrived_at (s), num_prefill_tokens, num_decode_tokens.
- mooncake: timestamp (ms), input_length, output_length, hash_ids (512-token blocks).
- burstgpt: Timestamp (s), Request tokens, Response tokens (Model, Total tokens and
  Log Type are not needed).
- qwen: timestamp (assumed float seconds), input_length, output_length, hash_ids
  (16-token blocks), chat_id (session id).
- generic: any CSV / JSONL / Parquet whose columns a `ColumnMapping` names, with
  arrivals in s, ms, us or datetime.

Extra columns are ignored. Output: `arrival_s` float64 from 0 (the first
request), sorted by arrival (stable); token counts int64 > 0; hash_ids as int64
arrays; chat_id (or the mapped session column) as session ids.

hash_ids is a JSON list of integer block hashes (in CSV, its text), or an object of
named lists, one per prompt part: {"system": [1, 2], "context": [3], "question":
[4, 5]} is read as [1, 2, 3, 4, 5], the lists joined in the object's key order as
written in the file; each named list must hold non-negative integers.

A generic mapping from the CLI's `--arrival --input --output --arrival-unit` or the
REST upload's form fields of the same names is built by `generic_mapping`.

Rejected with `TraceFormatError` (path, 1-based data row, column, what was found
and what was expected), nothing returned:
- file missing, empty (0 bytes or whitespace only), or over `IngestLimits.max_bytes`;
- binary data (a NUL byte, a gzip/zip file, an unreadable Parquet file);
- not UTF-8 (the byte offset and line are named);
- CSV header only / JSONL without records; more than `IngestLimits.max_rows` rows;
- unknown format (no format's columns all present: the error lists every format
  and its columns), a missing column (the detected or forced format's columns are
  named), a duplicate column in the header or a duplicate key in the first record;
- a ragged CSV row (wrong number of fields) or an invalid JSON line;
- a file cut off mid-record: no line end after the last line, and that line a CSV
  row short of the header's fields (or inside a quoted field) or not complete JSON
  (a complete last line without a line end is accepted);
- an empty, non-numeric or non-finite arrival or token value; a fractional token count;
- an unparseable timestamp (datetime formats);
- zero or negative token counts (apart from the BurstGPT repair below);
- hash_ids that are neither a list of integers nor an object of lists of
  non-negative integers (the row and the object's key are named); an acceptance
  length below 1.

Repaired, with a warning in `ParsedTrace.warnings` (also stored in the stats):
- unsorted timestamps: stable sort by arrival (ties keep file order);
- BurstGPT failed requests (0 `Response tokens`): dropped, counted in
  `num_dropped` (a file of only failed rows is rejected);
- hash_ids whose length is not ceil(input tokens / block size): kept, counted.
Accepted as they are: duplicate timestamps, quantised timestamps, blank lines in
JSONL, a UTF-8 byte-order mark, whitespace around numbers, `12.0` as a token count.

Warned, and stored all the same (`ParsedTrace.plausibility_warnings`, typed
`TraceWarning`s stored with the trace): figures real traffic hardly shows, with the
thresholds and their reasons in `optimizer.traces.plausibility`: a mean request rate
above 1,000 req/s (or a busiest second above it), many requests at one instant, under
0.01 req/s over more than a day, a request longer than any model's context. With a
numeric arrival column a rate warning says what the trace would be in the other units
(ms stamps read as us: "500 requests in 0.14 s ... that is 140 s at 3.6 req/s").

Statistics definitions are in `optimizer.traces.stats`.
"""

from optimizer.traces.errors import TraceFormatError
from optimizer.traces.formats import (
    FORMAT_SPECS,
    ColumnMapping,
    FormatSpec,
    TimeUnit,
    generic_mapping,
)
from optimizer.traces.parse import IngestLimits, ParsedTrace, parse_trace
from optimizer.traces.plausibility import check_plausibility
from optimizer.traces.stats import compute_stats, prefix_hit_ratio, token_stats

__all__ = [
    "FORMAT_SPECS",
    "ColumnMapping",
    "FormatSpec",
    "IngestLimits",
    "ParsedTrace",
    "TimeUnit",
    "TraceFormatError",
    "check_plausibility",
    "compute_stats",
    "generic_mapping",
    "parse_trace",
    "prefix_hit_ratio",
    "token_stats",
]
