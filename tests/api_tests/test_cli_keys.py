"""`servetune keys create/list/revoke`: the key is printed once, only its hash is stored,
and a revoked key is refused by the API."""

from __future__ import annotations

import hashlib

import sqlalchemy as sa
from typer.testing import CliRunner

from api.cli import app


def test_create_list_revoke(cli_db: str, runner: CliRunner) -> None:
    created = runner.invoke(app, ["keys", "create", "--project", "team-a", "--name", "ci"])
    assert created.exit_code == 0, created.output
    token = created.output.strip().splitlines()[-1]
    assert token.startswith("st_") and len(token) > 40
    assert "shown only now" in created.output

    engine = sa.create_engine(cli_db)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT key_hash, prefix, project FROM api_keys")).all()
    engine.dispose()
    assert rows == [(hashlib.sha256(token.encode()).hexdigest(), token[:10], "team-a")]

    admin = runner.invoke(app, ["keys", "create", "--project", "ops", "--admin"])
    assert admin.exit_code == 0, admin.output
    listed = runner.invoke(app, ["keys", "list"])
    assert listed.exit_code == 0, listed.output
    assert "team-a" in listed.output and "ops" in listed.output and "yes" in listed.output
    assert token not in listed.output and token[10:20] not in listed.output
    only = runner.invoke(app, ["keys", "list", "--project", "ops"])
    assert "team-a" not in only.output

    revoked = runner.invoke(app, ["keys", "revoke", "1"])
    assert revoked.exit_code == 0 and "key 1 (team-a) revoked" in revoked.output

    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.settings import Settings

    client_app = create_app(Settings(database_url=cli_db), embedded_worker=False)
    with TestClient(client_app) as client:
        r = client.get("/v1/traces", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 401 and "revoked" in r.json()["detail"]


def test_bad_input_is_a_clean_error(cli_db: str, runner: CliRunner) -> None:
    bad = runner.invoke(app, ["keys", "create", "--project", "no spaces"])
    assert bad.exit_code != 0 and "project 'no spaces'" in bad.output
    missing = runner.invoke(app, ["keys", "revoke", "42"])
    assert missing.exit_code != 0 and "API key 42 not found" in missing.output
    empty = runner.invoke(app, ["keys", "list"])
    assert empty.exit_code == 0 and "no keys yet" in empty.output
