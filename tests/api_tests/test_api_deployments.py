"""/v1/deployments: create, list (newest first, keyset), get, delete; observations from
two uploaded scrapes; a recommendation marked as deployed; project isolation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from optimizer.telemetry.synthetic import VllmTraffic, render_vllm_page
from tests.api_tests.conftest import Service
from tests.api_tests.test_api_jobs import _create, _trace

REPO = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((REPO / "examples" / "colocated-h100.yaml").read_text())
BODY = {
    "name": "prod-chat",
    "config": CONFIG,
    "prometheus_url": "http://prometheus:9090",
    "label_selector": '{job="vllm", namespace=~"prod-.*"}',
}


def _scrapes() -> tuple[str, str]:
    first = VllmTraffic.random(50, 0)
    return (
        render_vllm_page(first),
        render_vllm_page(first.plus(VllmTraffic.random(300, 1)), kv_cache_usage=0.4),
    )


def _deploy(svc: Service, key: str | None = None, **fields) -> dict:
    r = svc.client.post("/v1/deployments", headers=svc.auth(key or svc.key_a),
                        json={**BODY, **fields})  # fmt: skip
    assert r.status_code == 201, r.text
    assert r.headers["Location"] == f"/v1/deployments/{r.json()['id']}"
    return r.json()


def _observe(svc: Service, deployment_id: int, before: str, after: str, key: str | None = None,
             window_s: str = "60"):  # fmt: skip
    return svc.client.post(
        f"/v1/deployments/{deployment_id}/observations",
        headers=svc.auth(key or svc.key_a),
        files={"before": ("before.prom", before), "after": ("after.prom", after)},
        data={"window_s": window_s},
    )


def test_create_get_list_delete_and_isolation(service: Service) -> None:
    a, b = service.auth(service.key_a), service.auth(service.key_b)
    first = _deploy(service)
    assert first["config"]["model"] == "llama-3.1-8b" and first["config"]["engine"] == "vllm"
    assert first["prometheus_url"] == BODY["prometheus_url"] and first["project"] == "a"
    assert first["recommendation_id"] is None
    second = _deploy(service, name="canary", prometheus_url=None, label_selector=None)
    got = service.client.get(f"/v1/deployments/{first['id']}", headers=a)
    assert got.status_code == 200 and got.json() == first
    # The served config is a config the API takes back.
    again = _deploy(service, name="copy", config=got.json()["config"])
    assert again["config"] == first["config"]
    page = service.client.get("/v1/deployments?limit=2", headers=a).json()
    assert [d["id"] for d in page["items"]] == [again["id"], second["id"]]  # newest first
    assert page["total"] == 3 and page["next_after"] == second["id"]
    rest = service.client.get(f"/v1/deployments?after={page['next_after']}", headers=a).json()
    assert [d["id"] for d in rest["items"]] == [first["id"]] and rest["next_after"] is None

    assert service.client.get("/v1/deployments", headers=b).json()["total"] == 0
    for method, url in (("GET", f"/v1/deployments/{first['id']}"),
                        ("DELETE", f"/v1/deployments/{first['id']}"),
                        ("GET", f"/v1/deployments/{first['id']}/observations")):  # fmt: skip
        r = service.client.request(method, url, headers=b)
        assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
        assert f"deployment {first['id']} not found" in r.json()["detail"]
    before, after = _scrapes()
    assert _observe(service, first["id"], before, after, key=service.key_b).status_code == 404

    assert service.client.delete(f"/v1/deployments/{first['id']}", headers=a).status_code == 204
    assert service.client.get(f"/v1/deployments/{first['id']}", headers=a).status_code == 404
    assert service.client.get("/v1/deployments", headers=a).json()["total"] == 2


@pytest.mark.parametrize(
    ("fields", "where", "message"),
    [
        ({"prometheus_url": "ftp://prometheus:9090"}, "body.prometheus_url", "http:// or https://"),
        ({"prometheus_url": "http://"}, "body.prometheus_url", "with a host"),
        ({"label_selector": 'job="vllm"'}, "body.label_selector", "label matcher in braces"),
        ({"label_selector": "{job=vllm}"}, "body.label_selector", "label matcher in braces"),
        ({"config": {**CONFIG, "num_replica": 2}}, "body.config", "num_replica"),
        ({"config": {**CONFIG, "model": "no-such-model"}}, "body.config", "no-such-model"),
        ({"name": ""}, "body.name", ""),
    ],
)
def test_create_refuses_bad_fields(service: Service, fields: dict, where: str, message: str):
    a = service.auth(service.key_a)
    r = service.client.post("/v1/deployments", headers=a, json={**BODY, **fields})
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert message in problem["detail"] and problem["errors"][0]["where"] == where, problem
    assert service.client.get("/v1/deployments", headers=a).json()["total"] == 0


def test_observations_are_stored_and_listed_newest_first(service: Service) -> None:
    a = service.auth(service.key_a)
    deployment = _deploy(service)
    before, after = _scrapes()
    r = _observe(service, deployment["id"], before, after)
    assert r.status_code == 201, r.text
    obs = r.json()
    assert obs["deployment_id"] == deployment["id"] and obs["window_s"] == 60
    assert obs["request_rate"] == pytest.approx(5.0) and obs["priced_as"].startswith("vLLM ")
    assert obs["latency"] and len(obs["before_sha256"]) == 64
    assert obs["before_sha256"] != obs["after_sha256"]
    report = obs["report"]
    assert report["num_requests"] == 300 and report["kv_cache_usage"]["observed"] == 0.4
    assert obs["ttft_p90_observed_s"] == report["ttft"]["observed"]["p90"] > 0
    assert obs["itl_p90_predicted_s"] == report["itl"]["predicted"]["p90"] > 0
    second = _observe(service, deployment["id"], before, after, window_s="120").json()
    listing = service.client.get(
        f"/v1/deployments/{deployment['id']}/observations?limit=1", headers=a
    ).json()
    assert [o["id"] for o in listing["items"]] == [second["id"]] and listing["total"] == 2
    older = service.client.get(
        f"/v1/deployments/{deployment['id']}/observations?after={listing['next_after']}",
        headers=a,
    ).json()
    assert [o["id"] for o in older["items"]] == [obs["id"]]


def test_bad_scrapes_are_problems_and_store_nothing(service: Service) -> None:
    a = service.auth(service.key_a)
    deployment = _deploy(service)
    before, after = _scrapes()
    cases = [
        ((after, before, "60"), 422, "counter reset between the scrapes"),
        ((before, 'vllm:num_requests_running{engine="0" 3\n', "60"), 422,
         "AFTER (after.prom), line 1"),
        (('sglang:num_running_reqs{model_name="m"} 4\n', after, "60"), 422,
         "BEFORE looks like SGLang's /metrics"),
        ((before, before, "60"), 422, "no request finished in the window"),
        ((before, after, "0"), 422, "window_s"),
        ((before, after, "soon"), 422, "window_s"),
    ]  # fmt: skip
    for (first, second, window_s), status, message in cases:
        r = _observe(service, deployment["id"], first, second, window_s=window_s)
        assert r.status_code == status, (message, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        assert message in r.json()["detail"], r.json()
    url = f"/v1/deployments/{deployment['id']}/observations"
    r = service.client.post(url, headers=a, files={"before": ("b.prom", before)},
                            data={"window_s": "60"})  # fmt: skip
    assert r.status_code == 422 and "after" in r.json()["detail"]
    r = service.client.post(url, headers=a,
                            files={"before": ("b.prom", b"\xff\xfe"), "after": ("a.prom", after)},
                            data={"window_s": "60"})  # fmt: skip
    assert r.status_code == 422 and "before: not UTF-8 text" in r.json()["detail"]
    listing = service.client.get(f"/v1/deployments/{deployment['id']}/observations", headers=a)
    assert listing.json()["total"] == 0
    assert _observe(service, 999, before, after).status_code == 404


def test_deleting_a_deployment_deletes_its_observations(service: Service) -> None:
    from storage.db import make_engine, session_scope
    from storage.deployments import count_observations

    a = service.auth(service.key_a)
    deployment, other = _deploy(service), _deploy(service, name="other")
    before, after = _scrapes()
    for target in (deployment, deployment, other):
        assert _observe(service, target["id"], before, after).status_code == 201
    gone = service.client.delete(f"/v1/deployments/{deployment['id']}", headers=a)
    assert gone.status_code == 204
    engine = make_engine(service.url)
    with session_scope(engine) as s:
        assert count_observations(s, deployment["id"]) == 0
        assert count_observations(s, other["id"]) == 1
    engine.dispose()


def test_a_recommendation_marked_as_deployed(service: Service, tmp_path: Path) -> None:
    a, b = service.auth(service.key_a), service.auth(service.key_b)
    tid = _trace(service, tmp_path)
    assert _create(service, trace_id=tid, num_trials=3).status_code == 202
    assert service.worker().run_once() is True
    rec = service.client.get(f"/v1/recommendations/latest?trace_id={tid}", headers=a).json()
    r = service.client.post(f"/v1/recommendations/{rec['id']}/deploy", headers=a)
    assert r.status_code == 201, r.text
    deployed = r.json()
    assert deployed["recommendation_id"] == rec["id"]
    assert deployed["name"] == f"recommendation-{rec['id']}"
    assert deployed["config"] == rec["recommendation"]["config"]
    assert r.headers["Location"] == f"/v1/deployments/{deployed['id']}"
    named = service.client.post(f"/v1/recommendations/{rec['id']}/deploy", headers=a,
                                json={"name": "prod", "label_selector": '{job="v"}'})  # fmt: skip
    assert named.status_code == 201 and named.json()["label_selector"] == '{job="v"}'
    bad = service.client.post(f"/v1/recommendations/{rec['id']}/deploy", headers=a,
                              json={"label_selector": "job"})  # fmt: skip
    assert bad.status_code == 422 and bad.json()["errors"][0]["where"] == "body.label_selector"
    other = service.client.post(f"/v1/recommendations/{rec['id']}/deploy", headers=b)
    assert other.status_code == 404 and "not found" in other.json()["detail"]
    assert service.client.post("/v1/recommendations/999/deploy", headers=a).status_code == 404
    assert service.client.get("/v1/deployments", headers=a).json()["total"] == 2
