"""A real Prometheus server for tests: Debian's `prometheus` binary on a free port.

`running_prometheus(home, jobs)` writes a config scraping each `ScrapeJob` every
`SCRAPE_INTERVAL_S`, starts the binary with its own data dir under `home`, waits until
the first job's target is up, yields the base URL and stops the process. Without the
binary the test skips with a visible reason; with SERVETUNE_REQUIRE_PROMETHEUS=1 (CI)
it fails instead.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRAPE_INTERVAL_S = 1.0
START_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class ScrapeJob:
    name: str
    target: str  # host:port
    metrics_path: str = "/metrics"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.read()


def query(prometheus: str, promql: str) -> list[dict]:
    """The `result` of an instant query."""
    answer = get(f"{prometheus}/api/v1/query?query={urllib.parse.quote(promql)}")
    return json.loads(answer)["data"]["result"]


def prometheus_binary() -> str:
    """The binary's path; skips (or fails, when required) without it."""
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("SERVETUNE_REQUIRE_PROMETHEUS", "") in ("1", "true", "yes"):
            pytest.fail("Prometheus required (SERVETUNE_REQUIRE_PROMETHEUS=1) but no prometheus "
                        "binary on PATH (Debian: apt-get install prometheus)")  # fmt: skip
        pytest.skip("no prometheus binary on PATH (apt-get install prometheus; set "
                    "SERVETUNE_REQUIRE_PROMETHEUS=1 to make this a failure)")  # fmt: skip
    return binary


def _config(jobs: Sequence[ScrapeJob]) -> str:
    lines = [
        f"global:\n  scrape_interval: {SCRAPE_INTERVAL_S:g}s\n"
        f"  scrape_timeout: {SCRAPE_INTERVAL_S:g}s\nscrape_configs:"
    ]
    for job in jobs:
        lines.append(
            f"  - job_name: {job.name}\n    metrics_path: {job.metrics_path}\n"
            f"    static_configs:\n      - targets: ['{job.target}']"
        )
    return "\n".join(lines) + "\n"


@contextmanager
def running_prometheus(home: Path, jobs: Sequence[ScrapeJob]) -> Iterator[str]:
    """A Prometheus process scraping `jobs`, once it has scraped `jobs[0]`; its base URL."""
    binary = prometheus_binary()
    (home / "prometheus.yml").write_text(_config(jobs))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = home / "prometheus.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [binary, f"--config.file={home / 'prometheus.yml'}", f"--storage.tsdb.path={home / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                up = query(url, f'up{{job="{jobs[0].name}"}}')
                if up and up[0]["value"][1] == "1":
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Prometheus did not start scraping: {log_path}\n"
                            f"{log_path.read_text()[-2000:]}")  # fmt: skip
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
