"""Bad trace input gets a bounded, precise error: what, where, what was expected."""

from __future__ import annotations

import pytest

from optimizer.traces import TraceFormatError, parse_trace


def _error(path) -> str:
    with pytest.raises(TraceFormatError) as info:
        parse_trace(path)
    return str(info.value)


def test_a_huge_single_line_is_not_echoed_back(tmp_path):
    path = tmp_path / "one-line.csv"
    path.write_text("arrival_s,input_tokens,output_tokens," + "x" * 3_000_000)
    assert len(_error(path)) < 2_500
    # A 3 MB value in a data row is quoted cut.
    path.write_text("arrival_s,input_tokens,output_tokens\n0.0,10,5\n1.0," + "y" * 3_000_000
                    + ",5\n")  # fmt: skip
    msg = _error(path)
    assert len(msg) < 2_500 and "more characters" in msg and "row 2" in msg


def test_a_million_column_header_lists_twenty(tmp_path):
    path = tmp_path / "wide.csv"
    names = [f"c{i}" for i in range(1_000_000)]
    path.write_text(",".join(names) + "\n" + ",".join("1" for _ in names) + "\n")
    msg = _error(path)
    assert len(msg) < 2_500 and "999,980 more" in msg


def test_a_header_longer_than_a_mebibyte_is_read_whole(tmp_path):
    """Sniffing used to read 1 MiB: the cut header's last name looked like a duplicate."""
    path = tmp_path / "long-header.csv"
    names = [f"extra_column_{i:06d}" for i in range(60_000)]  # ~1.2 MB of header
    rows = ["arrival_s,input_tokens,output_tokens," + ",".join(names)]
    rows.append("0.0,10,5," + ",".join("0" for _ in names))
    path.write_text("\n".join(rows) + "\n")
    assert len(parse_trace(path).columns.input_tokens) == 1


def test_deeply_nested_json_is_refused_not_a_crash(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    assert "nested too deeply" in _error(path)


def test_utf16_is_named(tmp_path):
    path = tmp_path / "u16.csv"
    path.write_bytes("arrival_s,input_tokens,output_tokens\n0,1,1\n".encode("utf-16"))
    assert "UTF-16" in _error(path) and "re-encode it as UTF-8" in _error(path)


def test_a_ragged_row_is_called_ragged_not_empty(tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n0.0,10,5\n1.0,12\n2.0,9,3\n")
    msg = _error(path)
    assert "row 2" in msg and "found 2 fields; expected 3" in msg


def test_absurd_timestamps_are_refused_at_ingest(tmp_path):
    path = tmp_path / "far.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n1e300,10,5\n")
    msg = _error(path)
    assert "row 2" in msg and "within +-1e11 s of zero" in msg
    path.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n1e10,10,5\n")
    assert "span 1e+10 s" in _error(path)


def test_token_counts_beyond_what_a_database_holds_are_refused(tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n1,2147483648,5\n")
    msg = _error(path)
    assert "row 2" in msg and "'input_tokens'" in msg and "at most 2,147,483,647" in msg
