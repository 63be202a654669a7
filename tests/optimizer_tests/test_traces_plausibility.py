"""Plausibility warnings on ingest: one test per kind, the unit mistake of issue 43 worked
by hand, and none on the real traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optimizer.records import TraceWarningCode
from optimizer.traces import generic_mapping, parse_trace
from optimizer.traces.plausibility import (
    MAX_CONTEXT_TOKENS,
    MAX_RATE,
    MIN_RATE,
    MIN_RATE_REQUESTS,
)

# 500 requests 280 ms apart: 499 gaps = 139,720 ms, 500 / 139.72 s = 3.5786 req/s.
MS_STAMPS = [280 * i for i in range(500)]


def write_generic(
    tmp_path: Path, stamps: list[float], lengths: list[tuple[int, int]] | None = None
):
    lengths = lengths or [(1000, 100)] * len(stamps)
    lines = [
        "ts,prompt,output",
        *(f"{t},{i},{o}" for t, (i, o) in zip(stamps, lengths, strict=True)),
    ]
    path = tmp_path / "generic.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def read(path: Path, unit: str | None):
    mapping = generic_mapping(
        None, arrival="ts", input_tokens="prompt", output_tokens="output", arrival_unit=unit
    )
    return parse_trace(path, mapping=mapping)


def test_milliseconds_read_as_microseconds(tmp_path: Path) -> None:
    """Issue 43: 500 requests whose ms stamps are imported with --arrival-unit us."""
    parsed = read(write_generic(tmp_path, MS_STAMPS), "us")
    (warning,) = parsed.plausibility_warnings
    assert warning.code is TraceWarningCode.RATE_HIGH
    assert warning.figure == pytest.approx(500 / 0.13972) and warning.limit == MAX_RATE
    assert warning.message == (
        "500 requests in 0.14 s (3,579 req/s; plausible up to 1,000 req/s for one fleet): "
        "if the stamps in 'ts' are milliseconds, not microseconds, that is 140 s at 3.6 "
        "req/s; check --arrival-unit (REST field arrival_unit)"
    )
    assert parsed.stats.num_requests == 500  # stored all the same


def test_the_same_stamps_in_their_own_unit_are_plausible(tmp_path: Path) -> None:
    assert read(write_generic(tmp_path, MS_STAMPS), "ms").plausibility_warnings == ()


def test_milliseconds_read_as_seconds(tmp_path: Path) -> None:
    """The opposite mistake: 139,720 s (38.8 h) at 0.0036 req/s."""
    (warning,) = read(write_generic(tmp_path, MS_STAMPS), "s").plausibility_warnings
    assert warning.code is TraceWarningCode.RATE_LOW and warning.limit == MIN_RATE
    assert warning.figure == pytest.approx(500 / 139_720)
    assert warning.message.startswith("500 requests in 38.8 h (0.0036 req/s;")
    assert "if the stamps in 'ts' are milliseconds, not seconds, that is 140 s at 3.6" in (
        warning.message
    )


def test_without_a_unit_the_stamps_are_read_as_seconds(tmp_path: Path) -> None:
    """Without --arrival-unit a generic column is read as seconds; the hint names the finer
    units whose reading is plausible (ms here; us would be 0.14 s at 3,579 req/s)."""
    (warning,) = read(write_generic(tmp_path, MS_STAMPS), None).plausibility_warnings
    assert "not seconds" in warning.message and "microseconds" not in warning.message


def test_seconds_read_as_microseconds_names_only_the_plausible_reading(tmp_path: Path) -> None:
    """1 req/s for 499 s read as us: as ms it would still be 1,002 req/s, so only s is named."""
    (warning,) = read(write_generic(tmp_path, list(range(500))), "us").plausibility_warnings
    assert warning.code is TraceWarningCode.RATE_HIGH
    assert "are seconds, not microseconds, that is 499 s at 1 req/s" in warning.message
    assert "milliseconds" not in warning.message


def test_a_known_format_names_its_own_unit(tmp_path: Path) -> None:
    """A Mooncake-shaped file whose stamps are seconds: the format reads them as ms."""
    records = [
        {"timestamp": t, "input_length": 600, "output_length": 50, "hash_ids": [1, 2]}
        for t in range(100)
    ]
    path = tmp_path / "kimi.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    (warning,) = parse_trace(path).plausibility_warnings
    assert warning.code is TraceWarningCode.RATE_HIGH
    assert "if the stamps in 'timestamp' are seconds, not milliseconds, that is 99 s" in (
        warning.message
    )
    assert "format mooncake reads 'timestamp' in ms" in warning.message


def test_dates_get_no_unit_hint(tmp_path: Path) -> None:
    """30 Azure requests within 29 ms: datetimes have no unit to swap."""
    rows = [f"2023-11-16 18:17:03.{i:03d}0000,100,10" for i in range(30)]
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    (warning,) = parse_trace(path).plausibility_warnings
    assert warning.code is TraceWarningCode.RATE_HIGH
    assert warning.message.endswith("check the dates in column 'TIMESTAMP'")


def test_all_requests_at_one_instant(tmp_path: Path) -> None:
    (warning,) = read(write_generic(tmp_path, [5] * 30), "s").plausibility_warnings
    assert warning.code is TraceWarningCode.SPAN_ZERO and warning.figure == 30
    assert warning.message.startswith("all 30 requests arrive at the same instant")


def test_a_few_requests_have_no_rate_to_judge(tmp_path: Path) -> None:
    few = MIN_RATE_REQUESTS - 1
    assert read(write_generic(tmp_path, [5] * few), "s").plausibility_warnings == ()
    assert read(write_generic(tmp_path, MS_STAMPS[:few]), "us").plausibility_warnings == ()


def test_a_burst_above_the_ceiling(tmp_path: Path) -> None:
    """An hour at 1 req/s, and 1,500 requests in the second from 600 s (file rows
    601-2,100, after the 600 requests before them): the mean passes, the second does not."""
    burst = [600 + i / 2000 for i in range(1500)]
    stamps = sorted([float(t) for t in range(3600)] + burst)
    (warning,) = read(write_generic(tmp_path, stamps), "s").plausibility_warnings
    assert warning.code is TraceWarningCode.BURST_HIGH
    assert warning.figure == 1501  # the burst and the request stamped 600 s
    assert warning.message.startswith(
        "1,501 requests within one second, from 600 s into the trace (row 601; the mean is "
    )


def test_a_request_longer_than_any_context(tmp_path: Path) -> None:
    lengths = [(1000, 100)] * 3 + [(MAX_CONTEXT_TOKENS, 1), (MAX_CONTEXT_TOKENS - 1, 1)]
    parsed = read(write_generic(tmp_path, [0, 1, 2, 3, 4], lengths), "s")
    (warning,) = parsed.plausibility_warnings
    assert warning.code is TraceWarningCode.LENGTH_OVER_CONTEXT
    assert warning.figure == MAX_CONTEXT_TOKENS + 1 and warning.limit == MAX_CONTEXT_TOKENS
    assert warning.message == (
        "1 request(s) longer than any known model's context (10,485,760 tokens, Llama 4 "
        "Scout); the longest, row 4, has 10,485,760 + 1 tokens ('prompt' + 'output'); check "
        "that these columns count tokens"
    )


def test_rows_are_file_rows_after_the_sort(tmp_path: Path) -> None:
    """Out-of-order stamps are sorted (a repair); the warning still names the file row."""
    lengths = [(100, 10), (MAX_CONTEXT_TOKENS, 5), (100, 10)]
    (warning,) = read(write_generic(tmp_path, [2, 0, 1], lengths), "s").plausibility_warnings
    assert "the longest, row 2," in warning.message


@pytest.mark.parametrize(
    "name",
    [
        "azure2023/AzureLLMInferenceTrace_code.csv",
        "azure2023/AzureLLMInferenceTrace_conv.csv",
        "mooncake/synthetic_trace.jsonl",
    ],
)
def test_real_traces_are_plausible(shared_data: Path, name: str) -> None:
    assert parse_trace(shared_data / "traces" / name).plausibility_warnings == ()
