"""The result and deployment pages in a real headless browser (Debian's chromium driven by
playwright); the result page with JavaScript disabled.

Skips with a visible reason without chromium or playwright; mandatory when
SERVETUNE_REQUIRE_BROWSER=1.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api_tests.conftest import make_service_keys, write_trace_csv

CHROMIUM = os.environ.get("SERVETUNE_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def _browser_missing() -> str | None:
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        return f"chromium not found at {CHROMIUM} (apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; never `playwright install`)"
    return None


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    import uvicorn

    from api.app import create_app
    from api.settings import Settings
    from storage.service_records import JobKind
    from tests.api_tests.fakes import make_fake_executor

    url = f"sqlite:///{tmp_path / 'ui.db'}"
    key, _, _ = make_service_keys(url)
    app = create_app(
        Settings(database_url=url, worker_poll_s=0.2, lease_s=5),
        embedded_worker=True,
        executors={JobKind.TUNING: make_fake_executor(0.05)},
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield base, key
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _require_browser() -> None:
    missing = _browser_missing()
    if missing:
        if os.environ.get("SERVETUNE_REQUIRE_BROWSER", "") in ("1", "true", "yes"):
            pytest.fail(f"browser required (SERVETUNE_REQUIRE_BROWSER=1) but {missing}")
        pytest.skip(f"browser test skipped: {missing} (set SERVETUNE_REQUIRE_BROWSER=1 to fail)")


def test_result_page_without_javascript(live_server, tmp_path: Path) -> None:
    """With JavaScript disabled: the key form (a plain form, the key kept in an HttpOnly
    cookie), the page reloading itself until the job ends, then the whole summary in the
    HTML; another project's job is not found; "forget key" asks again."""
    _require_browser()
    from playwright.sync_api import sync_playwright

    base, key = live_server
    auth = {"Authorization": f"Bearer {key}"}
    trace = write_trace_csv(tmp_path / "t.csv")
    with httpx.Client(base_url=base, headers=auth, timeout=30) as http:
        tid = http.post("/v1/traces", files={"file": trace.open("rb")}).json()["id"]
        job = http.post(
            "/v1/tuning-jobs",
            json={
                "trace_id": tid,
                "model": "llama-3.1-8b",
                "gpu_types": ["h100"],
                "gpu_budget": 8,
                "slo_ttft_ms": 2000,
                "slo_tpot_ms": 50,
                "num_trials": 20,
            },
        ).json()
    shot = tmp_path / "job.png"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            context = browser.new_context(
                java_script_enabled=False, viewport={"width": 1200, "height": 1400}
            )
            page = context.new_page()
            first = page.goto(base + job["ui_url"])
            assert first is not None and first.status == 401
            page.fill("#key-input", key)  # the key is asked for once ...
            page.click("#key-entry button")
            # ... and the page reloads itself (a meta refresh) until the job ends.
            page.wait_for_selector("#status.succeeded", timeout=60_000)
            assert page.inner_text("#progress-text") == "trials 20 / 20"
            with httpx.Client(base_url=base, headers=auth, timeout=30) as http:
                outcome = http.get(f"/v1/tuning-jobs/{job['id']}/result").json()["outcome"]
            headline = outcome["verdict"]["headline"]
            assert page.inner_text("#headline") == headline
            assert page.inner_text("#baseline-sentence") == outcome["verdict"]["baseline"]
            assert "ttft_p90_ms" in page.inner_text("#slo-checks")
            assert page.locator("#pareto svg circle").count() == 6
            assert page.locator("#pareto svg rect.baseline").count() == 1
            assert "vllm serve meta-llama/Llama-3.1-8B-Instruct" in page.inner_text("#commands")
            assert "Decode-bound" in page.inner_text("#diagnosis")
            assert page.locator("button.copy").count() == 0  # no script ran
            page.screenshot(path=str(shot), full_page=True)
            page.reload()  # the key is kept (the cookie)
            assert page.inner_text("#headline") == headline
            page.goto(base + "/ui/jobs/999999")
            assert "Tuning job 999999 not found" in page.inner_text("#error")
            page.goto(base + job["ui_url"])
            page.click("#forget-key")  # forget: the form again
            assert page.is_visible("#key-form") and page.locator("#headline").count() == 0

            # With JavaScript: the same HTML, plus copy buttons and a point's figures.
            scripted = browser.new_context(viewport={"width": 1200, "height": 1400})
            page = scripted.new_page()
            page.goto(base + job["ui_url"])
            page.fill("#key-input", key)
            page.click("#key-entry button")
            page.wait_for_selector("#headline")
            commands = page.locator("#commands pre.command").count()
            assert commands > 0 and page.locator("button.copy").count() == commands
            page.locator("#pareto circle.recommended").hover()
            assert page.inner_text("#tip").startswith("trial 0: 2 GPUs")
        finally:
            browser.close()
    if os.environ.get("SERVETUNE_SCREENSHOT_COPY"):
        shutil.copy(shot, os.environ["SERVETUNE_SCREENSHOT_COPY"])
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_deployment_page_plots_windows_and_the_retune(
    live_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three observed windows of a deployment schedule (the third at twice the rate, which
    re-tunes): the page plots observed against predicted p90s per window and puts the
    re-tune's recommendation beside the deployed config."""
    _require_browser()
    from datetime import UTC, datetime, timedelta

    import yaml
    from playwright.sync_api import sync_playwright

    from api.worker.scheduling import fire_due_schedules
    from storage.db import make_engine
    from tests.api_tests.test_deployment_schedule import FakePrometheus

    fake = FakePrometheus()
    monkeypatch.setattr("api.worker.deployment_drift.read_prometheus", fake)
    base, key = live_server
    auth = {"Authorization": f"Bearer {key}"}
    config = yaml.safe_load(
        (Path(__file__).parents[2] / "examples/colocated-h100.yaml").read_text()
    )
    with httpx.Client(base_url=base, headers=auth, timeout=30) as http:
        d = http.post("/v1/deployments", json={"name": "prod", "config": config,
                      "prometheus_url": "http://prometheus:9090",
                      "label_selector": '{job="vllm"}'}).json()  # fmt: skip
        params = {"deployment_id": d["id"], "model": "llama-3.1-8b", "gpu_types": ["h100"],
                  "gpu_budget": 8, "slo_ttft_ms": 500, "slo_tpot_ms": 50, "window_s": 60,
                  "num_trials": 3}  # fmt: skip
        r = http.post("/v1/schedules", json={"interval_s": 60, "trigger": "drift",
                                             "params": params})  # fmt: skip
        assert r.status_code == 201, r.text
        engine = make_engine(f"sqlite:///{tmp_path / 'ui.db'}")
        t0 = datetime.now(UTC) + timedelta(seconds=60)
        try:
            for k, rate in enumerate((4.0, 4.0, 8.0)):
                fake.rate = rate
                fire_due_schedules(engine, now=t0 + timedelta(seconds=60 * k))
        finally:
            engine.dispose()
        schedule = http.get(f"/v1/schedules/{r.json()['id']}").json()
        assert schedule["num_fired"] == 1
        deadline = time.monotonic() + 30
        while (
            http.get(f"/v1/tuning-jobs/{schedule['last_job_id']}").json()["status"] != "succeeded"
        ):
            assert time.monotonic() < deadline, "the re-tune did not finish"
            time.sleep(0.2)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1400})
            page.goto(f"{base}/ui/deployments/{d['id']}")
            page.fill("#key-input", key)
            page.click("#key-entry button")
            page.wait_for_selector("body[data-done='1']", timeout=30_000)
            assert page.inner_text("#title") == f"Deployment {d['id']}: prod"
            assert page.locator("#plot-ttft circle.observed").count() == 3
            assert page.locator("#plot-ttft circle.predicted").count() == 3
            assert page.locator("#plot-itl circle.observed").count() == 3
            assert page.locator("#plot-rate circle").count() == 3
            assert "traffic drift beyond" in page.inner_text("#schedule")
            table = page.inner_text("#compare-table")
            assert "deployed" in table and f"job {schedule['last_job_id']}" in table
            assert "max_num_seqs" in table
            page.screenshot(path=str(tmp_path / "deployment.png"), full_page=True)
        finally:
            browser.close()
    assert (tmp_path / "deployment.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
