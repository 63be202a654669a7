"""/v1/deployments/{id}/calibrations: fitted over REST as `servetune deployments
calibrate` fits (its accuracy is tested in test_cli_deployment_calibrate and
tests/optimizer_tests/test_telemetry_calibrate); refusals name what is wrong; another
project's deployment is a 404."""

from __future__ import annotations

from tests.api_tests.conftest import Service
from tests.api_tests.test_api_deployments import _deploy, _observe, _scrapes


def test_fit_check_list_and_apply(service: Service) -> None:
    h = service.auth(service.key_a)
    d = _deploy(service)
    url = f"/v1/deployments/{d['id']}/calibrations"
    none = service.client.post(url, headers=h)
    assert none.status_code == 422 and "has no observations; observe it first" in none.text
    first = _observe(service, d["id"], *_scrapes()).json()
    second = _observe(service, d["id"], *_scrapes()).json()
    r = service.client.post(url, headers=h, json={})
    assert r.status_code == 201, r.text
    cal = r.json()
    assert cal["fitted_on"] == first["id"] and cal["checked_on"] == second["id"]
    assert cal["overhead_s"] >= 0 and cal["prefill_scale"] > 0 and cal["decode_scale"] > 0
    assert set(cal["fit"]["check"]) == {"observed", "before", "after"}
    listed = service.client.get(url, headers=h).json()
    assert listed["total"] == 1 and listed["items"][0]["id"] == cal["id"]
    # the next observation is priced with it and says so
    third = _observe(service, d["id"], *_scrapes()).json()
    assert third["calibration_id"] == cal["id"]
    assert f"deployment calibration {cal['id']}" in third["latency"]
    # refusals
    bad = service.client.post(
        url, headers=h, json={"fit_on": second["id"], "check_on": first["id"]}
    )
    assert bad.status_code == 422 and "must be later than the fitted one" in bad.json()["detail"]
    bad = service.client.post(url, headers=h, json={"fit_on": 999})
    assert bad.status_code == 422 and "has no observation 999" in bad.json()["detail"]
    bad = service.client.post(url, headers=h, json={"fit": 1})
    assert bad.status_code == 422
    other = service.client.post(url, headers=service.auth(service.key_b))
    assert other.status_code == 404
    assert service.client.get(url, headers=service.auth(service.key_b)).status_code == 404
