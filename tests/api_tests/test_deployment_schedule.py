"""A schedule over a deployment: each due time observes the deployment's window, the
first sets the baseline, and a doubled request rate re-tunes exactly once (the next
windows of the same doubled traffic compare with the window that re-tuned).

Prometheus is replaced here by pages rendered at a chosen rate (`read_prometheus` is the
one function swapped); tests/api_tests/test_observe_prometheus.py and the loop benchmark
read a real Prometheus server.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
import yaml

from api.services.observe import read_scrape
from api.worker.scheduling import fire_due_schedules
from optimizer.telemetry.synthetic import VllmTraffic, render_vllm_page
from storage.db import make_engine, session_scope
from storage.deployments import list_observations
from storage.jobs import list_jobs
from storage.schedules import get_schedule
from tests.api_tests.conftest import Service

REPO = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((REPO / "examples" / "colocated-h100.yaml").read_text())
WINDOW_S = 60.0


class FakePrometheus:
    """`read_prometheus` answering a window of `rate` req/s (prompt lengths x `scale`,
    observed TTFT x `ttft_scale`)."""

    def __init__(self) -> None:
        self.rate, self.scale, self.ttft_scale, self.calls = 4.0, 1.0, 1.0, 0

    def __call__(self, url, selector, window_s, end, *, model_name=None):
        self.calls += 1
        n = int(self.rate * window_s)
        t = VllmTraffic.random(n, self.calls)
        t = VllmTraffic(t.ttft_s * self.ttft_scale, t.e2e_s, t.queue_s,
                        np.maximum((t.prompt_tokens * self.scale).astype(int), 1),
                        t.output_tokens, t.itl_gaps_s, t.itl_gap_weights, 0)  # fmt: skip
        empty = VllmTraffic.random(0, 0)
        return (read_scrape(render_vllm_page(empty), "BEFORE", "b"),
                read_scrape(render_vllm_page(t), "AFTER", "a"))  # fmt: skip


@pytest.fixture
def prometheus(monkeypatch: pytest.MonkeyPatch) -> FakePrometheus:
    fake = FakePrometheus()
    monkeypatch.setattr("api.worker.deployment_drift.read_prometheus", fake)
    return fake


def _create(service: Service, config: dict = CONFIG, **extra) -> tuple[int, int]:
    h = service.auth(service.key_a)
    d = service.client.post("/v1/deployments", headers=h, json={
        "name": "prod", "config": config, "prometheus_url": "http://prometheus:9090",
        "label_selector": '{job="vllm"}'})  # fmt: skip
    assert d.status_code == 201, d.text
    params = {"deployment_id": d.json()["id"], "model": "llama-3.1-8b", "gpu_types": ["h100"],
              "gpu_budget": 8, "slo_ttft_ms": 500, "slo_tpot_ms": 50, "window_s": WINDOW_S,
              "num_trials": 4}  # fmt: skip
    body = {"interval_s": WINDOW_S, "trigger": "drift", "drift_threshold": 0.3,
            "params": params, **extra}  # fmt: skip
    r = service.client.post("/v1/schedules", headers=h, json=body)
    assert r.status_code == 201, r.text
    return d.json()["id"], r.json()["id"]


def test_doubled_rate_retunes_exactly_once(service: Service, prometheus: FakePrometheus) -> None:
    deployment, sid = _create(service)
    engine = make_engine(service.url)
    t0 = datetime.now(UTC) + timedelta(seconds=WINDOW_S)

    def tick(k: int) -> int:
        return fire_due_schedules(engine, now=t0 + timedelta(seconds=WINDOW_S * k))

    try:
        assert tick(0) == 0  # the first window is the baseline
        with session_scope(engine) as s:
            first = get_schedule(s, sid)
        assert first.last_reason.startswith("baseline set: observation")
        assert first.baseline_observation_id is not None
        assert tick(1) == 0  # the same traffic: no drift
        prometheus.rate = 8.0
        assert tick(2) == 1  # doubled
        with session_scope(engine) as s:
            fired = get_schedule(s, sid)
            jobs = list_jobs(s, project="a")
        assert len(jobs) == 1 and fired.num_fired == 1
        assert "traffic drift beyond 30%" in fired.last_reason
        assert "mean_rate +100%" in fired.last_reason, fired.last_reason
        assert jobs[0].trigger_reason == fired.last_reason
        # the re-tune is priced with a calibration fitted on the window that caused it
        from storage.deployment_calibrations import latest_calibration

        with session_scope(engine) as s:
            cal = latest_calibration(s, deployment)
        assert cal is not None and cal.fitted_on == fired.baseline_observation_id
        assert f"recalibrated on it (deployment calibration {cal.id}" in fired.last_reason
        assert jobs[0].params.deployment_id == deployment
        assert len(jobs[0].window.trace_ids) == 1
        assert jobs[0].window.mean_rate == pytest.approx(8.0, rel=0.05)
        assert service.worker().run_once()  # the fake tuner finishes it
        assert tick(3) == 0 and tick(4) == 0  # the doubled traffic again: no second re-tune
        with session_scope(engine) as s:
            after = get_schedule(s, sid)
            observations = list_observations(s, deployment, limit=100)
        assert after.num_fired == 1 and after.last_reason.startswith("no drift")
        assert after.baseline_observation_id == fired.baseline_observation_id
        assert len(observations) == 5  # one per due time, each stored
        prometheus.rate, prometheus.scale = 8.0, 3.0  # a second drift: longer prompts
        assert tick(5) == 1
        with session_scope(engine) as s:
            assert "input_mean +" in get_schedule(s, sid).last_reason
    finally:
        engine.dispose()


def test_an_unreachable_window_skips_with_the_reason(
    service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.services.prometheus import PrometheusError

    def down(*args, **kwargs):
        raise PrometheusError("Prometheus at http://prometheus:9090 is unreachable")

    monkeypatch.setattr("api.worker.deployment_drift.read_prometheus", down)
    _, sid = _create(service)
    engine = make_engine(service.url)
    try:
        later = datetime.now(UTC) + timedelta(seconds=2 * WINDOW_S)
        assert fire_due_schedules(engine, now=later) == 0
        with session_scope(engine) as s:
            info = get_schedule(s, sid)
        assert info.last_decision == "skipped" and "unreachable" in info.last_reason
        assert info.next_run_at > later  # the due time was taken, once
    finally:
        engine.dispose()


def test_deployment_schedule_refusals(service: Service) -> None:
    h = service.auth(service.key_a)
    d = service.client.post("/v1/deployments", headers=h, json={"name": "p", "config": CONFIG})
    params = {"deployment_id": d.json()["id"], "model": "llama-3.1-8b", "gpu_types": ["h100"],
              "gpu_budget": 8, "slo_ttft_ms": 500, "slo_tpot_ms": 50}  # fmt: skip

    def create(body: dict):
        return service.client.post("/v1/schedules", headers=h, json={"interval_s": 60, **body})

    r = create({"trigger": "drift", "params": params})
    assert r.status_code == 422 and "has no Prometheus URL" in r.json()["detail"]
    r = create({"trigger": "drift", "params": {**params, "deployment_id": 999}})
    assert r.status_code == 422 and "deployment 999 not found" in r.json()["detail"]
    r = create({"params": {**params, "stream": "s"}, "error_threshold": 0.2})
    assert r.status_code == 422 and "only a schedule over a deployment" in r.json()["detail"]


def test_a_prediction_error_that_passes_the_threshold_retunes_once(
    service: Service, prometheus: FakePrometheus
) -> None:
    """The same traffic, but the server's TTFT falls 100-fold (say a faster engine
    release): the p90 TTFT prediction error passes 500% where the baseline's did not, so
    it re-tunes once; the next window has the same error, measured against the window
    that re-tuned, and does not."""
    _, sid = _create(service, error_threshold=5.0)
    engine = make_engine(service.url)
    t0 = datetime.now(UTC) + timedelta(seconds=WINDOW_S)

    def tick(k: int) -> int:
        return fire_due_schedules(engine, now=t0 + timedelta(seconds=WINDOW_S * k))

    try:
        assert tick(0) == 0 and tick(1) == 0
        prometheus.ttft_scale = 0.01
        assert tick(2) == 1
        with session_scope(engine) as s:
            fired = get_schedule(s, sid)
        assert "p90 prediction error" in fired.last_reason and "passed 500%" in fired.last_reason
        assert "traffic drift" not in fired.last_reason
        assert service.worker().run_once()
        assert tick(3) == 0
        with session_scope(engine) as s:
            assert get_schedule(s, sid).num_fired == 1
    finally:
        engine.dispose()


def test_a_drift_schedule_with_a_plan_queues_a_plan_job(
    service: Service, prometheus: FakePrometheus
) -> None:
    """The same drift fires a plan job instead of a re-tune: the schedule's plan pinned to
    the window's trace, sizing the deployed unit; a worker makes and stores the plan."""
    from api.worker import Worker, WorkerOptions, default_executors
    from optimizer.plan import FleetPlan, PlanRequest
    from storage.plans import plan_text_of_job
    from storage.service_records import JobKind, JobStatus

    plan = {"model": "llama-3.1-8b", "gpu": "h100", "gpu_budget": 8, "slo_ttft_ms": 500,
            "slo_tpot_ms": 50, "window_s": 20, "cold_start_s": 5,
            "price_per_gpu_hour": 3.0}  # fmt: skip
    h = service.auth(service.key_a)
    bad = service.client.post("/v1/schedules", headers=h, json={
        "interval_s": WINDOW_S, "trigger": "drift", "plan": {**plan, "gpu": "a100"},
        "params": {"deployment_id": 1, "model": "llama-3.1-8b", "gpu_types": ["h100"],
                   "gpu_budget": 8, "slo_ttft_ms": 500, "slo_tpot_ms": 50}})  # fmt: skip
    assert bad.status_code == 422 and bad.json()["errors"][0]["where"] == "body.plan.gpu"
    _, sid = _create(service, {**CONFIG, "num_replicas": 3}, plan=plan)
    engine = make_engine(service.url)
    t0 = datetime.now(UTC) + timedelta(seconds=WINDOW_S)
    try:
        assert fire_due_schedules(engine, now=t0) == 0  # the baseline
        prometheus.rate = 8.0
        assert fire_due_schedules(engine, now=t0 + timedelta(seconds=WINDOW_S)) == 1
        with session_scope(engine) as s:
            fired = get_schedule(s, sid)
            jobs = list_jobs(s, project="a")
        assert [j.kind for j in jobs] == [JobKind.PLAN] and fired.num_fired == 1
        assert "re-planning on observation" in fired.last_reason
        job = jobs[0]
        assert isinstance(job.params, PlanRequest) and job.trigger_reason == fired.last_reason
        assert job.params.trace_id == job.window.trace_ids[0]
        assert (job.params.window_s, job.params.cold_start_s) == (20, 5)
        assert job.params.price_per_gpu_hour == 3.0
        # no unit in the schedule's plan: one replica of the deployed 3
        assert fired.plan.unit is None and job.params.unit.num_replicas == 1
        deployed = CONFIG["replica"]
        assert job.params.unit.replica.max_num_batched_tokens == deployed["max_num_batched_tokens"]
        assert job.params.unit.replica.max_num_seqs == deployed["max_num_seqs"]
        worker = Worker(engine, storage_url=service.url, executors=default_executors(),
                        options=WorkerOptions(lease_s=30, poll_s=0.5))  # fmt: skip
        assert worker.run_once()
        with session_scope(engine) as s:
            done = list_jobs(s, project="a")[0]
            stored = plan_text_of_job(s, job.id, project="a")
        assert done.status is JobStatus.SUCCEEDED, done.error
        assert stored is not None
        made = FleetPlan.from_dict(json.loads(stored.outcome))
        assert made.request == job.params and made.unit.source.value == "given"
    finally:
        engine.dispose()
