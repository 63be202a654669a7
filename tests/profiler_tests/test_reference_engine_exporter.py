"""The reference engine's vLLM /metrics page: exact bookkeeping in process, and end to end
through a real Prometheus server and `servetune observe --deployment ID --window W`."""

from __future__ import annotations

import json
import math
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from prometheus_client import generate_latest
from typer.testing import CliRunner

from api.cli import app
from optimizer.config import ServingConfig
from optimizer.telemetry import parse_exposition, read_vllm
from optimizer.telemetry import vllm as names
from optimizer.telemetry.synthetic import ITL_BUCKETS_S, TTFT_BUCKETS_S, token_buckets
from profiler.reference_engine import EngineError, OpenLoopTraffic, ReplayOptions, TrafficPhase
from profiler.reference_engine.exporter import (
    TEXT_FORMAT,
    VllmMetrics,
    exporter_spec,
    main,
    max_request_tokens,
    serve_metrics,
    serve_open_loop,
)
from profiler.reference_engine.scheduler import Scheduler, SchedulerLimits
from tests.profiler_tests.test_reference_engine_scheduler import make_request, run_step
from tests.prometheus import SCRAPE_INTERVAL_S, ScrapeJob, free_port, query, running_prometheus

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "reference-engine.yaml"
MAX_MODEL_LEN = 2048  # the example config's
# End to end: traffic the 2-core CPU keeps up with (the engine serves ~30 req/s of
# 200/40-token requests before it falls behind), a window inside it.
PHASE = TrafficPhase(3.0, 30.0)
PROMPT_MEAN, OUTPUT_MEAN, SEED = 100.0, 12.0, 0
WINDOW_S = 15.0


def _config() -> ServingConfig:
    return ServingConfig.from_dict(yaml.safe_load(CONFIG.read_text()))


def _scrape(metrics: VllmMetrics):
    page = generate_latest(metrics.registry).decode()
    return read_vllm(parse_exposition(page, source="PAGE"), source="PAGE"), page


def test_served_traffic_is_counted_exactly() -> None:
    config = _config()
    traffic = OpenLoopTraffic((TrafficPhase(6.0, 2.0),), prompt_mean=80, output_mean=8, seed=3)
    metrics = VllmMetrics(config.model, MAX_MODEL_LEN)
    phases: list[int] = []
    run = serve_open_loop(config, traffic, metrics, on_phase=lambda i, p: phases.append(i))
    scrape, page = _scrape(metrics)
    reqs = run.requests
    n = len(reqs)
    assert n >= 5 and phases == [1]
    assert all(r.num_generated == r.num_output for r in reqs)
    arrived = np.array([run.t0 + r.arrival_s for r in reqs])
    first = np.array([r.token_times_s[0] for r in reqs])
    last = np.array([r.token_times_s[-1] for r in reqs])
    scheduled = np.array([r.first_scheduled_s for r in reqs])
    prompts = sum(r.num_prompt for r in reqs)
    outputs = sum(r.num_output for r in reqs)
    assert scrape.num_requests_success == n
    assert scrape.num_prompt_tokens == prompts == scrape.prompt_tokens.sum
    assert scrape.prompt_tokens.count == n
    assert scrape.num_generation_tokens == outputs == scrape.generation_tokens.sum
    assert scrape.ttft.count == n and scrape.e2e.count == n and scrape.queue.count == n
    assert scrape.itl.count == sum(r.num_output - 1 for r in reqs)
    assert scrape.ttft.sum == pytest.approx(float((first - arrived).sum()), abs=1e-6)
    assert scrape.e2e.sum == pytest.approx(float((last - arrived).sum()), abs=1e-6)
    assert scrape.itl.sum == pytest.approx(float((last - first).sum()), abs=1e-6)
    assert scrape.queue.sum == pytest.approx(float((scheduled - arrived).sum()), abs=1e-6)
    assert np.all(scheduled >= arrived) and np.all(first > scheduled)
    assert scrape.num_preemptions == sum(r.num_preemptions for r in reqs)
    assert scrape.num_requests_running == scrape.num_requests_waiting == 0
    assert scrape.kv_cache_usage == 0.0  # every block given back
    # The measured outcome agrees with the page (TTFT as ReplayResult computes it).
    assert run.result.ttft_s.sum() == pytest.approx(scrape.ttft.sum, abs=1e-6)
    # vLLM's names, labels and buckets; prometheus_client's _created series are ignored.
    assert scrape.model_names == ("tiny",)
    assert scrape.ttft.upper_bounds == (*TTFT_BUCKETS_S, math.inf)
    assert scrape.itl.upper_bounds == (*ITL_BUCKETS_S, math.inf)
    assert scrape.prompt_tokens.upper_bounds == (*token_buckets(MAX_MODEL_LEN), math.inf)
    assert scrape.itl_name == names.ITL
    assert f'{names.REQUEST_SUCCESS}{{engine="0",finished_reason="length",model_name="tiny"}}' \
        in page  # fmt: skip
    assert "vllm:request_success_created{" in page


def test_metrics_follow_a_scheduler_through_preemption() -> None:
    """Driven by the scheduler alone (fake tokens at set times): tokens are observed as
    they appear, preemptions and the gauges after each step."""
    limits = SchedulerLimits(max_num_batched_tokens=32, max_num_seqs=4,
                             enable_chunked_prefill=True, block_size=4, num_blocks=6)  # fmt: skip
    s = Scheduler(limits)
    a, b = make_request(0, 8, 8), make_request(1, 8, 8)
    s.add(a)
    s.add(b)
    metrics = VllmMetrics("tiny", 64)
    t = 1.0
    _, done = run_step(s, t)
    metrics.on_step(s)
    for r in s.running:
        metrics.on_tokens(r, 0.5)
    scrape, _ = _scrape(metrics)
    assert scrape.ttft.count == 2 and scrape.ttft.sum == pytest.approx(1.0)  # both at 1.0
    assert scrape.num_prompt_tokens == 16 and scrape.num_generation_tokens == 2
    assert scrape.kv_cache_usage == pytest.approx(4 / 6)  # 2 blocks each for 8 tokens
    assert scrape.num_requests_running == 2
    while s.has_work():
        t += 1.0
        _, done = run_step(s, t)
        for r in done:
            metrics.on_finished(r, 0.5)
        for r in s.running:
            metrics.on_tokens(r, 0.5)
        metrics.on_step(s)
    scrape, _ = _scrape(metrics)
    assert b.num_preemptions > 0 and scrape.num_preemptions == s.num_preemptions
    assert scrape.num_requests_success == 2 and scrape.ttft.count == 2
    assert scrape.itl.count == 14 and scrape.num_generation_tokens == 16
    assert scrape.e2e.sum == pytest.approx(a.token_times_s[-1] + b.token_times_s[-1] - 1.0)
    assert scrape.num_prompt_tokens == 16  # a recomputed prompt is counted once, as vLLM does
    assert scrape.kv_cache_usage == 0.0 and scrape.num_requests_running == 0


def test_traffic_is_drawn_within_the_capacity() -> None:
    traffic = OpenLoopTraffic((TrafficPhase(50, 4), TrafficPhase(0, 1), TrafficPhase(100, 2)),
                              prompt_mean=200, output_mean=40, seed=1)  # fmt: skip
    reqs = traffic.draw(300)
    total = reqs.input_tokens + reqs.output_tokens
    assert np.all(total <= 300) and np.all(reqs.output_tokens >= 1)
    assert not np.any((reqs.arrival_s >= 4) & (reqs.arrival_s < 5))  # the idle phase
    assert 150 <= np.sum(reqs.arrival_s < 4) <= 250 and 150 <= np.sum(reqs.arrival_s >= 5) <= 250
    assert traffic.starts_s() == [0.0, 4.0, 5.0] and traffic.duration_s == 7.0
    wide = OpenLoopTraffic((TrafficPhase(500, 4),), prompt_mean=200, output_mean=40).draw(10**5)
    assert wide.input_tokens.mean() == pytest.approx(200, rel=0.05)
    assert wide.output_tokens.mean() == pytest.approx(40, rel=0.05)
    assert np.array_equal(traffic.draw(300).input_tokens, reqs.input_tokens)  # seeded


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--phase", "3"], "--phase '3': expected RATE:SECONDS"),
        (["--phase=-1:5"], "a phase's rate must be >= 0 requests/s, got -1"),
        (["--phase", "1:0"], "a phase's duration must be > 0 s"),
        (["--phase", "0:5"], "the phases draw no request"),
        (["--phase", "1:5", "--port", "70000"], "--port must be 0-65535"),
        (["--phase", "1:5", "--prompt-mean", "0"], "the mean prompt length must be >= 1"),
        (["--phase", "1:5", "--linger-s", "-1"], "--linger-s must be >= 0 seconds"),
        (["--phase", "1:5", "--config", "examples/colocated-h100.yaml"], "must be cpu"),
        (["--phase", "1:5", "--config", "nope.yaml"], "--config nope.yaml: cannot read YAML"),
    ],
)
def test_bad_arguments_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.chdir(REPO)
    argv = ["--config", str(CONFIG), "--port", "0", *args]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_the_port_in_use_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as exc:
            main(["--config", str(CONFIG), "--port", str(port), "--phase", "1:5"])
    assert exc.value.code == 2
    assert f"--port {port}: cannot listen on 127.0.0.1" in capsys.readouterr().err


def test_refuses_what_it_cannot_serve() -> None:
    data = yaml.safe_load(CONFIG.read_text())
    data["replica"]["tp"] = 2
    with pytest.raises(EngineError, match="tp=1 only"):
        exporter_spec(ServingConfig.from_dict(data), ReplayOptions())
    assert max_request_tokens(_config(), exporter_spec(_config(), ReplayOptions())) == 2048


def _read_line(process: subprocess.Popen, timeout_s: float) -> str:
    with selectors.DefaultSelector() as sel:
        sel.register(process.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            raise AssertionError(f"the exporter printed nothing in {timeout_s:g} s")
    return process.stdout.readline()


def _wait_for_data(prometheus: str, seconds: float) -> None:
    """Until Prometheus holds `seconds` of the exporter's samples (plus two scrapes)."""
    promql = 'vllm:request_success_total{job="reference-engine"}[1m]'
    deadline = time.monotonic() + 10
    while not (result := query(prometheus, promql)):
        assert time.monotonic() < deadline, "Prometheus holds no series of the exporter"
        time.sleep(0.5)
    first = float(result[0]["values"][0][0])
    time.sleep(max(0.0, first + seconds + 2 * SCRAPE_INTERVAL_S - time.time()))


def test_observe_reads_the_engine_through_prometheus(
    cli_db: str, runner: CliRunner, tmp_path: Path
) -> None:
    """The exporter CLI serving 3 req/s, Prometheus scraping it every second, and
    `servetune observe --deployment ID --window 15s` reading the window back."""
    port = free_port()
    command = [sys.executable, "-m", "profiler.reference_engine.exporter", "--config",
               str(CONFIG), "--port", str(port), "--phase", f"{PHASE.rate_rps:g}:"
               f"{PHASE.duration_s:g}", "--prompt-mean", f"{PROMPT_MEAN:g}", "--output-mean",
               f"{OUTPUT_MEAN:g}", "--seed", str(SEED), "--linger-s", "5"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    exporter = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        line = _read_line(exporter, 60)
        assert line == f"serving vLLM metrics on http://127.0.0.1:{port}/metrics\n", line
        assert _read_line(exporter, 10) == "phase 1: 3 req/s for 30 s\n"
        job = ScrapeJob("reference-engine", f"127.0.0.1:{port}")
        with running_prometheus(tmp_path, [job]) as prometheus:
            out = runner.invoke(app, ["deployments", "create", "--name", "reference", "--config",
                                      str(CONFIG), "--prometheus-url", prometheus, "--selector",
                                      '{job="reference-engine"}'])  # fmt: skip
            assert out.exit_code == 0, out.output
            _wait_for_data(prometheus, WINDOW_S + 5)
            out = runner.invoke(app, ["observe", "--deployment", "1", "--window",
                                      f"{WINDOW_S:g}s", "--json"])  # fmt: skip
        assert exporter.poll() is None, "the exporter stopped before the window was read"
    finally:
        exporter.terminate()
        exporter.wait(10)
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    config = _config()
    drawn = OpenLoopTraffic((PHASE,), prompt_mean=PROMPT_MEAN, output_mean=OUTPUT_MEAN,
                            seed=SEED).draw(max_request_tokens(config, exporter_spec(
                                config, ReplayOptions(seed=SEED))))  # fmt: skip
    assert data["window_s"] == WINDOW_S
    assert data["request_rate"] == pytest.approx(PHASE.rate_rps, rel=0.4)
    prompt_mean = float(drawn.input_tokens.mean())
    assert data["mean_prompt_tokens"]["observed"] == pytest.approx(prompt_mean, rel=0.25)
    for figure in ("ttft", "itl", "e2e"):
        predicted = data[figure]["predicted"]
        assert all(predicted[q] is not None and predicted[q] > 0 for q in ("p50", "p90", "p99"))
        assert data[figure]["observed_mean_s"] > 0 and data[figure]["predicted_mean_s"] > 0
    assert data["mean_prompt_tokens"]["predicted"] is not None
    assert data["queue_mean_s"]["observed"] is not None
    assert data["kv_cache_usage"]["observed"] is not None


def test_the_page_keeps_vllm_names_for_an_openmetrics_scraper() -> None:
    """Prometheus 2.x asks for OpenMetrics first; the page stays text 0.0.4 with `vllm:`."""
    import urllib.error
    import urllib.request

    metrics = VllmMetrics("tiny", 64)
    server = serve_metrics(metrics, 0)
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        accept = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                  "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")  # fmt: skip
        request = urllib.request.Request(f"{url}/metrics", headers={"Accept": accept})
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.headers["Content-Type"] == TEXT_FORMAT
            page = response.read().decode()
        assert "\nvllm:request_success_total{" in page and "vllm_" not in page
        read_vllm(parse_exposition(page, source="PAGE"), source="PAGE")
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"{url}/", timeout=5)
    finally:
        server.shutdown()
        server.server_close()
