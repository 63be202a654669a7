"""`servetune traces` end to end on a SQLite file."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from api.cli import app


def _write_azure(path: Path, rows: list[tuple[str, int, int]]) -> Path:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"{ts},{i},{o}" for ts, i, o in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


ROWS = [
    ("2023-11-16 18:17:03.9799600", 100, 10),
    ("2023-11-16 18:17:04.4799600", 200, 20),
    ("2023-11-16 18:17:05.9799600", 300, 30),
]


def test_import_show_list_export_round_trip(cli_db: str, runner: CliRunner, tmp_path: Path) -> None:
    src = _write_azure(tmp_path / "tiny.csv", ROWS)
    first = runner.invoke(app, ["traces", "import", str(src)])
    assert first.exit_code == 0, first.output
    assert "stored as trace 1" in first.output
    assert "requests" in first.output and "2.0 s" in first.output  # span 2.0 s

    again = runner.invoke(app, ["traces", "import", str(src), "--name", "other"])
    assert again.exit_code == 0
    assert "already stored as trace 1" in again.output

    listed = runner.invoke(app, ["traces", "list"])
    assert "tiny" in listed.output and "other" not in listed.output

    for fmt in ("parquet", "csv"):
        out = tmp_path / f"export.{fmt}"
        exported = runner.invoke(app, ["traces", "export", "1", "--to", fmt, "--out", str(out)])
        assert exported.exit_code == 0, exported.output
        frame = pl.read_parquet(out) if fmt == "parquet" else pl.read_csv(out)
        assert frame["input_tokens"].to_list() == [100, 200, 300]
        assert frame["output_tokens"].to_list() == [10, 20, 30]
        assert frame["arrival_s"].to_list() == [0.0, 0.5, 2.0]
        back = runner.invoke(app, ["traces", "import", str(out), "--name", f"back-{fmt}"])
        assert back.exit_code == 0, back.output
        assert "stored as trace" in back.output


def test_bad_file_is_a_precise_error_and_stores_nothing(
    cli_db: str, runner: CliRunner, tmp_path: Path
) -> None:
    bad = _write_azure(tmp_path / "bad.csv", [*ROWS[:2], ("2023-11-16 18:17:05.9799600", -3, 30)])
    result = runner.invoke(app, ["traces", "import", str(bad)])
    assert result.exit_code == 2
    assert "row 3" in result.output and "ContextTokens" in result.output
    listed = runner.invoke(app, ["traces", "list"])
    assert "no traces stored yet" in listed.output


def test_show_unknown_trace(cli_db: str, runner: CliRunner) -> None:
    result = runner.invoke(app, ["traces", "show", "42"])
    assert result.exit_code == 2
    assert "trace 42 not found" in result.output


def test_missing_file(cli_db: str, runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["traces", "import", str(tmp_path / "nope.csv")])
    assert result.exit_code == 2 and "no such file" in result.output


def test_export_round_trip_keeps_prefix_hashes(
    cli_db: str, runner: CliRunner, tmp_path: Path, shared_data: Path
) -> None:
    """Mooncake (hash_ids) -> stored -> exported -> re-imported: same arrays, same stats."""
    from api.cli.common import session
    from storage.traces import get_trace, load_trace_columns

    src = shared_data / "traces/mooncake/synthetic_trace.jsonl"
    assert runner.invoke(app, ["traces", "import", str(src)]).exit_code == 0
    for i, fmt in enumerate(("parquet", "csv"), start=2):
        out = tmp_path / f"mc.{fmt}"
        assert (
            runner.invoke(app, ["traces", "export", "1", "--to", fmt, "--out", str(out)]).exit_code
            == 0
        )
        result = runner.invoke(app, ["traces", "import", str(out)])
        assert result.exit_code == 0, result.output
        assert f"stored as trace {i}" in result.output
        with session() as s:
            a, b = load_trace_columns(s, 1), load_trace_columns(s, i)
            stats_a, stats_b = get_trace(s, 1).stats, get_trace(s, i).stats
            assert get_trace(s, i).source_format == "servetune"
        assert b.prefix_hashes is not None and a.prefix_hashes is not None
        assert all((x == y).all() for x, y in zip(a.prefix_hashes, b.prefix_hashes, strict=True))
        assert (a.input_tokens == b.input_tokens).all()
        assert abs(stats_b.prefix_hit_ratio - 0.651) < 5e-4
        assert stats_a.prefix_hit_ratio == stats_b.prefix_hit_ratio
        assert stats_a.input_tokens == stats_b.input_tokens


def _write_ms_stamps(path: Path) -> Path:
    """500 requests 280 ms apart (139.72 s, 3.58 req/s), stamps in milliseconds."""
    lines = ["ts,prompt,output", *(f"{280 * i},1000,100" for i in range(500))]
    path.write_text("\n".join(lines) + "\n")
    return path


MS_AS_US = (
    "warning: 500 requests in 0.14 s (3,579 req/s; plausible up to 1,000 req/s for one "
    "fleet): if the stamps in 'ts' are milliseconds, not microseconds, that is 140 s at 3.6 "
    "req/s; check --arrival-unit (REST field arrival_unit)"
)


def test_implausible_trace_is_stored_with_warnings_and_shown(
    cli_db: str, runner: CliRunner, tmp_path: Path
) -> None:
    """Issue 43: ms stamps imported as us. Stored all the same, warned at import and by show."""
    src = _write_ms_stamps(tmp_path / "ms.csv")
    options = ["--arrival", "ts", "--input", "prompt", "--output", "output"]
    result = runner.invoke(app, ["traces", "import", str(src), *options, "--arrival-unit", "us"])
    assert result.exit_code == 0, result.output
    assert "stored as trace 1" in result.output
    assert MS_AS_US in " ".join(result.output.split())
    shown = runner.invoke(app, ["traces", "show", "1"])
    assert shown.exit_code == 0 and MS_AS_US in " ".join(shown.output.split())

    right = runner.invoke(app, ["traces", "import", str(src), *options, "--arrival-unit", "ms"])
    assert right.exit_code == 0 and "warning" not in right.output  # 3.6 req/s over 140 s
    assert "warning" not in runner.invoke(app, ["traces", "show", "2"]).output


def test_tune_prints_the_warnings_of_the_file_it_imports(
    cli_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tune --trace PATH` stores the file first (tune's `_trace_id`); its warnings show."""
    from api.cli.tune import _trace_id

    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    lines += [f"{280 * i},1000,100" for i in range(500)]
    path = tmp_path / "ms.csv"  # a splitwise-shaped file whose stamps are milliseconds
    path.write_text("\n".join(lines) + "\n")
    assert _trace_id(str(path)) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "warning: 500 requests in 38.8 h (0.0036 req/s;" in out
    assert "format splitwise reads 'arrived_at' in s" in out
