"""Schemathesis property tests against the OpenAPI spec: no input yields a server error,
and every error is problem+json. Bounded (a few examples per operation) on SQLite."""

from __future__ import annotations

from pathlib import Path

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from tests.api_tests.conftest import make_service_keys


def _check(case: schemathesis.Case, keys: dict[str, str], statuses: list[int]) -> None:
    admin_paths = ("/v1/keys", "/v1/profiles", "/v1/latency-models")
    key = keys["admin"] if case.path.startswith(admin_paths) else keys["user"]
    response = case.call(headers={"Authorization": f"Bearer {key}"})
    statuses.append(response.status_code)
    assert response.status_code < 500, (case.method, case.path, response.text)
    if response.status_code >= 400:
        assert response.headers["content-type"][0].startswith("application/problem+json")


def test_no_server_errors(tmp_path: Path) -> None:
    from api.app import create_app
    from api.settings import Settings

    url = f"sqlite:///{tmp_path / 'fuzz.db'}"
    key_a, _, admin = make_service_keys(url)
    keys = {"user": key_a, "admin": admin}
    statuses: list[int] = []
    app = create_app(
        Settings(database_url=url, max_upload_bytes=100_000, upload_dir=str(tmp_path)),
        embedded_worker=False,
    )
    with TestClient(app):  # runs the lifespan: migrations and the engine
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 22
        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(
                max_examples=10,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=True,
                database=None,
            )
            def run(case: schemathesis.Case) -> None:
                _check(case, keys, statuses)

            run()
    assert len(statuses) >= 5 * len(operations)
    assert any(200 <= s < 300 for s in statuses) and any(400 <= s < 500 for s in statuses)
