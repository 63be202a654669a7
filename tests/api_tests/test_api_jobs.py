"""/v1/tuning-jobs and /v1/recommendations with the fake executor, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from api.worker import Worker, WorkerOptions, default_executors
from storage.db import make_engine
from tests.api_tests.conftest import Service, write_trace_csv

PARAMS = {
    "model": "llama-3.1-8b",
    "gpu_types": ["h100"],
    "gpu_budget": 8,
    "slo_ttft_ms": 2000,
    "slo_tpot_ms": 50,
}


def _trace(svc: Service, tmp_path: Path, key: str | None = None, **fields) -> int:
    path = write_trace_csv(tmp_path / f"t{time.monotonic_ns()}.csv")
    with path.open("rb") as fh:
        r = svc.client.post(
            "/v1/traces", headers=svc.auth(key or svc.key_a), files={"file": fh}, data=fields
        )
    assert r.status_code in (200, 201), r.text
    return r.json()["id"]


def _create(svc: Service, key: str | None = None, **params):
    return svc.client.post(
        "/v1/tuning-jobs", headers=svc.auth(key or svc.key_a), json={**PARAMS, **params}
    )


def _real_worker(svc: Service) -> Worker:
    """A worker with the default executors: the real search, not the fake one."""
    return Worker(
        make_engine(svc.url),
        storage_url=svc.url,
        executors=default_executors(),
        options=WorkerOptions(lease_s=30, poll_s=0.5),
    )


def _wait(svc: Service, job_id: int, done, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = svc.client.get(f"/v1/tuning-jobs/{job_id}", headers=svc.auth(svc.key_a)).json()
        if done(job) or time.monotonic() > deadline:
            return job
        time.sleep(0.1)


def test_job_flow_progress_result_recommendation(service: Service, tmp_path: Path) -> None:
    tid = _trace(service, tmp_path)
    r = _create(service, trace_id=tid, num_trials=4)
    assert r.status_code == 202, r.text
    created = r.json()
    jid = created["id"]
    assert created["status"] == "queued" and created["ui_url"] == f"/ui/jobs/{jid}"
    pending = service.client.get(
        f"/v1/tuning-jobs/{jid}/result", headers=service.auth(service.key_a)
    )
    assert pending.status_code == 409 and "status queued" in pending.json()["detail"]

    assert service.worker().run_once() is True
    job = service.client.get(f"/v1/tuning-jobs/{jid}", headers=service.auth(service.key_a)).json()
    assert job["status"] == "succeeded" and job["attempts"] == 1
    assert job["progress"]["trials_done"] == 4 and job["progress"]["trials_total"] == 4
    assert job["window"]["trace_ids"] == [tid]
    result = service.client.get(
        f"/v1/tuning-jobs/{jid}/result", headers=service.auth(service.key_a)
    )
    outcome = result.json()["outcome"]
    assert outcome["schema_version"] == 5 and outcome["request"]["trace_id"] == tid
    assert " vllm serve " in outcome["recommendation"]["launch"][0]["command"]
    assert outcome["recommendation"]["predicted"]["ttft_p90_ms"] == 850.0
    assert outcome["baseline"]["gain"] == 1.6 and len(outcome["pareto"]) == 4

    rec = service.client.get(
        f"/v1/recommendations/latest?trace_id={tid}&model=llama-3.1-8b&gpu=h100",
        headers=service.auth(service.key_a),
    )
    assert rec.status_code == 200 and rec.json()["job_id"] == jid
    # The request's budget and target are named so, apart from the fleet's own figures.
    latest = rec.json()
    assert latest["gpu_budget"] == 8 and latest["attainment_target"] == 0.9
    assert "num_gpus" not in latest and "attainment" not in latest
    assert latest["recommendation"]["predicted"]["num_gpus"] == 2
    for query, code in (("gpu_budget=8", 200), ("num_gpus=8", 200), ("gpu_budget=4", 404),
                        ("gpu_budget=8&num_gpus=4", 422)):  # fmt: skip
        got = service.client.get(
            f"/v1/recommendations/latest?{query}", headers=service.auth(service.key_a)
        )
        assert got.status_code == code, (query, got.text)
    other = service.client.get("/v1/recommendations/latest", headers=service.auth(service.key_b))
    assert other.status_code == 404
    listing = service.client.get(
        "/v1/tuning-jobs?status=succeeded", headers=service.auth(service.key_a)
    )
    assert listing.json()["total"] == 1
    for url in (f"/v1/tuning-jobs/{jid}", f"/v1/tuning-jobs/{jid}/result"):
        assert service.client.get(url, headers=service.auth(service.key_b)).status_code == 404
    cancel_other = service.client.post(
        f"/v1/tuning-jobs/{jid}/cancel", headers=service.auth(service.key_b)
    )
    assert cancel_other.status_code == 404


def test_invalid_job_requests(service: Service, tmp_path: Path) -> None:
    r = _create(service)  # neither trace_id nor stream
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    assert "exactly one of trace_id" in r.json()["detail"]
    r = _create(service, trace_id=1, slo_ttft_ms=-5)
    assert "slo_ttft_ms: expected a positive finite number" in r.json()["detail"]
    other = _trace(service, tmp_path, key=service.key_b)
    r = _create(service, trace_id=other)  # project b's trace
    assert r.status_code == 404 and r.json()["detail"] == f"trace {other} not found"
    r = _create(service, stream="empty")
    assert r.status_code == 422 and "no uploads in the last 3600 s" in r.json()["detail"]


def test_cancel_queued_and_running(service: Service, tmp_path: Path) -> None:
    tid = _trace(service, tmp_path)
    queued = _create(service, trace_id=tid).json()["id"]
    r = service.client.post(f"/v1/tuning-jobs/{queued}/cancel", headers=service.auth(service.key_a))
    assert r.status_code == 202 and r.json()["status"] == "cancelled"

    running = _create(service, trace_id=tid, num_trials=10_000).json()["id"]
    worker = service.worker(delay_s=0.01, poll_s=0.1, lease_s=5.0)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        started = _wait(service, running, lambda j: (j["progress"] or {}).get("trials_done", 0) > 2)
        assert started["status"] == "running"
        service.client.post(
            f"/v1/tuning-jobs/{running}/cancel", headers=service.auth(service.key_a)
        )
        job = _wait(service, running, lambda j: j["status"] != "running")
    finally:
        stop.set()
        thread.join()
    assert job["status"] == "cancelled" and job["error"] == "cancelled while running"
    assert job["progress"]["trials_done"] < 10_000


def test_real_tuner_runs_a_small_job(service: Service, tmp_path: Path) -> None:
    """The default executor is issue 5's search: a 3-trial job on a 50-request trace."""
    jid = _create(service, trace_id=_trace(service, tmp_path), num_trials=3).json()["id"]
    assert _real_worker(service).run_once()
    h = service.auth(service.key_a)
    job = service.client.get(f"/v1/tuning-jobs/{jid}", headers=h).json()
    assert job["status"] == "succeeded", job["error"]
    assert job["progress"]["trials_done"] == 3 and job["progress"]["trials_total"] == 3
    outcome = service.client.get(f"/v1/tuning-jobs/{jid}/result", headers=h).json()["outcome"]
    assert outcome["pareto"] and outcome["baseline"]["description"]
    assert outcome["latency"]["label"].startswith("roofline") and outcome["diagnosis"]["account"]
    if outcome["recommendation"] is not None:
        commands = [c["command"] for c in outcome["recommendation"]["launch"]]
        assert any(" vllm serve " in c for c in commands)


def test_a_closed_loop_benchmark_is_tuned_without_a_trace(service: Service) -> None:
    """`workload`: vllm bench serve parameters with a binding max_concurrency; the job
    runs the real search on it and the outcome says it sized for the clients."""
    bench = {"random_input_len": 512, "random_output_len": 32, "num_prompts": 40,
             "max_concurrency": 8}  # fmt: skip
    r = _create(service, workload=bench, num_trials=2, search_space={"tp": [1]})
    assert r.status_code == 202, r.text
    jid = r.json()["id"]
    assert _real_worker(service).run_once()
    h = service.auth(service.key_a)
    job = service.client.get(f"/v1/tuning-jobs/{jid}", headers=h).json()
    assert job["status"] == "succeeded", job["error"]
    assert job["window"] is None and job["params"]["workload"] == bench
    outcome = service.client.get(f"/v1/tuning-jobs/{jid}/result", headers=h).json()["outcome"]
    assert outcome["evaluated"]["clients"] == 8 and outcome["pareto"]
    # 512-token prompts, many to a step: the replay's figures, no out-of-step range.
    assert "out_of_step" not in outcome["recommendation"]
    # An open loop is a trace: refused, saying so.
    r = _create(service, workload={"num_prompts": 40, "request_rate": 2})
    assert r.status_code == 422 and "open loop" in r.json()["detail"]


def test_unknown_model_is_rejected_at_creation(service: Service, tmp_path: Path) -> None:
    r = _create(service, trace_id=_trace(service, tmp_path), model="no-such-model")
    assert r.status_code == 422 and "model: config.model: unknown model shape" in r.json()["detail"]


def test_rest_jobs_take_every_option_the_cli_has(service: Service, tmp_path: Path) -> None:
    """The body is the search's own TuneRequest: window, overrides, speculation, seed."""
    tid = _trace(service, tmp_path)
    options = {
        "trace_id": tid, "max_requests": 50, "attainment": 0.99, "seed": 4, "slo_e2e_ms": 30000,
        "search_space": {"tp": [1, 2], "spec_method": "eagle", "spec_k": [0, 2],
                         "acceptance_rate": 0.8},
    }  # fmt: skip
    r = _create(service, **options)
    assert r.status_code == 202, r.text
    job = service.client.get(
        f"/v1/tuning-jobs/{r.json()['id']}", headers=service.auth(service.key_a)
    )
    params = job.json()["params"]
    assert {k: params[k] for k in options} == options
    bad = _create(service, trace_id=tid, search_space={"bogus": 1})
    assert bad.status_code == 422 and "unknown keys ['bogus']" in bad.json()["detail"]
    bad = _create(service, trace_id=tid, max_requests=5)
    assert bad.status_code == 422 and "max_requests: expected an integer from 20" in bad.text


def test_unknown_fields_in_a_body_are_refused_by_name(service: Service, tmp_path: Path) -> None:
    tid = _trace(service, tmp_path)
    r = _create(service, trace_id=tid, num_trial=2)
    assert r.status_code == 422 and "num_trial" in r.text
    listed = service.client.get("/v1/tuning-jobs", headers=service.auth(service.key_a)).json()
    assert listed["total"] == 0  # nothing queued
    r = service.client.post(
        "/v1/keys", json={"project": "p", "admin": True}, headers=service.auth(service.admin)
    )
    assert r.status_code == 422 and "admin" in r.text


def test_the_documented_request_examples_are_valid() -> None:
    """The examples /docs offers for a job's body are requests the API accepts."""
    from api.routes.jobs import PARAMS_EXAMPLES
    from optimizer.search import TuneRequest

    for name, example in PARAMS_EXAMPLES.items():
        request = TuneRequest(**example["value"])
        assert request.model, name
    closed = TuneRequest(**PARAMS_EXAMPLES["closed-loop"]["value"])
    assert closed.bench_spec().max_concurrency == 64


def test_a_result_is_sent_as_stored_byte_for_byte(service: Service, tmp_path: Path) -> None:
    """The outcome document goes out as its stored JSON text, not parsed and encoded
    again: the very bytes `json.dumps` gives for the document read back; a result column
    holding JSON null is no result (409)."""
    import json

    import sqlalchemy as sa

    from storage.db import session_scope
    from storage.jobs import get_result

    jid = _create(service, trace_id=_trace(service, tmp_path), num_trials=3).json()["id"]
    assert service.worker().run_once() is True
    h = service.auth(service.key_a)
    got = service.client.get(f"/v1/tuning-jobs/{jid}/result", headers=h)
    engine = make_engine(service.url)
    with session_scope(engine) as s:
        stored = get_result(s, jid).outcome
    assert got.content == json.dumps({"job_id": jid, "outcome": stored}).encode()
    with session_scope(engine) as s:
        s.execute(sa.text("UPDATE jobs SET result = 'null' WHERE id = :id"), {"id": jid})
    engine.dispose()
    refused = service.client.get(f"/v1/tuning-jobs/{jid}/result", headers=h)
    assert refused.status_code == 409 and "has no result" in refused.json()["detail"]
