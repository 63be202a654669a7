"""One test per rejection class: the error names the file, row, column and expectation."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from optimizer.records import TraceFormat
from optimizer.traces import ColumnMapping, IngestLimits, TraceFormatError, parse_trace

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_ROWS = (
    "2023-11-16 18:17:03.9799600,4808,10\n"
    "2023-11-16 18:17:04.0319600,3180,8\n"
    "2023-11-16 18:17:05.0000000,100,20\n"
)


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def reject(path: Path, **kwargs: object) -> TraceFormatError:
    with pytest.raises(TraceFormatError) as info:
        parse_trace(path, **kwargs)  # type: ignore[arg-type]
    err = info.value
    assert err.path == str(path) and str(path) in str(err)
    assert isinstance(err, ValueError)
    return err


def test_missing_column_in_detected_format(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9,48\n")
    err = reject(path)
    assert err.column == "GeneratedTokens" and err.row is None
    assert "azure" in err.message and "GeneratedTokens" in err.message


def test_missing_column_in_forced_format(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", AZURE_HEADER + AZURE_ROWS)
    err = reject(path, format=TraceFormat.SPLITWISE)
    assert err.column == "arrived_at"


def test_duplicate_column(tmp_path: Path) -> None:
    header = "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n"
    err = reject(write(tmp_path, "t.csv", header + "2023-11-16 18:17:03.9,4,1,4\n"))
    assert err.column == "ContextTokens" and "duplicate" in err.message


def test_duplicate_jsonl_key(tmp_path: Path) -> None:
    line = '{"timestamp": 0, "input_length": 5, "output_length": 2, "input_length": 6}\n'
    err = reject(write(tmp_path, "t.jsonl", line))
    assert (err.row, err.column) == (1, "input_length")


def test_non_numeric_value(tmp_path: Path) -> None:
    rows = AZURE_ROWS.replace("3180", "31x0")
    err = reject(write(tmp_path, "t.csv", AZURE_HEADER + rows))
    assert (err.row, err.column) == (2, "ContextTokens")
    assert "'31x0'" in err.message and "whole number" in err.message


def test_empty_value(tmp_path: Path) -> None:
    rows = AZURE_ROWS.replace(",8\n", ",\n")
    err = reject(write(tmp_path, "t.csv", AZURE_HEADER + rows))
    assert (err.row, err.column) == (2, "GeneratedTokens") and "empty" in err.message


@pytest.mark.parametrize("value", ["10.5", "1e30", "nan", "inf"])
def test_fractional_huge_or_non_finite_tokens(tmp_path: Path, value: str) -> None:
    err = reject(write(tmp_path, "t.csv", AZURE_HEADER + AZURE_ROWS.replace("100", value)))
    assert (err.row, err.column) == (3, "ContextTokens") and repr(value) in err.message


@pytest.mark.parametrize(("value", "shown"), [("0", "found 0 tokens"), ("-3", "found -3 tokens")])
def test_zero_or_negative_tokens(tmp_path: Path, value: str, shown: str) -> None:
    rows = AZURE_ROWS.replace(",20\n", f",{value}\n")
    err = reject(write(tmp_path, "t.csv", AZURE_HEADER + rows))
    assert (err.row, err.column) == (3, "GeneratedTokens")
    assert shown in err.message and "positive" in err.message


def test_unparseable_timestamp(tmp_path: Path) -> None:
    rows = AZURE_ROWS.replace("2023-11-16 18:17:04.0319600", "16/11/2023 6pm")
    err = reject(write(tmp_path, "t.csv", AZURE_HEADER + rows))
    assert (err.row, err.column) == (2, "TIMESTAMP")
    assert "16/11/2023 6pm" in err.message and "2023-11-16 18:17:03.9799600" in err.message


def test_non_numeric_timestamp(tmp_path: Path) -> None:
    text = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,10,2\nsoon,10,2\n"
    err = reject(write(tmp_path, "t.csv", text))
    assert (err.row, err.column) == (2, "arrived_at")


def test_empty_file(tmp_path: Path) -> None:
    assert "empty" in reject(write(tmp_path, "t.csv", b"")).message
    assert "empty" in reject(write(tmp_path, "w.jsonl", "\n  \n")).message


def test_header_only(tmp_path: Path) -> None:
    err = reject(write(tmp_path, "t.csv", AZURE_HEADER))
    assert "header only" in err.message


def test_binary_garbage(tmp_path: Path) -> None:
    garbage = bytes(range(256)) * 4
    err = reject(write(tmp_path, "t.csv", garbage))
    assert "binary" in err.message


def test_compressed_file(tmp_path: Path) -> None:
    err = reject(write(tmp_path, "t.csv", gzip.compress((AZURE_HEADER + AZURE_ROWS).encode())))
    assert "compressed" in err.message


def test_wrong_encoding(tmp_path: Path) -> None:
    text = "arrived_at,num_prefill_tokens,num_decode_tokens,user\n0.5,10,2,ok\n0.7,10,2,José\n"
    err = reject(write(tmp_path, "t.csv", text.encode("latin-1")))
    assert "not UTF-8" in err.message and "line 3" in err.message and "0xe9" in err.message


def test_over_size_limit(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", AZURE_HEADER + AZURE_ROWS)
    err = reject(path, limits=IngestLimits(max_bytes=100))
    assert "size limit is 100 bytes" in err.message


def test_over_row_limit(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", AZURE_HEADER + AZURE_ROWS)
    err = reject(path, limits=IngestLimits(max_rows=2))
    assert err.row == 3 and "row limit is 2" in err.message
    assert len(parse_trace(path, limits=IngestLimits(max_rows=3)).columns) == 3


def test_unknown_format_lists_formats(tmp_path: Path) -> None:
    err = reject(write(tmp_path, "t.csv", "when,prompt,answer\n1,2,3\n"))
    assert "unknown trace format" in err.message
    for expected in ("azure", "TIMESTAMP", "splitwise", "arrived_at", "mooncake", "hash_ids"):
        assert expected in err.message
    assert "burstgpt" in err.message and "qwen" in err.message and "generic" in err.message


def test_generic_without_mapping(tmp_path: Path) -> None:
    err = reject(write(tmp_path, "t.csv", "a,b,c\n1,2,3\n"), format=TraceFormat.GENERIC)
    assert "ColumnMapping" in err.message


def test_ragged_csv_row(tmp_path: Path) -> None:
    rows = AZURE_ROWS.replace(",8\n", ",8,9\n")
    err = reject(write(tmp_path, "t.csv", AZURE_HEADER + rows))
    assert err.row == 2 and "found 4 fields; expected 3" in err.message


def test_invalid_json_line(tmp_path: Path) -> None:
    good = '{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [1]}\n'
    err = reject(write(tmp_path, "t.jsonl", good + "\n" + good + '{"timestamp": 3,\n'))
    assert err.row == 3 and "invalid JSON" in err.message


def test_hash_ids_not_a_list(tmp_path: Path) -> None:
    good = '{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [1]}\n'
    bad = '{"timestamp": 5, "input_length": 5, "output_length": 2, "hash_ids": "abc"}\n'
    err = reject(write(tmp_path, "t.jsonl", good + bad))
    assert (err.row, err.column) == (2, "hash_ids")


def test_no_such_file(tmp_path: Path) -> None:
    assert "no such file" in reject(tmp_path / "absent.csv").message


def test_acceptance_below_one(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "t,i,o,acc\n0,5,2,2.5\n1,5,2,0.5\n")
    mapping = ColumnMapping("t", "i", "o", acceptance_length="acc")
    err = reject(path, mapping=mapping)
    assert (err.row, err.column) == (2, "acc")


def test_error_pickles(tmp_path: Path) -> None:
    import pickle

    err = TraceFormatError(tmp_path / "x.csv", "bad", row=3, column="c")
    back = pickle.loads(pickle.dumps(err))
    assert (back.path, back.row, back.column, str(back)) == (err.path, 3, "c", str(err))
