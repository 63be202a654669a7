"""`servetune deployments create | list | show | delete` and `servetune observe
--deployment`, on the CLI's SQLite database, with scrapes rendered from synthetic traffic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli import app
from tests.api_tests.test_api_deployments import _scrapes
from tests.api_tests.test_cli_observe import CONFIG

pytestmark = pytest.mark.usefixtures("wide_console")


@pytest.fixture
def scrapes(tmp_path: Path) -> tuple[Path, Path]:
    before, after = tmp_path / "before.prom", tmp_path / "after.prom"
    for path, text in zip((before, after), _scrapes(), strict=True):
        path.write_text(text)
    return before, after


def _run(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args))


def _create(runner: CliRunner, *extra: str) -> int:
    out = _run(runner, "deployments", "create", "--name", "prod-chat", "--config", str(CONFIG),
               *extra)  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "stored deployment" in out.output and "vLLM" in out.output
    return int(out.output.split("stored deployment ", 1)[1].split(":", 1)[0])


def test_create_list_show_delete(cli_db: str, runner: CliRunner) -> None:
    first = _create(runner, "--prometheus-url", "http://prometheus:9090",
                    "--selector", '{job="vllm"}')  # fmt: skip
    second = _create(runner)
    listing = _run(runner, "deployments", "list")
    assert listing.exit_code == 0, listing.output
    assert listing.output.index(f"│ {second} ") < listing.output.index(f"│ {first} ")
    assert "llama-3.1-8b" in listing.output and "default" in listing.output
    shown = _run(runner, "deployments", "show", str(first))
    assert shown.exit_code == 0, shown.output
    assert "prod-chat" in shown.output and "1 GPUs" in shown.output
    assert 'http://prometheus:9090 {job="vllm"}' in shown.output
    assert "no observations yet" in shown.output
    assert _run(runner, "deployments", "show", str(first), "--project", "b").exit_code == 2
    deleted = _run(runner, "deployments", "delete", str(first))
    assert deleted.exit_code == 0 and "deleted deployment" in deleted.output
    missing = _run(runner, "deployments", "show", str(first))
    assert missing.exit_code == 2 and f"deployment {first} not found" in missing.output


def test_create_refuses_bad_fields(cli_db: str, runner: CliRunner) -> None:
    base = ["deployments", "create", "--name", "p", "--config", str(CONFIG)]
    out = _run(runner, *base, "--selector", "job=vllm")
    assert out.exit_code == 2 and "--selector 'job=vllm': expected a Prometheus label" in out.output
    out = _run(runner, *base, "--prometheus-url", "prometheus:9090")
    assert out.exit_code == 2 and "expected an http:// or https:// URL" in out.output
    listing = _run(runner, "deployments", "list")
    assert "prod" not in listing.output and "llama" not in listing.output


def test_observe_a_deployment_stores_it(
    cli_db: str, runner: CliRunner, scrapes: tuple[Path, Path]
) -> None:
    before, after = scrapes
    deployment = _create(runner)
    args = ["observe", "--deployment", str(deployment), "--scrape", str(before),
            "--scrape", str(after), "--window-s", "60"]  # fmt: skip
    table = _run(runner, *args)
    assert table.exit_code == 0, table.output
    assert "300 requests in 60 s" in table.output and "stored observation 1" in table.output
    data = json.loads(_run(runner, *args, "--json").output)
    assert data["observation_id"] == 2 and data["deployment_id"] == deployment
    assert data["config"]["model"] == "llama-3.1-8b" and data["num_requests"] == 300
    shown = _run(runner, "deployments", "show", str(deployment))
    assert shown.exit_code == 0, shown.output
    rows = [line for line in shown.output.splitlines() if line.startswith("│ ")]
    assert [row.split("│")[1].strip() for row in rows] == ["2", "1"]  # newest first
    ttft = data["ttft"]
    expected = f"{ttft['observed']['p90'] * 1e3:,.1f} / {ttft['predicted']['p90'] * 1e3:,.1f}"
    assert expected in rows[0], rows


def test_observe_refuses_a_missing_deployment_or_both_sources(
    cli_db: str, runner: CliRunner, scrapes: tuple[Path, Path]
) -> None:
    before, after = scrapes
    base = ["observe", "--scrape", str(before), "--scrape", str(after), "--window-s", "60"]
    out = _run(runner, *base, "--deployment", "7")
    assert out.exit_code == 2 and "--deployment: deployment 7 not found" in out.output
    out = _run(runner, *base, "--deployment", "7", "--config", str(CONFIG))
    assert out.exit_code == 2 and "exactly one of --config" in out.output
    out = _run(runner, *base)
    assert out.exit_code == 2 and "exactly one of --config" in out.output
    deployment = _create(runner)
    out = _run(runner, "observe", "--scrape", str(after), "--scrape", str(before),
               "--window-s", "60", "--deployment", str(deployment))  # fmt: skip
    assert out.exit_code == 2 and "counter reset" in out.output
    assert "no observations yet" in _run(runner, "deployments", "show", str(deployment)).output


def test_schedule_a_deployment(cli_db: str, runner: CliRunner) -> None:
    where = ("--prometheus-url", "http://prometheus:9090", "--selector", '{job="vllm"}')
    out = _run(runner, "deployments", "create", "--name", "p", "--config", str(CONFIG), *where)
    assert out.exit_code == 0, out.output
    slo = ("--gpus", "8", "--slo-ttft-ms", "500", "--slo-tpot-ms", "50")
    out = _run(runner, "deployments", "schedule", "1", "--every", "10m", *slo,
               "--error-threshold", "0.5")  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "stored schedule 1: every 10m, windows of 600 s" in out.output
    assert "p90 error beyond 50%" in out.output
    from api.cli.common import session
    from storage.schedules import get_schedule

    with session() as s:
        info = get_schedule(s, 1)
    assert info.deployment_id == 1 and info.interval_s == 600 and info.error_threshold == 0.5
    assert info.params.window_s == 600 and info.params.gpu_types == ("h100",)
    assert info.params.source == "deployment:1" and info.trigger == "drift"
    shown = _run(runner, "deployments", "show", "1")
    assert "schedule 1: every 600 s, re-tunes on drift beyond 30%; fired 0; last not run yet" in (
        " ".join(shown.output.split())
    )
    bad = _run(runner, "deployments", "schedule", "1", "--every", "soon", *slo)
    assert bad.exit_code == 2 and "--every 'soon': expected a positive duration" in bad.output
    out = _run(runner, "deployments", "create", "--name", "q", "--config", str(CONFIG))
    assert out.exit_code == 0
    bad = _run(runner, "deployments", "schedule", "2", "--every", "10m", *slo)
    assert bad.exit_code == 2 and "has no Prometheus URL and selector" in bad.output
    bad = _run(runner, "deployments", "schedule", "9", "--every", "10m", *slo)
    assert bad.exit_code == 2 and "deployment 9 not found" in bad.output
