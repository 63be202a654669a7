"""Write stored traces back to files that `servetune traces import` reads again.

Columns are the native ones (`arrival_s`, `input_tokens`, `output_tokens`, and
`hash_ids`, `session_id`, `acceptance_length` when the trace has them), which
import auto-detects as the `servetune` format.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from optimizer.records import TraceColumns


def trace_frame(columns: TraceColumns) -> pl.DataFrame:
    data: dict[str, object] = {
        "arrival_s": columns.arrival_s,
        "input_tokens": columns.input_tokens,
        "output_tokens": columns.output_tokens,
    }
    if columns.prefix_hashes is not None:
        data["hash_ids"] = pl.Series(
            [h.tolist() for h in columns.prefix_hashes], dtype=pl.List(pl.Int64)
        )
    if columns.session_ids is not None:
        data["session_id"] = pl.Series(columns.session_ids, dtype=pl.String)
    if columns.acceptance_length is not None:
        data["acceptance_length"] = columns.acceptance_length
    return pl.DataFrame(data)


def write_trace(columns: TraceColumns, path: Path, *, csv: bool) -> None:
    frame = trace_frame(columns)
    if not csv:
        frame.write_parquet(path)
        return
    if "hash_ids" in frame.columns:
        # CSV has no lists: write the block hashes as a JSON-style list string.
        frame = frame.with_columns(
            ("[" + pl.col("hash_ids").cast(pl.List(pl.String)).list.join(",") + "]").alias(
                "hash_ids"
            )
        )
    frame.write_csv(path, float_precision=None)
