"""/v1/traces on SQLite and PostgreSQL: upload, idempotency, errors, isolation, concurrency."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.api_tests.conftest import Service, write_trace_csv

PROBLEM = "application/problem+json"


def _upload(svc: Service, path: Path, key: str | None = None, **fields: str):
    with path.open("rb") as fh:
        return svc.client.post(
            "/v1/traces",
            headers=svc.auth(key or svc.key_a),
            files={"file": (path.name, fh, "text/csv")},
            data=fields,
        )


def _count(svc: Service, key: str) -> int:
    return svc.client.get("/v1/traces", headers=svc.auth(key)).json()["total"]


def test_upload_list_get_stats_delete(service: Service, tmp_path: Path) -> None:
    path = write_trace_csv(tmp_path / "day1.csv", 40)
    r = _upload(service, path, stream="prod", name="monday")
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["created"] is True and body["num_requests"] == 40
    assert body["stream"] == "prod" and body["name"] == "monday"
    tid = body["id"]
    assert r.headers["location"] == f"/v1/traces/{tid}"

    again = _upload(service, path)
    assert again.status_code == 200 and again.json() == {**body, "created": False}

    listing = service.client.get("/v1/traces?limit=1", headers=service.auth(service.key_a)).json()
    assert listing["total"] == 1 and listing["items"][0]["id"] == tid
    assert listing["next_offset"] is None
    info = service.client.get(f"/v1/traces/{tid}", headers=service.auth(service.key_a)).json()
    assert info["project"] == "a" and info["stream"] == "prod"
    stats = service.client.get(f"/v1/traces/{tid}/stats", headers=service.auth(service.key_a))
    assert stats.json()["num_requests"] == 40
    by_stream = service.client.get("/v1/traces?stream=other", headers=service.auth(service.key_a))
    assert by_stream.json()["total"] == 0

    assert (
        service.client.delete(f"/v1/traces/{tid}", headers=service.auth(service.key_a)).status_code
        == 204
    )
    gone = service.client.get(f"/v1/traces/{tid}", headers=service.auth(service.key_a))
    assert gone.status_code == 404 and gone.headers["content-type"] == PROBLEM
    assert gone.json()["detail"] == f"trace {tid} not found"


def test_projects_are_isolated(service: Service, tmp_path: Path) -> None:
    path = write_trace_csv(tmp_path / "t.csv")
    tid = _upload(service, path).json()["id"]
    for method, url in (
        ("get", f"/v1/traces/{tid}"),
        ("get", f"/v1/traces/{tid}/stats"),
        ("delete", f"/v1/traces/{tid}"),
    ):
        r = service.client.request(method, url, headers=service.auth(service.key_b))
        assert r.status_code == 404, (method, url)
    assert _count(service, service.key_b) == 0
    # The same content in project b is b's own trace.
    other = _upload(service, path, key=service.key_b)
    assert other.status_code == 201 and other.json()["id"] != tid
    assert _count(service, service.key_a) == 1


def test_auth_is_required(service: Service, tmp_path: Path) -> None:
    r = service.client.get("/v1/traces")
    assert r.status_code == 401 and r.headers["content-type"] == PROBLEM
    assert r.headers["www-authenticate"].startswith("Bearer")
    r = service.client.get("/v1/traces", headers=service.auth("st_wrong"))
    assert r.status_code == 401 and "unknown or revoked" in r.json()["detail"]


def test_bad_uploads_get_precise_problems_and_store_nothing(
    service: Service, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n1.0,abc,5\n")
    r = _upload(service, bad)
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM
    detail = r.json()["detail"]
    assert detail.startswith("bad.csv, row 2, column 'num_prefill_tokens'"), detail
    assert str(tmp_path) not in detail  # the temp file's path never leaks

    r = _upload(service, write_trace_csv(tmp_path / "t.csv"), format="nosuch")
    assert r.status_code == 415 and "supported: azure" in r.json()["detail"]

    r = service.client.post(
        "/v1/traces",
        headers=service.auth(service.key_a),
        content=b"x",
    )
    assert r.status_code == 415

    r = service.client.post(
        "/v1/traces",
        headers=service.auth(service.key_a),
        data={"name": "x"},
        files={"other": ("a.csv", b"abc")},
    )
    assert r.status_code == 422 and "missing the `file` part" in r.json()["detail"]

    big = tmp_path / "big.csv"
    big.write_bytes(b"arrived_at,num_prefill_tokens,num_decode_tokens\n" + b"1.0,10,5\n" * 30_000)
    r = _upload(service, big)
    assert r.status_code == 413 and "200,000 bytes" in r.json()["detail"]

    many = write_trace_csv(tmp_path / "many.csv", 6_000)
    r = _upload(service, many)
    assert r.status_code == 413 and "row limit is 5,000" in r.json()["detail"]
    assert _count(service, service.key_a) == 0
    assert list(tmp_path.glob("servetune-upload-*")) == []  # temp files removed


def test_concurrent_uploads_same_file_stored_once(service: Service, tmp_path: Path) -> None:
    same = write_trace_csv(tmp_path / "same.csv", 300, seed=1)
    distinct = [write_trace_csv(tmp_path / f"d{i}.csv", 300, seed=10 + i) for i in range(3)]
    jobs = [same] * 4 + distinct
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(lambda p: _upload(service, p), jobs))
    assert all(r.status_code in (200, 201) for r in results), [r.text for r in results]
    same_ids = {r.json()["id"] for r in results[:4]}
    assert len(same_ids) == 1
    assert sum(r.json()["created"] for r in results[:4]) == 1
    assert _count(service, service.key_a) == 4


def test_lists_page_by_offset_and_by_keyset_cursor(service: Service, tmp_path: Path) -> None:
    """Both ways walk the same list; a cursor stays right when an item is added between
    pages (an offset shifts), and counts `offset` from itself; bad cursors are 422s."""
    a = service.auth(service.key_a)
    ids = [_upload(service, write_trace_csv(tmp_path / f"{i}.csv", 20, seed=i)).json()["id"]
           for i in range(5)]  # fmt: skip
    _upload(service, write_trace_csv(tmp_path / "b.csv", 20, seed=9), key=service.key_b)
    first = service.client.get("/v1/traces?limit=2", headers=a).json()
    assert [t["id"] for t in first["items"]] == ids[:2] and first["total"] == 5
    assert (first["next_offset"], first["next_after"]) == (2, ids[1])
    walked, after = [], None
    while True:
        query = "?limit=2" + (f"&after={after}" if after else "")
        page = service.client.get("/v1/traces" + query, headers=a).json()
        walked += [t["id"] for t in page["items"]]
        if after is None:  # an item added behind the cursor: the walk goes on unshifted
            _upload(service, write_trace_csv(tmp_path / "late.csv", 20, seed=7))
        after = page["next_after"]
        if after is None:
            break
    assert walked[:5] == ids and len(walked) == 6 and page["next_offset"] is None
    skipped = service.client.get(f"/v1/traces?after={ids[0]}&offset=2&limit=1", headers=a)
    assert [t["id"] for t in skipped.json()["items"]] == [ids[3]]
    for bad in ("0", "x", str(2**31)):
        r = service.client.get(f"/v1/traces?after={bad}", headers=a)
        assert r.status_code == 422 and r.headers["content-type"] == PROBLEM
    jobs = service.client.get("/v1/tuning-jobs?after=1", headers=a).json()
    assert jobs["items"] == [] and jobs["next_after"] is None  # newest first: none below 1


def test_implausible_upload_is_stored_with_its_warnings(service: Service, tmp_path: Path) -> None:
    """Issue 43 over REST: ms stamps uploaded as us. 201, the warning in the upload's
    answer, and the same warning in the trace's description and in the list."""
    path = tmp_path / "ms.csv"
    path.write_text("\n".join(["ts,prompt,output", *(f"{280 * i},1000,100" for i in range(500))]))
    fields = {"arrival": "ts", "input": "prompt", "output": "output", "arrival_unit": "us"}
    r = _upload(service, path, **fields)
    assert r.status_code == 201, r.text
    (warning,) = r.json()["plausibility_warnings"]
    assert warning["code"] == "rate_high" and warning["limit"] == 1000.0
    assert warning["figure"] == pytest.approx(500 / 0.13972)
    assert (
        "if the stamps in 'ts' are milliseconds, not microseconds, that is 140 s"
        in (warning["message"])
    )
    tid = r.json()["id"]
    info = service.client.get(f"/v1/traces/{tid}", headers=service.auth(service.key_a)).json()
    assert info["plausibility_warnings"] == [warning]
    listing = service.client.get("/v1/traces", headers=service.auth(service.key_a)).json()
    assert listing["items"][0]["plausibility_warnings"] == [warning]

    plain = _upload(service, write_trace_csv(tmp_path / "ok.csv", 40))
    assert plain.status_code == 201 and plain.json()["plausibility_warnings"] == []
