"""/ui/jobs/{id} rendered on the server: the summary is in the HTML itself (no
JavaScript), behind the JSON API's keys and project isolation, with a key from the
`Authorization` header or from the cookie the key form sets.

(The same page in a real browser with JavaScript disabled: test_ui_browser.py.)
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import replace
from datetime import UTC, datetime
from html import escape, unescape
from pathlib import Path

import pytest
import sqlalchemy as sa

from api.cli.common import console
from api.cli.tune import print_outcome
from api.ui import render
from optimizer.search import TuneProgress, TuneRequest
from storage.db import make_engine, session_scope
from storage.jobs import claim_job, finish_job, report_progress
from storage.models.service import JobRow
from storage.service_records import JobInfo, JobKind, JobStatus
from tests.api_tests.conftest import Service, write_trace_csv
from tests.api_tests.fakes import fake_outcome

PARAMS = {
    "model": "llama-3.1-8b",
    "gpu_types": ["h100"],
    "gpu_budget": 8,
    "slo_ttft_ms": 2000,
    "slo_tpot_ms": 50,
    "num_trials": 4,
}


def _job(svc: Service, tmp_path: Path, *, run: bool = True) -> int:
    trace = write_trace_csv(tmp_path / "t.csv")
    auth = svc.auth(svc.key_a)
    tid = svc.client.post("/v1/traces", headers=auth, files={"file": trace.open("rb")}).json()
    r = svc.client.post("/v1/tuning-jobs", headers=auth, json={"trace_id": tid["id"], **PARAMS})
    assert r.status_code == 202, r.text
    if run:
        assert svc.worker().run_once() is True
    return r.json()["id"]


def _element(page: str, ident: str) -> str:
    """The text of the element with id `ident` (no nested elements of the same tag)."""
    m = re.search(rf'<(\w+) id="{ident}"[^>]*>(.*?)</\1>', page, re.S)
    assert m, f"no #{ident} in the page"
    return m.group(2)


def _outcome(svc: Service, job_id: int) -> dict:
    r = svc.client.get(f"/v1/tuning-jobs/{job_id}/result", headers=svc.auth(svc.key_a))
    return r.json()["outcome"]


def test_the_summary_is_in_the_html_itself(service: Service, tmp_path: Path) -> None:
    jid = _job(service, tmp_path)
    r = service.client.get(f"/ui/jobs/{jid}", headers=service.auth(service.key_a))
    assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
    assert r.headers["cache-control"] == "no-store"
    page = r.text
    outcome = _outcome(service, jid)
    verdict = outcome["verdict"]
    assert unescape(_element(page, "headline")) == verdict["headline"]
    assert unescape(_element(page, "baseline-sentence")) == verdict["baseline"]
    # The SLO checks, each against its SLO, and every attainment with its traffic.
    checks = _element(page, "slo-checks")
    assert "<td>ttft_p90_ms</td><td>at the trace&#x27;s own rate</td><td>850.0</td>" in checks
    assert "<td>2000</td>" in checks and "<td>tpot_p90_ms</td>" in checks
    assert "ok</b>" in checks and "over</b>" not in checks
    figures = _element(page, "figures")
    assert "95.0% at 7.50 req/s (its busiest 60 s, the sizing rate)" in figures
    assert "98.0% at 5.00 req/s (the trace&#x27;s own rate)" in figures
    # The launch commands as the API has them, and the plot as inline SVG.
    for command in outcome["recommendation"]["launch"]:
        assert f'<pre class="command">{escape(command["command"])}</pre>' in page
    svg = _element(page, "pareto")
    assert svg.startswith("<svg ") and svg.count("<circle ") == len(outcome["pareto"]) == 4
    assert svg.count("point recommended") == 1 and '<rect class="point baseline"' in svg
    assert "Decode-bound" in _element(page, "diagnosis")
    assert 'http-equiv="refresh"' not in page  # finished: nothing to wait for
    # No data is fetched by script: the page's one script only adds copy buttons.
    assert "fetch(" not in page and "localStorage" not in page and "<script src" not in page


def test_the_page_agrees_with_the_cli_word_for_word(wide_console: None) -> None:
    """The page's headline and baseline sentence are the lines `servetune tune` prints."""
    request = TuneRequest(trace_id=1, **PARAMS)
    outcome = fake_outcome(request, 4)
    job = JobInfo(7, "a", JobKind.TUNING, JobStatus.SUCCEEDED, request, datetime.now(UTC))
    page = render.job_page(job, render.StoredResult(outcome, ""))
    with console.capture() as captured:
        print_outcome(outcome)
    lines = [line.strip() for line in captured.get().splitlines()]
    headline = unescape(_element(page, "headline"))
    assert headline.startswith("Recommendation (trial 0): 2 GPUs") and headline in lines
    assert unescape(_element(page, "baseline-sentence")) in lines
    assert unescape(_element(page, "evaluated")) in lines


def test_every_text_is_escaped() -> None:
    request = TuneRequest(trace_id=1, **PARAMS)
    outcome = fake_outcome(request, 2)
    hostile = "<script>alert(1)</script> & <img src=x onerror=alert(2)>"
    outcome = replace(outcome, verdict=replace(outcome.verdict, headline=hostile))
    outcome = replace(outcome, diagnosis=replace(outcome.diagnosis, account=(hostile,)))
    now = datetime.now(UTC)
    job = JobInfo(7, "a", JobKind.TUNING, JobStatus.FAILED, request, now, error=hostile)
    page = render.job_page(job, render.StoredResult(outcome, ""))
    assert "<script>alert" not in page and "<img" not in page
    assert page.count(escape(hostile)) == 3


def test_without_a_key_a_401_with_the_key_form(service: Service, tmp_path: Path) -> None:
    jid = _job(service, tmp_path)
    headline = _outcome(service, jid)["verdict"]["headline"]
    for headers in ({}, service.auth("st_not-a-key"), {"Authorization": "Basic eDp5"}):
        r = service.client.get(f"/ui/jobs/{jid}", headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == 'Bearer realm="servetune"'
        assert '<form id="key-entry" method="post" action="/ui/key">' in r.text
        assert f'name="next" value="/ui/jobs/{jid}"' in r.text
        assert escape(headline) not in r.text and "<svg" not in r.text
    r = service.client.get(f"/ui/jobs/{jid}", headers=service.auth("st_not-a-key"))
    assert "unknown or revoked API key" in r.text
    # The JSON link answers as the page does.
    assert service.client.get(f"/ui/jobs/{jid}/result.json").status_code == 401


def test_another_projects_job_is_a_404(service: Service, tmp_path: Path) -> None:
    jid = _job(service, tmp_path)
    headline = _outcome(service, jid)["verdict"]["headline"]
    for url in (f"/ui/jobs/{jid}", f"/ui/jobs/{jid}/result.json", "/ui/jobs/999999"):
        r = service.client.get(url, headers=service.auth(service.key_b))
        api = service.client.get(f"/v1/tuning-jobs/{jid}", headers=service.auth(service.key_b))
        assert r.status_code == api.status_code == 404, url
        assert escape(headline) not in r.text and 'http-equiv="refresh"' not in r.text
    page = service.client.get(f"/ui/jobs/{jid}", headers=service.auth(service.key_b)).text
    assert f"Tuning job {jid} not found" in page and "another project" in page


def _set_cookie(response) -> str:
    return response.headers.get("set-cookie", "")


def test_the_key_form_keeps_the_key_in_an_httponly_cookie(service: Service, tmp_path: Path) -> None:
    jid = _job(service, tmp_path)
    client, page = service.client, f"/ui/jobs/{jid}"
    headline = escape(_outcome(service, jid)["verdict"]["headline"])
    # A wrong key: refused with the form and why; nothing kept.
    bad = client.post("/ui/key", data={"key": "st_wrong", "next": page}, follow_redirects=False)
    assert bad.status_code == 401 and "unknown or revoked API key" in bad.text
    assert 'id="key-entry"' in bad.text and _set_cookie(bad) == ""
    empty = client.post("/ui/key", data={"key": " ", "next": page}, follow_redirects=False)
    assert empty.status_code == 401 and _set_cookie(empty) == ""
    # The right key: kept in a cookie the page's scripts cannot read, sent to /ui only.
    ok = client.post("/ui/key", data={"key": service.key_a, "next": page}, follow_redirects=False)
    assert ok.status_code == 303 and ok.headers["location"] == page
    cookie = _set_cookie(ok)
    assert cookie.startswith(f"servetune_key={service.key_a};")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
    assert service.key_a not in ok.headers["location"]
    r = client.get(page)  # the cookie alone
    assert r.status_code == 200 and headline in r.text
    result = client.get(f"{page}/result.json")
    assert result.status_code == 200 and result.json()["outcome"]["verdict"]["headline"]
    # The JSON API takes the Bearer header only, never the cookie.
    api = client.get(f"/v1/tuning-jobs/{jid}", headers={"Cookie": f"servetune_key={service.key_a}"})
    assert api.status_code == 401
    # Forget: the cookie is cleared and the page asks again.
    gone = client.post("/ui/key/forget", data={"next": page}, follow_redirects=False)
    assert gone.status_code == 303 and gone.headers["location"] == page
    assert "servetune_key=" in _set_cookie(gone) and "Max-Age=0" in _set_cookie(gone)
    again = client.get(page)
    assert again.status_code == 401 and 'id="key-entry"' in again.text


def test_a_refused_cookie_is_dropped(service: Service, tmp_path: Path) -> None:
    jid = _job(service, tmp_path)
    r = service.client.get(f"/ui/jobs/{jid}", headers={"Cookie": "servetune_key=st_revoked"})
    assert r.status_code == 401 and "unknown or revoked API key" in r.text
    assert "servetune_key=" in _set_cookie(r) and "Max-Age=0" in _set_cookie(r)


@pytest.mark.parametrize(
    "headers", [{"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}]
)
def test_a_key_form_posted_from_another_site_is_refused(
    service: Service, headers: dict[str, str]
) -> None:
    for url in ("/ui/key", "/ui/key/forget"):
        form = {"key": service.key_a, "next": "/ui/jobs/1"}
        r = service.client.post(url, data=form, headers=headers, follow_redirects=False)
        assert r.status_code == 403 and "another site" in r.text and _set_cookie(r) == ""
    same = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
    form = {"key": service.key_a, "next": "/ui/jobs/1"}
    r = service.client.post("/ui/key", data=form, headers=same, follow_redirects=False)
    assert r.status_code == 303


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/ui/jobs/1", ""])
def test_the_form_sends_the_browser_back_to_job_pages_only(service: Service, target: str) -> None:
    r = service.client.post(
        "/ui/key", data={"key": service.key_a, "next": target}, follow_redirects=False
    )
    assert r.status_code == 200 and "location" not in r.headers
    assert "project a" in r.text and "servetune_key=" in _set_cookie(r)


def test_an_older_result_says_so_and_links_its_json(service: Service, tmp_path: Path) -> None:
    jid = _job(service, tmp_path)
    old = {"schema_version": 3, "recommendation": None, "pareto": []}
    engine = make_engine(service.url)
    try:
        with session_scope(engine) as s:
            s.execute(sa.update(JobRow).where(JobRow.id == jid).values(result=old))
    finally:
        engine.dispose()
    r = service.client.get(f"/ui/jobs/{jid}", headers=service.auth(service.key_a))
    assert r.status_code == 200
    note = unescape(_element(r.text, "old-result"))
    assert "written by an older servetune" in note and "schema_version 3" in note
    assert f'href="/ui/jobs/{jid}/result.json"' in r.text
    assert 'class="status succeeded">succeeded<' in r.text and "<svg" not in r.text
    stored = service.client.get(f"/ui/jobs/{jid}/result.json", headers=service.auth(service.key_a))
    assert stored.json() == {"job_id": jid, "outcome": old}


def _progress(svc: Service, progress: TuneProgress, *, error: str | None = None) -> None:
    """Claim the queued job and report `progress`; then fail it with `error` if given."""
    engine = make_engine(svc.url)
    try:
        with session_scope(engine) as s:
            claim = claim_job(s, worker="w", lease_s=60)
            assert claim is not None and report_progress(s, claim, progress)
            if error is not None:
                assert finish_job(s, claim, status=JobStatus.FAILED, error=error)
    finally:
        engine.dispose()


def test_a_running_job_shows_its_progress_and_reloads(service: Service, tmp_path: Path) -> None:
    jid = _job(service, tmp_path, run=False)
    queued = service.client.get(f"/ui/jobs/{jid}", headers=service.auth(service.key_a)).text
    assert 'class="status queued">queued<' in queued and "trials 0 / 4" in queued
    assert '<meta http-equiv="refresh" content="5">' in queued
    _progress(service, TuneProgress(3, 4, 2.0, 12.0, screened_fewest_gpus=4))
    page = service.client.get(f"/ui/jobs/{jid}", headers=service.auth(service.key_a)).text
    assert 'class="status running">running<' in page and "trials 3 / 4" in page
    detail = _element(page, "progress-detail")
    assert "fewest GPUs so far: ~4, a screen&#x27;s estimate" in detail and "ETA 12 s" in detail
    assert '<meta http-equiv="refresh" content="5">' in page and "<svg" not in page


def test_a_finished_jobs_progress_names_the_verified_answer_and_its_error(
    service: Service, tmp_path: Path
) -> None:
    jid = _job(service, tmp_path, run=False)
    done = TuneProgress(4, 4, 2.0, None, screened_fewest_gpus=4, stage="done", recommended_gpus=2)
    _progress(service, done, error="boom: <no space left>")
    page = service.client.get(f"/ui/jobs/{jid}", headers=service.auth(service.key_a)).text
    assert 'class="status failed">failed<' in page
    assert _element(page, "progress-detail") == "verified recommendation: 2 GPUs"
    assert _element(page, "error") == "boom: &lt;no space left&gt;"
    assert 'http-equiv="refresh"' not in page and 'id="headline"' not in page


def test_the_page_runs_only_its_own_script(service: Service, tmp_path: Path) -> None:
    """The CSP names the hash of the one script the page carries, and nothing else."""
    jid = _job(service, tmp_path)
    r = service.client.get(f"/ui/jobs/{jid}", headers=service.auth(service.key_a))
    scripts = re.findall(r"<script>(.*?)</script>", r.text, re.S)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    csp = r.headers["content-security-policy"]
    assert f"script-src 'sha256-{digest}';" in csp and "frame-ancestors 'none'" in csp
    assert json.dumps(csp).count("unsafe-inline") == 1  # styles only
