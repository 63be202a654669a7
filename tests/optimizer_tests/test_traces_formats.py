"""Each format parses to normalised columns; detection; the documented repairs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from optimizer.records import TraceFormat
from optimizer.traces import ColumnMapping, TimeUnit, TraceFormatError, parse_trace


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(records: list[dict[str, object]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_azure_datetimes_to_seconds_from_first(tmp_path: Path) -> None:
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,3180,8\n"
        "2023-11-16 18:18:03.9799601,7,1\n"
    )
    parsed = parse_trace(write(tmp_path, "a.csv", text))
    assert parsed.format is TraceFormat.AZURE
    assert np.allclose(parsed.columns.arrival_s, [0.0, 0.052, 60.0000001], rtol=0, atol=1e-9)
    assert parsed.columns.input_tokens.dtype == np.int64
    assert parsed.columns.input_tokens.tolist() == [4808, 3180, 7]
    assert parsed.columns.output_tokens.tolist() == [10, 8, 1]
    assert parsed.columns.prefix_hashes is None and parsed.columns.session_ids is None


def test_azure_iso_and_zoned_timestamps(tmp_path: Path) -> None:
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10T00:00:00.5+00:00,5,1\n"
        "2024-05-10 00:00:02,5,1\n"
    )
    parsed = parse_trace(write(tmp_path, "a.csv", text))
    assert parsed.columns.arrival_s.tolist() == [0.0, 1.5]


def test_splitwise(tmp_path: Path) -> None:
    text = "arrived_at,num_prefill_tokens,num_decode_tokens,extra\n2.5,100,10,x\n3.0,200,20,y\n"
    parsed = parse_trace(write(tmp_path, "s.csv", text))
    assert parsed.format is TraceFormat.SPLITWISE
    assert parsed.columns.arrival_s.tolist() == [0.0, 0.5]


def test_mooncake_ms_and_hashes(tmp_path: Path) -> None:
    records = [
        {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 1500, "input_length": 600, "output_length": 3, "hash_ids": [1, 3]},
    ]
    parsed = parse_trace(write(tmp_path, "m.jsonl", jsonl(records)))
    assert parsed.format is TraceFormat.MOONCAKE and parsed.block_size == 512
    assert parsed.columns.arrival_s.tolist() == [0.0, 1.5]
    assert [h.tolist() for h in parsed.columns.prefix_hashes or []] == [[1, 2], [1, 3]]
    # Request 2 reuses block 1 (512 tokens) of 1600 input tokens.
    assert parsed.stats.prefix_hit_ratio == pytest.approx(512 / 1600)


def test_qwen_detected_by_chat_id_with_sessions(tmp_path: Path) -> None:
    records = [
        {"chat_id": 7, "parent_chat_id": -1, "timestamp": 10.25, "input_length": 20,
         "output_length": 4, "hash_ids": [1, 2], "turn": 1, "type": "text"},
        {"chat_id": 8, "parent_chat_id": 7, "timestamp": 11.0, "input_length": 40,
         "output_length": 4, "hash_ids": [1, 2, 3], "turn": 2, "type": "text"},
    ]  # fmt: skip
    parsed = parse_trace(write(tmp_path, "q.jsonl", jsonl(records)))
    assert parsed.format is TraceFormat.QWEN and parsed.block_size == 16
    assert parsed.columns.arrival_s.tolist() == [0.0, 0.75]
    assert parsed.columns.session_ids == ["7", "8"]
    # Request 2: blocks 1, 2 seen -> 32 of its 40 tokens; request 1 nothing. 32 / 60.
    assert parsed.stats.prefix_hit_ratio == pytest.approx(32 / 60)


def test_burstgpt_drops_failed_rows(tmp_path: Path) -> None:
    text = (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "9,GPT-4,1087,0,1087,Conversation log\n"
        "12,ChatGPT,200,30,230,API log\n"
    )
    parsed = parse_trace(write(tmp_path, "b.csv", text))
    assert parsed.format is TraceFormat.BURSTGPT
    assert parsed.num_dropped == parsed.stats.num_dropped == 1
    assert parsed.columns.arrival_s.tolist() == [0.0, 7.0]
    assert parsed.columns.input_tokens.tolist() == [472, 200]
    assert "dropped 1 failed request" in parsed.warnings[0] and "row 2" in parsed.warnings[0]
    assert parsed.stats.warnings == parsed.warnings


def test_burstgpt_all_failed_is_rejected(tmp_path: Path) -> None:
    text = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,M,4,0,4,L\n"
    with pytest.raises(TraceFormatError, match="all 1 rows are failed"):
        parse_trace(write(tmp_path, "b.csv", text))


def test_unsorted_is_stable_sorted_with_warning(tmp_path: Path) -> None:
    text = (
        "arrived_at,num_prefill_tokens,num_decode_tokens\n"
        "3.0,1,1\n1.0,2,1\n3.0,3,1\n2.0,4,1\n1.0,5,1\n"
    )
    parsed = parse_trace(write(tmp_path, "s.csv", text))
    assert parsed.columns.arrival_s.tolist() == [0.0, 0.0, 1.0, 2.0, 2.0]
    # Ties keep file order: (1.0: rows 2, 5), (3.0: rows 1, 3).
    assert parsed.columns.input_tokens.tolist() == [2, 5, 4, 1, 3]
    assert len(parsed.warnings) == 1
    assert "out of order at 3 place(s) (first at row 2)" in parsed.warnings[0]


def test_duplicate_timestamps_are_fine(tmp_path: Path) -> None:
    text = "arrived_at,num_prefill_tokens,num_decode_tokens\n1,1,1\n1,2,1\n1,3,1\n"
    parsed = parse_trace(write(tmp_path, "s.csv", text))
    assert parsed.warnings == () and parsed.stats.duration_s == 0.0
    assert parsed.columns.input_tokens.tolist() == [1, 2, 3]


def test_lenient_spellings(tmp_path: Path) -> None:
    text = "\ufeffarrived_at,num_prefill_tokens,num_decode_tokens\r\n 0.5 ,12.0, 3\r\n1,7,1\r\n"
    parsed = parse_trace(write(tmp_path, "s.csv", text))
    assert parsed.columns.input_tokens.tolist() == [12, 7]
    assert parsed.columns.output_tokens.tolist() == [3, 1]


def test_forced_format_skips_detection(tmp_path: Path) -> None:
    text = "arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n"
    path = write(tmp_path, "s.txt", text)
    assert parse_trace(path, format=TraceFormat.SPLITWISE).format is TraceFormat.SPLITWISE


def test_generic_csv_ms_with_hashes_and_acceptance(tmp_path: Path) -> None:
    text = 't_ms,p,d,blocks,user,acc\n2000,8,1,"[5, 6]",u1,3.5\n1000,4,2,[5],,\n'
    mapping = ColumnMapping(
        "t_ms", "p", "d", TimeUnit.MS, hash_ids="blocks", session_id="user",
        acceptance_length="acc", block_size=4,
    )  # fmt: skip
    parsed = parse_trace(write(tmp_path, "g.csv", text), mapping=mapping)
    cols = parsed.columns
    assert parsed.format is TraceFormat.GENERIC
    assert cols.arrival_s.tolist() == [0.0, 1.0]  # sorted: the 1000 ms row first
    assert cols.input_tokens.tolist() == [4, 8]
    assert cols.session_ids == [None, "u1"]
    assert [h.tolist() for h in cols.prefix_hashes or []] == [[5], [5, 6]]
    assert cols.acceptance_length is not None
    assert np.isnan(cols.acceptance_length[0]) and cols.acceptance_length[1] == 3.5
    assert parsed.stats.prefix_hit_ratio == pytest.approx(4 / 12)


def test_generic_parquet_datetime(tmp_path: Path) -> None:
    path = tmp_path / "g.parquet"
    pl.DataFrame(
        {
            "at": ["2024-01-01 00:00:01", "2024-01-01 00:00:00.25"],
            "inp": [10, 20],
            "out": [1, 2],
        }
    ).with_columns(pl.col("at").str.to_datetime()).write_parquet(path)
    mapping = ColumnMapping("at", "inp", "out", TimeUnit.DATETIME)
    parsed = parse_trace(path, mapping=mapping)
    assert parsed.columns.arrival_s.tolist() == [0.0, 0.75]
    assert parsed.columns.input_tokens.tolist() == [20, 10]


def test_generic_jsonl_us(tmp_path: Path) -> None:
    records = [{"ts": 1_000_000, "i": 3, "o": 4}, {"ts": 3_500_000, "i": 5, "o": 6}]
    mapping = ColumnMapping("ts", "i", "o", time_unit="us")  # type: ignore[arg-type]
    parsed = parse_trace(write(tmp_path, "g.jsonl", jsonl(records)), mapping=mapping)
    assert parsed.columns.arrival_s.tolist() == [0.0, 2.5]


def test_generic_mapping_missing_column(tmp_path: Path) -> None:
    mapping = ColumnMapping("ts", "i", "o")
    with pytest.raises(TraceFormatError) as info:
        parse_trace(write(tmp_path, "g.csv", "ts,i\n1,2\n"), mapping=mapping)
    assert info.value.column == "o"


def test_mapping_validation() -> None:
    with pytest.raises(ValueError, match="twice"):
        ColumnMapping("a", "a", "b")
    with pytest.raises(ValueError):
        ColumnMapping("a", "b", "c", time_unit="hours")  # type: ignore[arg-type]


def test_block_length_mismatch_warns(tmp_path: Path) -> None:
    records = [{"timestamp": 0, "input_length": 2000, "output_length": 5, "hash_ids": [1]}]
    parsed = parse_trace(write(tmp_path, "m.jsonl", jsonl(records)))
    assert parsed.warnings == ("1 request(s) where len(hash_ids) != ceil(input tokens / 512)",)
