"""`servetune traces synthesize` end to end on a SQLite file, and the synthetic label on
every surface: the command's answer, `traces list`, `traces show` and GET /v1/traces."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli import app
from optimizer.traces.synthesize import DIURNAL, format_rate_curve
from tests.api_tests.conftest import Service, write_trace_csv

pytestmark = pytest.mark.usefixtures("wide_console")


def _import_sample(runner: CliRunner, tmp_path: Path, n: int = 50) -> None:
    result = runner.invoke(app, ["traces", "import", str(write_trace_csv(tmp_path / "s.csv", n))])
    assert result.exit_code == 0 and "stored as trace 1" in result.output, result.output


def _synthesize(runner: CliRunner, *args: str):
    base = ["traces", "synthesize", "--from", "1", "--days", "7", "--mean-rate", "0.05"]
    return runner.invoke(app, [*base, "--rate-curve", "diurnal", *args])


def test_synthesize_stores_a_labelled_week_once(
    cli_db: str, runner: CliRunner, tmp_path: Path
) -> None:
    _import_sample(runner, tmp_path)
    made = _synthesize(runner)
    assert made.exit_code == 0, made.output
    assert "stored as trace 2 (synthetic)" in made.output
    assert "trace 2: synthetic-week-from-1 (synthetic)" in made.output
    assert "synthetic from │ trace 1: s" in made.output.replace("  ", "")
    said = "7 days at 0.05 req/s on average, rate curve diurnal (hour_of_day, 24 points), seed 0"
    assert said in made.output
    again = _synthesize(runner)
    assert again.exit_code == 0 and "already stored as trace 2 (synthetic)" in again.output

    listed = runner.invoke(app, ["traces", "list"]).output
    rows = {line.split("│")[1].strip(): line for line in listed.splitlines() if "│" in line}
    assert "synthetic" in rows["2"] and "synthetic-week-from-1" in rows["2"]
    assert "synthetic" not in rows["1"] and "splitwise" in rows["1"]
    shown = runner.invoke(app, ["traces", "show", "2"]).output
    assert "(synthetic)" in shown and "rate curve diurnal" in shown
    assert "synthetic" not in runner.invoke(app, ["traces", "show", "1"]).output

    other = _synthesize(runner, "--seed", "3", "--name", "my week")
    assert other.exit_code == 0 and "stored as trace 3 (synthetic)" in other.output
    assert "trace 3: my week (synthetic)" in other.output and "seed 3" in other.output


def test_a_curve_file_round_trips_through_the_stored_trace(
    cli_db: str, runner: CliRunner, tmp_path: Path
) -> None:
    """A file holding the built-in curve's points is the same synthesis (identity is the
    points, not the name); another file's curve is stored with its name and shape."""
    _import_sample(runner, tmp_path)
    curve = tmp_path / "office.csv"
    curve.write_text(format_rate_curve(DIURNAL))
    assert _synthesize(runner).exit_code == 0
    base = ["traces", "synthesize", "--from", "1", "--days", "7", "--mean-rate", "0.05"]
    from_file = runner.invoke(app, [*base, "--rate-curve", str(curve), "--name", "file"])
    # Identity is the curve's points, not its name: the same rows are already stored.
    assert from_file.exit_code == 0 and "already stored as trace 2" in from_file.output
    week = tmp_path / "week.csv"
    week.write_text("# weekdays busy\nhour_of_week,relative_rate\n0,3\n120,1\n")
    weekly = runner.invoke(app, [*base, "--rate-curve", str(week)])
    assert weekly.exit_code == 0, weekly.output
    assert "rate curve week.csv (hour_of_week, 2 points)" in weekly.output
    shown = runner.invoke(app, ["traces", "show", "3"]).output
    assert "rate curve week.csv (hour_of_week, 2 points)" in shown


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "9"], "--from 9: trace 9 not found"),
        (["--days", "0"], "--days 0.0; expected a number of days in (0, 31]"),
        (["--days", "40"], "--days 40.0; expected a number of days in (0, 31]"),
        (["--mean-rate", "-1"], "--mean-rate -1.0; expected requests/s > 0"),
        (["--mean-rate", "0"], "--mean-rate 0.0; expected requests/s > 0"),
        (["--rate-curve", "hourly"], "--rate-curve hourly: no such file; expected a rate curve"),
        (["--mean-rate", "1000"], "is 604,800,000 requests; expected at most 50,000,000"),
        (["--seed", "-2"], "--seed -2; expected an integer >= 0"),
    ],
)
def test_bad_input_is_one_clear_error_and_stores_nothing(
    cli_db: str, runner: CliRunner, tmp_path: Path, args: list[str], message: str
) -> None:
    _import_sample(runner, tmp_path)
    base = {"--from": "1", "--days": "7", "--mean-rate": "0.05", "--rate-curve": "diurnal"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    result = runner.invoke(app, ["traces", "synthesize", *[x for kv in base.items() for x in kv]])
    assert result.exit_code == 2, result.output
    assert message in result.output.replace("\n", "")
    assert "Traceback" not in result.output
    assert "synthetic" not in runner.invoke(app, ["traces", "list"]).output


def test_a_malformed_curve_file_names_its_line_and_stores_nothing(
    cli_db: str, runner: CliRunner, tmp_path: Path
) -> None:
    _import_sample(runner, tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_text("hour_of_day,relative_rate\n0,1\n6,-2\n")
    result = _synthesize(runner, "--rate-curve", str(bad))
    assert result.exit_code == 2
    assert "bad.csv: line 3: relative_rate -2.0; expected a finite number >= 0" in (
        result.output.replace("\n", "")
    )
    assert "synthetic" not in runner.invoke(app, ["traces", "list"]).output


def test_a_sample_under_ten_requests_is_refused(
    cli_db: str, runner: CliRunner, tmp_path: Path
) -> None:
    _import_sample(runner, tmp_path, n=9)
    result = _synthesize(runner)
    assert result.exit_code == 2
    assert "the sample has 9 requests; expected at least 10" in result.output
    assert "synthetic" not in runner.invoke(app, ["traces", "list"]).output


def test_rest_trace_info_carries_the_origin(service: Service, tmp_path: Path) -> None:
    from api.services.synthesize import synthesize_trace
    from storage.db import make_engine, session_scope

    path = write_trace_csv(tmp_path / "hour.csv", 30)
    with path.open("rb") as fh:
        up = service.client.post(
            "/v1/traces",
            headers=service.auth(service.key_a),
            files={"file": (path.name, fh, "text/csv")},
        )
    sample = up.json()["id"]
    engine = make_engine(service.url)
    try:
        with session_scope(engine) as s:
            made = synthesize_trace(
                s, from_trace_id=sample, curve=DIURNAL, days=1, mean_rate=0.01, seed=2
            )
    finally:
        engine.dispose()
    auth = service.auth(service.key_a)
    info = service.client.get(f"/v1/traces/{made.trace.id}", headers=auth).json()
    origin = info["synthetic"]
    assert info["name"] == f"synthetic-day-from-{sample}"
    assert origin["from_trace_id"] == sample and origin["from_trace_name"] == "hour"
    assert (origin["days"], origin["mean_rate"], origin["seed"]) == (1.0, 0.01, 2)
    assert origin["rate_curve"]["name"] == "diurnal"
    assert origin["rate_curve"]["axis"] == "hour_of_day"
    assert origin["rate_curve"]["relative_rates"] == list(DIURNAL.relative_rates)
    assert service.client.get(f"/v1/traces/{sample}", headers=auth).json()["synthetic"] is None
    items = service.client.get("/v1/traces", headers=auth).json()["items"]
    assert [i["synthetic"] is not None for i in items] == [False, True]
    # Another project sees neither.
    other = service.client.get(f"/v1/traces/{made.trace.id}", headers=service.auth(service.key_b))
    assert other.status_code == 404
