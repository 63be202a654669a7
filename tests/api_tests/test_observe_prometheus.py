"""`servetune observe --deployment ID --window W` against a real Prometheus server.

A stdlib HTTP thread serves a fake vLLM /metrics page (`render_vllm_page`) whose
counters grow with wall time at RATE requests per second; Debian's `prometheus` binary,
started on a free port with its own config and data dir (`tests.prometheus`), scrapes it
every second. The tests skip with a visible reason when the binary is absent, and fail
instead when SERVETUNE_REQUIRE_PROMETHEUS=1 (CI). Tests of errors that need no server run
always.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli import app
from api.services.prometheus import parse_time, parse_window
from optimizer.telemetry.synthetic import VllmTraffic, render_vllm_page
from tests.prometheus import SCRAPE_INTERVAL_S, ScrapeJob, free_port, query, running_prometheus

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "colocated-h100.yaml"
RATE = 20.0  # requests per second the fake server finishes
NUM_REQUESTS = 4000  # enough for 200 s at RATE
RESET_S = 4.0  # the second fake server (job vllm-resetting) restarts this often
WINDOW_S = 10.0

pytestmark = pytest.mark.usefixtures("wide_console")


def _first(t: VllmTraffic, n: int) -> VllmTraffic:
    return VllmTraffic(
        t.ttft_s[:n], t.e2e_s[:n], t.queue_s[:n], t.prompt_tokens[:n], t.output_tokens[:n],
        t.itl_gaps_s[:n], t.itl_gap_weights[:n], 0,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class FakeVllm:
    url: str
    started: float  # time.time() at which the counters were zero

    def served(self, at: float) -> int:
        """Requests finished by `at` (unix seconds), as the page shows them then."""
        return min(NUM_REQUESTS, max(0, int(RATE * (at - self.started))))

    def served_resetting(self, at: float) -> int:
        """What the restarting server's counters show at `at`: zero every RESET_S s."""
        return int(RATE * ((at - self.started) % RESET_S))


@dataclass(frozen=True, slots=True)
class PrometheusServer:
    url: str
    fake: FakeVllm


@pytest.fixture(scope="module")
def fake_vllm() -> Iterator[FakeVllm]:
    traffic = VllmTraffic.random(NUM_REQUESTS, 0)
    started = time.time()
    fake = None

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            now = time.time()
            n = {"/resetting": fake.served_resetting(now), "/idle": 0}.get(
                self.path, fake.served(now)
            )
            page = render_vllm_page(_first(traffic, n))
            if self.path == "/escaped":  # as prometheus_client 0.26 answers Prometheus 2.x
                page = page.replace("vllm:", "vllm_")
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake = FakeVllm(f"127.0.0.1:{server.server_address[1]}", started)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def prometheus(fake_vllm: FakeVllm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus process scraping `fake_vllm` every second; its base URL."""
    jobs = [
        ScrapeJob("vllm", fake_vllm.url),
        ScrapeJob("vllm-resetting", fake_vllm.url, "/resetting"),
        ScrapeJob("vllm-idle", fake_vllm.url, "/idle"),
        ScrapeJob("vllm-escaped", fake_vllm.url, "/escaped"),
    ]
    with running_prometheus(tmp_path_factory.mktemp("prometheus"), jobs) as url:
        yield url


def _deployment(runner: CliRunner, url: str, selector: str = '{job="vllm"}') -> str:
    out = runner.invoke(app, ["deployments", "create", "--name", "prod", "--config", str(CONFIG),
                              "--prometheus-url", url, "--selector", selector])  # fmt: skip
    assert out.exit_code == 0, out.output
    from api.cli.common import session
    from storage.deployments import list_deployments

    with session() as s:
        return str(list_deployments(s)[0].id)


def _wait_for_data(seconds: float, prometheus: str) -> None:
    """Until Prometheus holds `seconds` of samples (plus two scrapes)."""
    wait = _first_sample(prometheus) + seconds + 2 * SCRAPE_INTERVAL_S - time.time()
    if wait > 0:
        time.sleep(wait)


def _first_sample(prometheus: str) -> float:
    promql = 'vllm:request_success_total{job="vllm",finished_reason="stop"}[1m]'
    for _ in range(20):
        result = query(prometheus, promql)
        if result:
            return float(result[0]["values"][0][0])
        time.sleep(0.5)
    raise AssertionError("Prometheus holds no vllm series after 10 s")


def _observe_window(runner: CliRunner, prometheus: str, selector: str = '{job="vllm"}'):
    """A deployment over `selector`, observed over the last WINDOW_S s once Prometheus
    holds them: (deployment id, the window's end, the CLI's result)."""
    deployment = _deployment(runner, prometheus, selector)
    _wait_for_data(WINDOW_S, prometheus)
    end = time.time() - 0.5
    out = runner.invoke(app, ["observe", "--deployment", deployment, "--window", "10s",
                              "--at", f"{end:.3f}", "--json"])  # fmt: skip
    return deployment, end, out


def test_observe_window_from_prometheus(
    cli_db: str, runner: CliRunner, prometheus: str, fake_vllm: FakeVllm
) -> None:
    deployment, end, out = _observe_window(runner, prometheus)
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    served = fake_vllm.served(end) - fake_vllm.served(end - WINDOW_S)
    assert served == pytest.approx(RATE * WINDOW_S, abs=1)
    # increase() extrapolates the window's first and last samples to its edges: within
    # one scrape interval's requests of what the fake server finished in the window.
    assert abs(data["num_requests"] - served) <= RATE * SCRAPE_INTERVAL_S
    assert data["window_s"] == WINDOW_S
    assert data["ttft"]["observed"]["p50"] == pytest.approx(0.11, abs=0.04)
    assert data["kv_cache_usage"]["observed"] == 0.25  # the gauge at the window's end
    from api.cli.common import session
    from storage.deployments import list_observations

    with session() as s:
        (stored,) = list_observations(s, int(deployment))
    assert stored.id == data["observation_id"] and stored.window_s == WINDOW_S
    assert stored.report["num_requests"] == data["num_requests"]
    assert stored.request_rate == pytest.approx(data["num_requests"] / WINDOW_S)


def test_escaped_names_are_read_as_vllms(
    cli_db: str, runner: CliRunner, prometheus: str, fake_vllm: FakeVllm
) -> None:
    """A server whose names Prometheus stored as `vllm_...` (the colon escaped) is read as
    the same window as one stored as vLLM spells them."""
    _, end, out = _observe_window(runner, prometheus, '{job="vllm-escaped"}')
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    served = fake_vllm.served(end) - fake_vllm.served(end - WINDOW_S)
    assert abs(data["num_requests"] - served) <= RATE * SCRAPE_INTERVAL_S
    assert data["itl"]["metric"] == "vllm:inter_token_latency_seconds"
    assert data["kv_cache_usage"]["observed"] == 0.25


def test_counter_resets_inside_the_window(
    cli_db: str, runner: CliRunner, prometheus: str, fake_vllm: FakeVllm
) -> None:
    """increase() adds across restarts; two raw instants would see a fall (or too little)."""
    _, end, out = _observe_window(runner, prometheus, '{job="vllm-resetting"}')
    assert out.exit_code == 0, out.output
    num_resets = int((end - fake_vllm.started) // RESET_S) - int(
        (end - WINDOW_S - fake_vllm.started) // RESET_S
    )
    assert num_resets >= 2
    finished = RATE * WINDOW_S  # the server finished requests throughout
    # Lost per reset: what finished between the last scrape before it and the reset.
    lost = num_resets * RATE * SCRAPE_INTERVAL_S
    num_requests = json.loads(out.output)["num_requests"]
    assert finished - lost - RATE * SCRAPE_INTERVAL_S <= num_requests <= finished + RATE


def test_window_shorter_than_two_scrapes(cli_db: str, runner: CliRunner, prometheus: str) -> None:
    deployment = _deployment(runner, prometheus)
    _wait_for_data(2, prometheus)
    out = runner.invoke(app, ["observe", "--deployment", deployment, "--window", "0.5s"])
    assert out.exit_code == 2
    assert "does the window span two scrapes?" in " ".join(out.output.split())


def test_window_without_traffic(cli_db: str, runner: CliRunner, prometheus: str) -> None:
    deployment = _deployment(runner, prometheus, '{job="vllm-idle"}')
    _wait_for_data(3, prometheus)
    out = runner.invoke(app, ["observe", "--deployment", deployment, "--window", "3s"])
    assert out.exit_code == 2
    assert 'no request finished in the window (the increase of vllm:request_success_total{job="' \
        in " ".join(out.output.split())  # fmt: skip


def test_window_longer_than_the_data(cli_db: str, runner: CliRunner, prometheus: str) -> None:
    deployment = _deployment(runner, prometheus)
    out = runner.invoke(app, ["observe", "--deployment", deployment, "--window", "1h"])
    assert out.exit_code == 2
    assert "is longer than the data Prometheus at" in out.output
    assert "oldest sample in the window" in out.output


def test_selector_matching_nothing(cli_db: str, runner: CliRunner, prometheus: str) -> None:
    deployment = _deployment(runner, prometheus, '{job="nope"}')
    out = runner.invoke(app, ["observe", "--deployment", deployment, "--window", "10s"])
    assert out.exit_code == 2
    assert 'no vllm:request_success_total series match {job="nope"} at' in out.output
    assert "is the selector right and is Prometheus scraping the server?" in out.output


def test_query_error_is_prometheus_own(cli_db: str, runner: CliRunner, prometheus: str) -> None:
    deployment = _deployment(runner, prometheus, '{job=~"("}')
    out = runner.invoke(app, ["observe", "--deployment", deployment, "--window", "10s"])
    assert out.exit_code == 2
    assert f"Prometheus at {prometheus} refused" in out.output
    assert "missing closing )" in out.output  # Prometheus's own error text (Go regexp)


def test_unreachable_names_the_url(cli_db: str, runner: CliRunner) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    deployment = _deployment(runner, url)
    out = runner.invoke(app, ["observe", "--deployment", deployment, "--window", "10s"])
    assert out.exit_code == 2
    assert f"Prometheus at {url} is unreachable" in out.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--window", "10"], "expected a positive duration such as 30s, 10m, 1h, 1d"),
        (["--window", "0s"], "expected a positive duration"),
        (["--window", "1h", "--at", "yesterday"], "expected an RFC 3339 time"),
        (["--window", "1h", "--at", "2999-01-01T00:00:00Z"], "is in the future"),
        (["--window", "1h", "--window-s", "60"], "without --scrape or --window-s"),
    ],
)
def test_window_arguments_refused(
    cli_db: str, runner: CliRunner, args: list[str], message: str
) -> None:
    deployment = _deployment(runner, "http://127.0.0.1:9")
    out = runner.invoke(app, ["observe", "--deployment", deployment, *args])
    assert out.exit_code == 2 and message in " ".join(out.output.split()), out.output


def test_deployment_without_prometheus(cli_db: str, runner: CliRunner) -> None:
    out = runner.invoke(app, ["deployments", "create", "--name", "p", "--config", str(CONFIG)])
    assert out.exit_code == 0, out.output
    out = runner.invoke(app, ["observe", "--deployment", "1", "--window", "10s"])
    assert out.exit_code == 2
    assert "has no stored Prometheus URL and label selector" in " ".join(out.output.split())


def test_parse_window_and_time() -> None:
    assert [parse_window(w) for w in ("30s", "10m", "1h", "1d", "0.5s")] == [
        30.0, 600.0, 3600.0, 86400.0, 0.5,
    ]  # fmt: skip
    now = datetime(2026, 12, 1, 17, 0, tzinfo=UTC)
    assert parse_time(None, now=now) == now
    assert parse_time("2026-12-01T16:00:00Z", now=now) == datetime(2026, 12, 1, 16, tzinfo=UTC)
    assert parse_time("2026-12-01T16:00:00", now=now) == datetime(2026, 12, 1, 16, tzinfo=UTC)
    assert parse_time("2026-12-01T17:30:00+01:00", now=now) == now - timedelta(minutes=30)
    assert parse_time(f"{now.timestamp() - 60:.0f}", now=now) == datetime(
        2026, 12, 1, 16, 59, tzinfo=UTC
    )
    for bad in ("1w", "-5s", "10", "5 minutes", "0m"):
        with pytest.raises(ValueError, match="expected a positive duration"):
            parse_window(bad)
