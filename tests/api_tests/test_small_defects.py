"""Small defects, one test each: cron expressions that never fire, stream windows over
overlapping uploads, admin keys' project scope, and the recommendation's trial number.

(The result page, which no longer polls: tests/api_tests/test_ui_job_page.py.)
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from api.services.stream_windows import drift, summarize
from optimizer.config import InstanceConfig, ServingConfig
from optimizer.latency.analytic import LinearLatency, MappingLatencySource
from optimizer.records import TraceFormat, TraceInfo
from optimizer.search import TuneProgress, TuneRequest
from optimizer.search.attainment import Attainment, Load
from optimizer.search.evaluation import EvalStage, EvalStatus, Evaluation
from optimizer.search.outcome import LatencyInfo, build_outcome
from optimizer.search.recommend import TrialOutcome, baseline_config, pareto_front
from optimizer.search.trace_evaluator import TraceEvaluator
from optimizer.workload import FixedLength, LognormalLength, synthetic_workload
from tests.api_tests.conftest import Service
from tests.factories import make_stats

# --- b. cron expressions that never fire, in our words -----------------------------------

SCHEDULE_PARAMS = {
    "stream": "prod",
    "window_s": 3600,
    "model": "llama-3.1-8b",
    "gpu_types": ["h100"],
    "gpu_budget": 8,
    "slo_ttft_ms": 2000,
    "slo_tpot_ms": 50,
}


def _schedule(service: Service, cron: str):
    return service.client.post(
        "/v1/schedules",
        headers=service.auth(service.key_a),
        json={"cron": cron, "params": SCHEDULE_PARAMS},
    )


@pytest.mark.parametrize("cron", ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4,6,9,11 *"])
def test_a_cron_that_never_fires_is_refused_by_field_and_value(service: Service, cron: str) -> None:
    r = _schedule(service, cron)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["detail"].startswith(f"cron {cron!r} never fires:")
    assert "February 31st" in body["detail"]
    assert body["errors"] == [{"where": "body.cron", "message": body["detail"]}]
    assert "failed to find next date" not in r.text


@pytest.mark.parametrize(
    "cron", ["60 * * * *", "* * * * 8", "0 0 30 2 L", "H * * * *", "* * * * */0"]
)
def test_malformed_crons_get_our_message_not_the_librarys(service: Service, cron: str) -> None:
    r = _schedule(service, cron)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith(f"cron {cron!r}: a field is malformed or out of range; expected ")
    assert "minute 0-59" in detail and r.json()["errors"][0]["where"] == "body.cron"
    for raw in ("not acceptable", "Hashed", "hash_id", 'out of range"', "step '0'"):
        assert raw not in r.text


@pytest.mark.parametrize("cron", ["0 0 31 * *", "0 0 L 2 *", "0 0 29 2 *"])
def test_crons_that_fire_rarely_are_still_accepted(service: Service, cron: str) -> None:
    assert _schedule(service, cron).status_code == 201


# --- c. stream windows over uploads that overlap in time ---------------------------------

T0 = datetime(2026, 3, 1, 13, 0, tzinfo=UTC)


def _upload(trace_id: int, *, num_requests: int, uploaded_at: datetime, span_s: float):
    stats = replace(make_stats(num_requests), duration_s=span_s, mean_rate=num_requests / span_s)
    return TraceInfo(
        id=trace_id,
        name=f"u{trace_id}",
        source_format=TraceFormat.SPLITWISE,
        content_hash=f"h{trace_id}",
        created_at=uploaded_at,
        stats=stats,
        project="a",
        stream="prod",
    )


def test_two_uploads_of_the_same_hour_share_its_3600_seconds() -> None:
    # Two replicas' logs of 12:00-13:00, both uploaded at 13:00: N=1800, M=900.
    n, m = 1800, 900
    a = _upload(1, num_requests=n, uploaded_at=T0, span_s=3600.0)
    b = _upload(2, num_requests=m, uploaded_at=T0, span_s=3600.0)
    both = summarize([a, b])
    assert both.num_requests == 2700 and both.mean_rate == pytest.approx(2700 / 3600)  # 0.75
    # The same hour as one upload of N + M requests: consistent, so no rate drift at all.
    one = summarize([_upload(3, num_requests=n + m, uploaded_at=T0, span_s=3600.0)])
    rate = next(c for c in drift(one, both) if c.figure == "mean_rate")
    assert rate.relative == 0.0
    assert max(c.relative for c in drift(one, both)) == 0.0


def test_window_rates_use_the_union_of_covered_time() -> None:
    hour = timedelta(hours=1)
    # Back to back (12-13 h, 13-14 h): 7200 s, as before.
    a = _upload(1, num_requests=1800, uploaded_at=T0, span_s=3600.0)
    b = _upload(2, num_requests=900, uploaded_at=T0 + hour, span_s=3600.0)
    assert summarize([b, a]).mean_rate == pytest.approx(2700 / 7200)
    # Half an hour of overlap (12:00-13:00 and 12:30-13:30): 5400 s.
    c = _upload(3, num_requests=900, uploaded_at=T0 + hour / 2, span_s=3600.0)
    assert summarize([a, c]).mean_rate == pytest.approx(2700 / 5400)
    # One upload inside another (12:15-12:45 within 12:00-13:00) adds no time; a gap
    # (14:00-15:00 after 12:00-13:00) is not covered time.
    inner = _upload(4, num_requests=100, uploaded_at=T0 - hour / 4, span_s=1800.0)
    later = _upload(5, num_requests=100, uploaded_at=T0 + 2 * hour, span_s=3600.0)
    assert summarize([a, inner]).mean_rate == pytest.approx(1900 / 3600)
    assert summarize([a, inner, later]).mean_rate == pytest.approx(2000 / 7200)


# --- d. an admin key manages its own project's keys only ---------------------------------


def _admin_of(service: Service, project: str) -> str:
    from storage.db import make_engine, session_scope
    from storage.keys import create_key

    engine = make_engine(service.url)
    with session_scope(engine) as s:
        _, token = create_key(s, project=project, is_admin=True)
    engine.dispose()
    return token


def test_an_admin_key_creates_keys_for_its_own_project(service: Service) -> None:
    ops = service.auth(service.admin)  # an admin key of project "ops"
    r = service.client.post("/v1/keys", json={"project": "ops", "name": "ci"}, headers=ops)
    assert r.status_code == 201, r.text
    assert r.json()["info"]["project"] == "ops"
    admin_a = service.auth(_admin_of(service, "a"))
    r = service.client.post("/v1/keys", json={"project": "a", "is_admin": True}, headers=admin_a)
    assert r.status_code == 201 and r.json()["info"]["project"] == "a"
    new_key = service.auth(r.json()["key"])
    assert service.client.get("/v1/traces", headers=new_key).status_code == 200
    listed = service.client.get("/v1/keys", headers=admin_a).json()  # default: own project
    assert {k["project"] for k in listed["items"]} == {"a"} and listed["total"] == 3


def test_an_admin_key_cannot_touch_another_projects_keys(service: Service) -> None:
    ops = service.auth(service.admin)
    r = service.client.post("/v1/keys", json={"project": "a", "is_admin": True}, headers=ops)
    assert r.status_code == 403, r.text
    detail = r.json()["detail"]
    assert detail.startswith("an admin key of project 'ops' manages that project's keys only")
    assert "cannot create keys for project 'a'" in detail
    assert "servetune keys create --project a" in detail
    r = service.client.get("/v1/keys?project=a", headers=ops)
    assert r.status_code == 403 and "cannot list the keys of project 'a'" in r.json()["detail"]
    # Key 1 is project a's (make_service_keys): another project's key id is not found.
    r = service.client.delete("/v1/keys/1", headers=ops)
    assert r.status_code == 404
    assert service.client.get("/v1/traces", headers=service.auth(service.key_a)).status_code == 200
    # A key without admin scope manages nothing.
    r = service.client.post("/v1/keys", json={"project": "a"}, headers=service.auth(service.key_a))
    assert r.status_code == 403 and "no admin scope" in r.json()["detail"]


# --- e. the recommendation names its trial; the front keeps the defaults' point ----------

SLOW = LinearLatency(base_s=0.007, per_token_s=2.7e-5, per_kv_token_s=4e-8)
FAST = LinearLatency(base_s=0.003, per_token_s=0.7e-5, per_kv_token_s=1e-8)
BY_TP = MappingLatencySource((("h100", 1, SLOW), ("h100", 2, FAST)))
TP2 = ServingConfig.colocated(
    "llama-3.1-8b", InstanceConfig(tp=2, max_num_batched_tokens=2048, max_num_seqs=256)
)


def _outcome(*, defaults_as_trial: bool):
    """At 5 req/s one TP1 replica of vLLM's defaults meets the SLOs: 1 GPU beats TP2's 2."""
    wl = synthetic_workload(
        400, 5.0, input_lengths=LognormalLength(1500, 0.8, max_tokens=8000),
        output_lengths=FixedLength(60), seed=1,
    )  # fmt: skip
    req = TuneRequest(
        trace_id=1, model="llama-3.1-8b", gpu_types=("h100",), gpu_budget=8,
        slo_ttft_ms=2000, slo_tpot_ms=20, screen_requests=200, search_space={"tp": [1, 2]},
    )  # fmt: skip
    ev = TraceEvaluator.for_trace(wl, BY_TP, req.eval_settings())
    trials = [TrialOutcome(5, TP2, ev.evaluate(TP2))]
    if defaults_as_trial:  # trial 3 screened exactly the defaults' unit
        base = baseline_config(req.space())
        trials.insert(0, TrialOutcome(3, base, ev.evaluate(base)))
    return build_outcome(
        req, req.space(), trials, ev, study_name="t", num_trials=len(trials),
        latency=LatencyInfo("by tp", True),
    )  # fmt: skip


def test_the_recommendation_names_the_trial_that_tried_its_config() -> None:
    out = _outcome(defaults_as_trial=True)
    rec = out.recommendation
    assert rec.predicted.num_gpus == 1 and rec.config == out.baseline.config
    assert rec.trial == 3
    # The front's point for it carries the same number (the page and plots mark it so).
    chosen = [p for p in out.pareto if p.trial == rec.trial]
    assert [p.config for p in chosen] == [rec.config]
    assert all(p.trial is not None for p in out.pareto)


def test_only_defaults_no_trial_tried_stay_trial_null_and_on_the_front() -> None:
    out = _outcome(defaults_as_trial=False)
    rec = out.recommendation
    assert rec.trial is None and rec.predicted.num_gpus == 1
    # Already so before: the recommended defaults' point is on the front, its cheapest.
    assert out.pareto[0].trial is None and out.pareto[0].config == rec.config


def _ev(gpus: int, tok_s: float) -> Evaluation:
    met = (Attainment(Load.SIZING, 10.0, 0.95, 0.96, 0.99),)
    return Evaluation(EvalStatus.FEASIBLE, EvalStage.VERIFIED, gpus, num_units=gpus,
                      unit_gpus=1, interactivity_tok_s=tok_s, attainments=met)  # fmt: skip


def test_defaults_that_beat_the_fronts_top_point_are_on_the_front() -> None:
    def unit(seqs: int) -> ServingConfig:
        return ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_seqs=seqs))

    defaults = TrialOutcome(None, unit(1024), _ev(1, 100.0))
    rows = [
        defaults,
        TrialOutcome(1, unit(64), _ev(2, 90.0)),
        TrialOutcome(2, unit(32), _ev(1, 80.0)),
    ]
    assert [r.trial for r in pareto_front(rows, keep=defaults)] == [None]
    assert [r.trial for r in pareto_front(rows)] == [None]


# --- e'. tuning progress has no always-empty completed_trials ----------------------------


def test_progress_reports_trial_counts_and_no_completed_trials(service: Service, tmp_path) -> None:
    from tests.api_tests.conftest import write_trace_csv

    assert "completed_trials" not in TuneProgress.__dataclass_fields__
    h = service.auth(service.key_a)
    with write_trace_csv(tmp_path / "t.csv").open("rb") as fh:
        tid = service.client.post("/v1/traces", headers=h, files={"file": fh}).json()["id"]
    params = {**SCHEDULE_PARAMS, "stream": None, "trace_id": tid, "num_trials": 4}
    jid = service.client.post("/v1/tuning-jobs", headers=h, json=params).json()["id"]
    assert service.worker().run_once()
    progress = service.client.get(f"/v1/tuning-jobs/{jid}", headers=h).json()["progress"]
    assert progress["trials_done"] == 4 and progress["trials_total"] == 4
    assert "completed_trials" not in progress
