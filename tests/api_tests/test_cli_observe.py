"""`servetune observe` on scrapes rendered from a simulated window."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli import app
from optimizer.telemetry.synthetic import VllmTraffic, render_vllm_page

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "colocated-h100.yaml"

pytestmark = pytest.mark.usefixtures("wide_console")


@pytest.fixture
def scrapes(tmp_path: Path) -> tuple[Path, Path]:
    first = VllmTraffic.random(50, 0)
    before, after = tmp_path / "before.prom", tmp_path / "after.prom"
    before.write_text(render_vllm_page(first))
    after.write_text(render_vllm_page(first.plus(VllmTraffic.random(300, 1)), kv_cache_usage=0.4))
    return before, after


def _observe(runner: CliRunner, *args: str):
    return runner.invoke(app, ["observe", *args])


def test_observe_json(cli_db: str, runner: CliRunner, scrapes: tuple[Path, Path]) -> None:
    before, after = scrapes
    out = _observe(runner, "--scrape", str(before), "--scrape", str(after), "--window-s", "60",
                   "--config", str(CONFIG), "--json")  # fmt: skip
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["num_requests"] == 300 and data["num_simulated"] == 300
    assert data["request_rate"] == pytest.approx(5.0)
    assert data["priced_as"].startswith("vLLM ") and data["latency"]
    assert data["kv_cache_usage"]["observed"] == 0.4
    for key in ("ttft", "itl", "e2e"):
        q = data[key]
        assert set(q["observed"]) == {"p50", "p90", "p99"}
        assert q["observed"]["p50"] <= q["observed"]["p99"]
        assert q["predicted"]["p50"] is not None
    assert data["itl"]["metric"] == "vllm:inter_token_latency_seconds"
    assert data["config"]["model"] == "llama-3.1-8b"


def test_observe_table(cli_db: str, runner: CliRunner, scrapes: tuple[Path, Path]) -> None:
    before, after = scrapes
    out = _observe(runner, "--scrape", str(before), "--scrape", str(after), "--window-s", "60",
                   "--config", str(CONFIG))  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "300 requests in 60 s" in out.output and "priced as vLLM" in out.output
    assert "TTFT ms p50 / p90 / p99" in out.output and "KV-cache usage" in out.output


def test_observe_errors(
    cli_db: str, runner: CliRunner, scrapes: tuple[Path, Path], tmp_path: Path
) -> None:
    before, after = scrapes
    base = ["--config", str(CONFIG)]
    out = _observe(runner, "--scrape", str(before), "--scrape", str(after), "--window-s", "0",
                   *base)  # fmt: skip
    assert out.exit_code == 2 and "--window-s must be a positive number of seconds" in out.output
    out = _observe(runner, "--scrape", str(before), "--window-s", "60", *base)
    assert out.exit_code == 2 and "expected two files (BEFORE, then AFTER), got 1" in out.output
    out = _observe(runner, "--scrape", str(after), "--scrape", str(before), "--window-s", "60",
                   *base)  # fmt: skip
    assert out.exit_code == 2 and "counter reset between the scrapes" in out.output
    sglang = tmp_path / "sglang.prom"
    sglang.write_text('sglang:num_running_reqs{model_name="m"} 4\n')
    out = _observe(runner, "--scrape", str(sglang), "--scrape", str(after), "--window-s", "60",
                   *base)  # fmt: skip
    assert out.exit_code == 2 and "BEFORE looks like SGLang's /metrics" in out.output
    broken = tmp_path / "broken.prom"
    broken.write_text('vllm:num_requests_running{engine="0" 3\n')
    out = _observe(runner, "--scrape", str(before), "--scrape", str(broken), "--window-s", "60",
                   *base)  # fmt: skip
    assert out.exit_code == 2 and "AFTER (broken.prom), line 1" in out.output
    out = _observe(runner, "--scrape", str(before), "--scrape", str(tmp_path / "nope.prom"),
                   "--window-s", "60", *base)  # fmt: skip
    assert out.exit_code == 2 and "nope.prom (AFTER): cannot read it" in out.output
    out = _observe(runner, "--scrape", str(before), "--scrape", str(before), "--window-s", "60",
                   *base)  # fmt: skip
    assert out.exit_code == 2 and "no request finished in the window" in out.output
