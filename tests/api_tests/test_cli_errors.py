"""Every user mistake on the command line: one `error:` line and exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from api.cli import app


def _servetune(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from api.cli import main; main()", *args],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=120,
    )  # fmt: skip


def test_export_into_a_missing_folder(cli_db, runner, tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n1,12,6\n")
    res = runner.invoke(app, ["traces", "import", str(trace)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["traces", "export", "1", "--to", "csv",
                              "--out", str(tmp_path / "no" / "such" / "x.csv")])  # fmt: skip
    assert res.exit_code == 2 and "does not exist" in res.output
    assert "Traceback" not in res.output


def test_tune_checks_its_output_folder_before_running(cli_db, runner, tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n1,12,6\n")
    blocker = tmp_path / "outcome"
    blocker.write_text("a file, not a folder")
    res = runner.invoke(app, [
        "tune", "--trace", str(trace), "--model", "llama-3.1-8b", "--gpu", "h100", "--gpus",
        "1", "--slo-ttft-ms", "2000", "--slo-tpot-ms", "50", "--out", str(blocker),
    ])  # fmt: skip
    assert res.exit_code == 2 and "exists and is not a folder" in res.output
    assert "tuning" not in res.output  # refused before any trial


def test_space_is_validated_with_the_configs_rules(cli_db, runner, tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n1,12,6\n")
    base = ["tune", "--trace", str(trace), "--model", "llama-3.1-8b", "--gpu", "h100",
            "--gpus", "4", "--slo-ttft-ms", "2000", "--slo-tpot-ms", "50"]  # fmt: skip
    res = runner.invoke(app, [*base, "--space", '{"tp": [3]}'])
    assert res.exit_code == 2 and "--space: tp: expected powers of two, got [3]" in res.output
    res = runner.invoke(app, [*base, "--space", "{tp: [1]}"])
    assert res.exit_code == 2 and "--space: not valid JSON" in res.output
    res = runner.invoke(app, [*base, "--space", '{"chunk": [1]}'])
    assert res.exit_code == 2 and "--space: search-space overrides: unknown keys" in res.output


@pytest.mark.postgres
def test_a_missing_postgres_database_is_one_line(postgres_url: str, tmp_path: Path) -> None:
    url = postgres_url.rsplit("/", 1)[0] + "/servetune_no_such_db"
    res = _servetune(["traces", "list"], {"SERVETUNE_DATABASE_URL": url})
    assert res.returncode == 2, res.stderr
    assert "error: cannot open the database" in res.stderr and "Traceback" not in res.stderr
    assert res.stderr.count("\n") <= 3


def test_misleading_messages_say_what_the_user_typed(cli_db, runner, tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n1,12,6\n")
    res = runner.invoke(app, ["tune", "--trace", str(trace), "--model", "llama-3.1-8b",
                              "--gpu", "h1000", "--gpus", "2", "--slo-ttft-ms", "2000",
                              "--slo-tpot-ms", "50"])  # fmt: skip
    assert res.exit_code == 2 and "gpu_types: unknown accelerator 'h1000'" in res.output
    assert "h100" in res.output  # the known ones are listed
    config = Path(__file__).resolve().parents[2] / "examples" / "colocated-h100.yaml"
    res = runner.invoke(app, ["simulate", "--trace", str(trace), "--config", str(config),
                              "--slo-ttft-ms", "-500", "--slo-tpot-ms", "50"])  # fmt: skip
    assert res.exit_code == 2
    assert "--slo-ttft-ms: expected a positive number of milliseconds, got -500" in res.output
    res = runner.invoke(app, ["traces", "import", str(tmp_path)])
    assert res.exit_code == 2 and "is a folder; expected a trace file" in res.output


def test_a_bad_setting_met_outside_a_session_is_one_line(tmp_path: Path) -> None:
    """quickstart reads the database URL before it opens a session: an empty
    SERVETUNE_DATABASE_URL is still one `error:` line and status 2, no traceback."""
    res = _servetune(["quickstart"], {"SERVETUNE_DATABASE_URL": "", "HOME": str(tmp_path)})
    assert res.returncode == 2, res.stderr
    assert "error: SERVETUNE_DATABASE_URL is not a database URL: ''" in res.stderr
    assert "Traceback" not in res.stderr
