"""Reads kept while the database is unchanged (api.reads): served from memory, and never
stale once anything commits, by this process or another one (on SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

from storage.db import make_engine, session_scope
from storage.keys import create_key, revoke_key
from storage.traces import delete_trace
from tests.api_tests.conftest import Service
from tests.api_tests.test_api_jobs import _trace


def _reader(service: Service):
    return service.client.app.state.reader


def test_a_kept_read_is_served_again_until_another_connection_commits(
    service: Service, tmp_path: Path
) -> None:
    h = service.auth(service.key_a)
    tid = _trace(service, tmp_path, name="before")
    reader = _reader(service)
    first = service.client.get(f"/v1/traces/{tid}", headers=h)
    hits = reader.hits
    again = service.client.get(f"/v1/traces/{tid}", headers=h)
    assert again.content == first.content and reader.hits == hits + 1
    # Another connection (a CLI, a worker) deletes it: the next read sees that at once.
    engine = make_engine(service.url)
    with session_scope(engine) as s:
        delete_trace(s, tid, project="a")
    gone = service.client.get(f"/v1/traces/{tid}", headers=h)
    assert gone.status_code == 404 and gone.json()["detail"] == f"trace {tid} not found"
    # The not-found answer is kept too (a fresh error each time), until the next commit.
    hits = reader.hits
    for _ in range(2):
        again = service.client.get(f"/v1/traces/{tid}", headers=h)
        assert again.status_code == 404 and again.json() == gone.json()
    assert reader.hits == hits + 2
    listing = service.client.get("/v1/traces", headers=h).json()
    assert listing["total"] == 0
    tid2 = _trace(service, tmp_path, name="after")  # a write through the API itself
    listing = service.client.get("/v1/traces", headers=h).json()
    assert [t["id"] for t in listing["items"]] == [tid2]
    engine.dispose()


def test_an_unknown_key_is_refused_until_it_is_created_and_after_it_is_revoked(
    service: Service,
) -> None:
    engine = make_engine(service.url)
    with session_scope(engine) as s:
        info, token = create_key(s, project="c")
        revoke_key(s, info.id)
    for _ in range(2):  # the refusal is kept ...
        r = service.client.get("/v1/traces", headers=service.auth(token))
        assert r.status_code == 401
    with session_scope(engine) as s:  # ... until the database changes: a new key works at once
        _, fresh = create_key(s, project="c")
    assert service.client.get("/v1/traces", headers=service.auth(fresh)).status_code == 200
    engine.dispose()


def test_the_job_counts_follow_the_queue(service: Service, tmp_path: Path) -> None:
    from tests.api_tests.test_api_jobs import _create

    def queued() -> str:
        text = service.client.get("/metrics").text
        return next(line for line in text.splitlines() if 'status="queued"' in line)

    assert queued().endswith(" 0")
    _create(service, trace_id=_trace(service, tmp_path), num_trials=2)
    assert queued().endswith(" 1")


def test_openapi_is_encoded_once_as_fastapi_encodes_it(service: Service) -> None:
    from fastapi.responses import JSONResponse

    app = service.client.app
    body = service.client.get("/openapi.json")
    assert body.status_code == 200 and body.headers["content-type"] == "application/json"
    assert body.content == JSONResponse(app.openapi()).body
    assert service.client.get("/openapi.json").content == body.content
    assert "/openapi.json" not in app.openapi()["paths"]


def test_postgresql_reads_stay_exact_while_the_version_connection_is_down(
    service: Service, tmp_path: Path
) -> None:
    """Without its own version connection the reader reads the version inside each read's
    transaction: still kept, still never stale."""
    import pytest

    reader = _reader(service)
    if reader._async_engine is None:
        pytest.skip("PostgreSQL only: SQLite reads its version on the reader's connection")
    reader._conninfo = "postgresql://postgres@127.0.0.1:1/nowhere"  # nothing listens there
    service.client.portal.call(reader._close_version_conn)
    assert service.client.portal.call(reader._read_version) is None
    h = service.auth(service.key_a)
    tid = _trace(service, tmp_path, name="x")
    first = service.client.get(f"/v1/traces/{tid}", headers=h)
    hits = reader.hits
    assert service.client.get(f"/v1/traces/{tid}", headers=h).content == first.content
    assert reader.hits == hits + 1
    engine = make_engine(service.url)
    with session_scope(engine) as s:
        delete_trace(s, tid, project="a")
    engine.dispose()
    assert service.client.get(f"/v1/traces/{tid}", headers=h).status_code == 404
