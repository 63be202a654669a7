"""`servetune traces` end to end on a SQLite file."""

from __future__ import annotations

from pathlib import Path

import polars as pl
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
        back = runner.invoke(
            app,
            [
                "traces", "import", str(out), "--name", f"back-{fmt}",
                "--arrival", "arrival_s", "--input", "input_tokens", "--output", "output_tokens",
            ],
        )  # fmt: skip
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
