"""/ui/jobs/{id} answers as the API's id routes do: a 401 without a key, a 404 for a job
not in the key's project, the same 422 for a bad id. (Its content: test_ui_job_page.py.)"""

from __future__ import annotations

import pytest

from tests.api_tests.conftest import Service


def test_a_valid_id_gets_the_page_for_that_id(service: Service) -> None:
    r = service.client.get("/ui/jobs/2147483647")
    assert r.status_code == 401 and r.headers["content-type"] == "text/html; charset=utf-8"
    assert "tuning job 2147483647" in r.text and 'value="/ui/jobs/2147483647"' in r.text
    assert "$" + "common_css" not in r.text and "$" + "body" not in r.text
    r = service.client.get("/ui/jobs/2147483647", headers=service.auth(service.key_a))
    assert r.status_code == 404 and "Tuning job 2147483647 not found" in r.text
    d = service.client.get("/ui/deployments/7")
    assert d.status_code == 200 and "const DEPLOYMENT_ID = 7;" in d.text
    assert "function linePlot(" in d.text and "async function api(path)" in d.text
    assert service.client.get("/ui/deployments/0").status_code == 422


@pytest.mark.parametrize(
    ("job_id", "message"),
    [
        ("0", "Input should be greater than or equal to 1"),
        ("-1", "Input should be greater than or equal to 1"),
        ("2147483648", "Input should be less than or equal to 2147483647"),
        ("abc", "Input should be a valid integer, unable to parse string as an integer"),
        ("1.5", "Input should be a valid integer, unable to parse string as an integer"),
    ],
)
def test_a_bad_id_is_refused_as_every_id_route_refuses_it(
    service: Service, job_id: str, message: str
) -> None:
    page = service.client.get(f"/ui/jobs/{job_id}")
    api = service.client.get(f"/v1/tuning-jobs/{job_id}", headers=service.auth(service.key_a))
    assert page.status_code == api.status_code == 422
    assert page.headers["content-type"] == "application/problem+json"
    assert page.json()["errors"] == [{"where": "path.job_id", "message": message}]
    assert page.json()["errors"] == api.json()["errors"]


def test_other_methods_are_not_allowed(service: Service) -> None:
    assert service.client.post("/ui/jobs/42").status_code == 405
    assert service.client.get("/ui/jobs/42/x").status_code == 404


def test_the_metrics_name_the_page_by_its_route(service: Service) -> None:
    service.client.get("/ui/jobs/42")
    service.client.get("/ui/jobs/0")
    metrics = service.client.get("/metrics").text
    assert 'method="GET",route="/ui/jobs/{job_id}",status="401"} 1' in metrics
    assert 'method="GET",route="/ui/jobs/{job_id}",status="422"} 1' in metrics
    assert "(unmatched)" not in metrics
