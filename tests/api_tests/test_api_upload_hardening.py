"""Trace-upload hardening: cut-off uploads, the temp-file spool, generic column mappings
over REST, and hash_ids written as objects of named lists (REST, CLI and parser)."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from api.problems import ApiError
from api.uploads import clean_upload_spool, receive_upload, spool_prefix
from optimizer.records import TraceFormat
from optimizer.traces import TraceFormatError, generic_mapping, parse_trace
from tests.api_tests.conftest import Service, make_service_keys

PROBLEM = "application/problem+json"
BOUNDARY = "hardening-boundary-7f3a"
HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"
ROWS = "0.0,120,7\n0.5,300,42\n1.0,250,109\n"


def _upload(svc: Service, name: str, data: bytes, **fields: str):
    return svc.client.post(
        "/v1/traces",
        headers=svc.auth(svc.key_a),
        files={"file": (name, data, "text/plain")},
        data=fields,
    )


def _multipart(name: str, data: bytes) -> bytes:
    return (
        f"--{BOUNDARY}\r\n"
        f'Content-Disposition: form-data; name="file"; filename="{name}"\r\n'
        "Content-Type: text/csv\r\n\r\n"
    ).encode() + data


def _post_raw(svc: Service, body: bytes):
    headers = {**svc.auth(svc.key_a), "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    return svc.client.post("/v1/traces", headers=headers, content=body)


def _count(svc: Service) -> int:
    return svc.client.get("/v1/traces", headers=svc.auth(svc.key_a)).json()["total"]


def _spooled(folder: Path) -> list[Path]:
    return sorted(folder.glob("servetune-*"))


def _stored_columns(svc: Service, trace_id: int):
    from storage.db import make_engine, session_scope
    from storage.traces import load_trace_columns

    engine = make_engine(svc.url)
    try:
        with session_scope(engine) as s:
            return load_trace_columns(s, trace_id)
    finally:
        engine.dispose()


# --- 1. cut-off uploads ---------------------------------------------------------------


def test_body_without_closing_boundary_is_refused_and_nothing_stored(
    service: Service, tmp_path: Path
) -> None:
    """The reported bug: cut inside the last row, the row's 109 output tokens became 1."""
    whole = (HEADER + ROWS).encode()
    cut = whole[: whole.rindex(b"109") + 1]  # "...1.0,250,1": complete-looking, 1 token
    r = _post_raw(service, _multipart("day.csv", cut))
    assert r.status_code == 400 and r.headers["content-type"] == PROBLEM, r.text
    assert "no closing boundary" in r.json()["detail"]
    assert r.json()["type"].endswith("/truncated-upload")
    # Cut inside the part headers, or right after the data: refused the same way.
    assert _post_raw(service, _multipart("day.csv", b"")[:30]).status_code == 400
    assert _post_raw(service, _multipart("day.csv", whole) + b"\r\n").status_code == 400
    assert _count(service) == 0 and _spooled(tmp_path) == []

    closed = _multipart("day.csv", whole) + f"\r\n--{BOUNDARY}--\r\n".encode()
    ok = _post_raw(service, closed)
    assert ok.status_code == 201, ok.text
    assert _stored_columns(service, ok.json()["id"]).output_tokens.tolist() == [7, 42, 109]


def test_file_cut_mid_record_is_refused(service: Service, tmp_path: Path) -> None:
    cases = {
        "short.csv": ((HEADER + ROWS)[:-5].encode(), "has 2 of the header's 3 fields"),
        "quoted.csv": ((HEADER + ROWS)[:-1].encode() + b'\n2.0,10,"3', "inside a quoted field"),
        "cut.jsonl": (
            b'{"arrival_s": 0, "input_tokens": 5, "output_tokens": 2}\n'
            b'{"arrival_s": 1, "input_tokens": 5, "outp',
            "is not complete JSON",
        ),
    }
    for name, (data, expected) in cases.items():
        r = _upload(service, name, data)
        assert r.status_code == 422 and r.headers["content-type"] == PROBLEM, (name, r.text)
        detail = r.json()["detail"]
        assert detail.startswith(f"{name}: the last line"), detail
        assert expected in detail and "cut off mid-record" in detail, detail
    assert _count(service) == 0 and _spooled(tmp_path) == []

    # A complete last line without a line end is a complete file.
    r = _upload(service, "complete.csv", (HEADER + ROWS).rstrip("\n").encode())
    assert r.status_code == 201, r.text
    assert _stored_columns(service, r.json()["id"]).output_tokens.tolist() == [7, 42, 109]
    r = _upload(
        service, "complete.jsonl", b'{"arrival_s": 0, "input_tokens": 5, "output_tokens": 2}'
    )
    assert r.status_code == 201, r.text


def test_parser_refuses_cut_files_for_the_cli_too(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "0.0,10,5\n1.0,10")
    with pytest.raises(TraceFormatError, match=r"line 3\) has 2 of the header's 3 fields"):
        parse_trace(path)
    path.write_text(HEADER + '0.0,10,5\n1.0,10,"5"')  # quoted, complete
    assert parse_trace(path).columns.output_tokens.tolist() == [5, 5]
    path.write_text(HEADER.rstrip("\n"))  # a header only, no line end: said as before
    with pytest.raises(TraceFormatError, match="header only"):
        parse_trace(path)


# --- 2. the upload spool ----------------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_spool_entries_are_removed_at_startup(db_url: str, tmp_path: Path) -> None:
    from api.app import create_app
    from api.settings import Settings

    spool = tmp_path / "spool"
    spool.mkdir()
    dead = spool_prefix("upload").replace(f"-{os.getpid()}-", f"-{_dead_pid()}-")
    dead_profile = spool_prefix("profile").replace(f"-{os.getpid()}-", f"-{_dead_pid()}-")
    (spool / f"{dead}abc.part").write_bytes(b"half an upload")
    (spool / f"{dead_profile}xyz").mkdir()
    (spool / f"{dead_profile}xyz" / "mlp.csv").write_text("x")
    live = spool / f"{spool_prefix('upload')}live.part"  # this process: alive
    live.write_bytes(b"in flight")
    old_legacy = spool / "servetune-upload-q1w2e3.part"  # no owner in the name
    old_legacy.write_bytes(b"old")
    hour_ago = time.time() - 3700
    os.utime(old_legacy, (hour_ago, hour_ago))
    fresh_legacy = spool / "servetune-upload-r4t5y6.part"
    fresh_legacy.write_bytes(b"fresh")
    foreign = spool / "other-app.part"
    foreign.write_bytes(b"not ours")
    os.utime(foreign, (hour_ago, hour_ago))

    make_service_keys(db_url)
    settings = Settings(database_url=db_url, upload_dir=str(spool))
    with TestClient(create_app(settings, embedded_worker=False)) as client:
        assert client.get("/healthz").status_code == 200
        left = sorted(p.name for p in spool.iterdir())
    assert left == sorted([live.name, fresh_legacy.name, foreign.name])
    # An owner that is alive keeps its entry until it has been idle for the age limit.
    assert clean_upload_spool(spool, now=time.time() + 3700) == 2
    assert sorted(p.name for p in spool.iterdir()) == [foreign.name]


def test_failed_uploads_leave_no_temp_files(service: Service, tmp_path: Path) -> None:
    good = (HEADER + ROWS).encode()
    failures = [
        _upload(service, "bad.csv", HEADER.encode() + b"0.0,abc,5\n"),  # invalid trace
        _upload(service, "big.csv", HEADER.encode() + b"1.0,10,5\n" * 30_000),  # too large
        _upload(service, "t.csv", good, colour="blue"),  # unknown field
        _upload(service, "t.csv", good, arrival="arrived_at"),  # incomplete mapping
        _upload(service, "t.csv", good, format="nosuch"),  # unknown format
        _post_raw(service, _multipart("t.csv", good)),  # cut off
    ]
    assert [r.status_code for r in failures] == [422, 413, 422, 422, 415, 400]
    r = service.client.post(
        "/v1/profiles",
        headers=service.auth(service.admin),
        files={"file": ("h100.zip", b"not a zip")},
        data={"format": "aiconfigurator"},
    )
    assert r.status_code == 422, r.text
    assert _count(service) == 0 and _spooled(tmp_path) == []


def _request(receive):
    from starlette.requests import Request

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/traces",
        "headers": [(b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode())],
    }
    return Request(scope, receive)


def test_disconnect_or_cancel_mid_upload_leaves_no_temp_file(tmp_path: Path) -> None:
    first = _multipart("t.csv", (HEADER + ROWS).encode())

    def receiver(end: dict | BaseException):
        messages = [{"type": "http.request", "body": first, "more_body": True}]

        async def receive():
            if messages:
                return messages.pop()
            if isinstance(end, BaseException):
                raise end
            return end

        return receive

    async def upload(end):
        return await receive_upload(_request(receiver(end)), max_bytes=10**6, tmp_dir=tmp_path)

    with pytest.raises(ApiError) as err:
        asyncio.run(upload({"type": "http.disconnect"}))
    assert err.value.status == 400 and "disconnected" in err.value.detail
    assert _spooled(tmp_path) == []
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(upload(asyncio.CancelledError()))
    assert _spooled(tmp_path) == []


# --- 3. generic traces over REST ---------------------------------------------------------

GENERIC = "t_ms,prompt,completion,model\n0,100,10,a\n1500,200,20,b\n3000,300,30,a\n"
MAPPING = {"arrival": "t_ms", "input": "prompt", "output": "completion", "arrival_unit": "ms"}


def test_generic_upload_with_mapping_fields(service: Service, tmp_path: Path) -> None:
    r = _upload(service, "gen.csv", GENERIC.encode(), format="generic", **MAPPING)
    assert r.status_code == 201, r.text
    tid = r.json()["id"]
    info = service.client.get(f"/v1/traces/{tid}", headers=service.auth(service.key_a)).json()
    assert info["source_format"] == "generic"
    assert info["stats"]["num_requests"] == 3 and info["stats"]["duration_s"] == 3.0
    columns = _stored_columns(service, tid)
    assert columns.arrival_s.tolist() == [0.0, 1.5, 3.0]
    assert columns.input_tokens.tolist() == [100, 200, 300]
    assert columns.output_tokens.tolist() == [10, 20, 30]
    # The columns alone imply format generic (the same content: already stored).
    again = _upload(service, "gen.csv", GENERIC.encode(), **MAPPING)
    assert again.status_code == 200 and again.json()["id"] == tid
    assert _spooled(tmp_path) == []


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"format": "splitwise", "arrival": "t_ms"},
            "arrival: only for format generic (a column mapping); format splitwise",
        ),
        ({"format": "azure", "arrival_unit": "ms"}, "arrival_unit: only for format generic"),
        ({"arrival": "t_ms", "input": "prompt"}, "(missing: output)"),
        ({"format": "generic"}, "(missing: arrival, input, output)"),
        ({**MAPPING, "arrival_unit": "minutes"}, "arrival_unit 'minutes': expected one of s, ms"),
        ({**MAPPING, "output": "prompt"}, "names a column twice"),
        ({**MAPPING, "colour": "blue"}, "unknown multipart field(s) 'colour'; expected `file`"),
    ],
)
def test_bad_mapping_fields_are_refused(
    service: Service, tmp_path: Path, fields: dict[str, str], expected: str
) -> None:
    r = _upload(service, "gen.csv", GENERIC.encode(), **fields)
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM, r.text
    assert expected in r.json()["detail"], r.json()["detail"]
    assert _count(service) == 0 and _spooled(tmp_path) == []


def test_cli_builds_the_same_mapping(cli_db: str, runner: CliRunner, tmp_path: Path) -> None:
    from api.cli import app

    path = tmp_path / "gen.csv"
    path.write_text(GENERIC)
    args = ["traces", "import", str(path)]
    ok = runner.invoke(app, [*args, "--arrival", "t_ms", "--input", "prompt", "--output",
                             "completion", "--arrival-unit", "ms"])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert "3.0 s" in ok.output
    partial = runner.invoke(app, [*args, "--arrival", "t_ms", "--input", "prompt"])
    assert partial.exit_code == 2 and "(missing: output)" in partial.output
    forced = runner.invoke(app, [*args, "--format", "azure", "--arrival", "t_ms"])
    assert forced.exit_code == 2 and "only for format generic" in forced.output
    expected = generic_mapping(
        None, arrival="t_ms", input_tokens="prompt", output_tokens="completion", arrival_unit="ms"
    )
    assert expected is not None and expected.time_unit == "ms"
    assert generic_mapping(TraceFormat.AZURE) is None and generic_mapping(None) is None


# --- 3b. hash_ids as an object of named lists ---------------------------------------------


def _qwen(rows: list[object]) -> str:
    return "".join(
        json.dumps(
            {"chat_id": i, "timestamp": i, "input_length": 40, "output_length": 3, "hash_ids": h}
        )
        + "\n"
        for i, h in enumerate(rows)
    )


NAMED = [
    {"system": [1, 2], "context": [3], "question": [4, 5]},  # key order is not sorted order
    [1, 2, 6],
    {"z": [9], "a": [], "m": [7, 8]},
    {},
]
JOINED = [[1, 2, 3, 4, 5], [1, 2, 6], [9, 7, 8], []]  # worked by hand


def test_named_hash_lists_are_joined_in_key_order(tmp_path: Path) -> None:
    path = tmp_path / "qwen.jsonl"
    path.write_text(_qwen(NAMED))
    parsed = parse_trace(path)
    assert parsed.format is TraceFormat.QWEN
    assert [h.tolist() for h in parsed.columns.prefix_hashes] == JOINED
    assert all(h.dtype == np.int64 for h in parsed.columns.prefix_hashes)
    # The same in a CSV hash column (JSON text).
    csv_path = tmp_path / "mooncake.csv"
    with csv_path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["timestamp", "input_length", "output_length", "hash_ids"])
        writer.writerows([i, 40, 3, json.dumps(h)] for i, h in enumerate(NAMED))
    assert [h.tolist() for h in parse_trace(csv_path).columns.prefix_hashes] == JOINED


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ({"system": [1], "context": [-2]}, "key 'context' holds [-2]; expected a list of non-neg"),
        ({"system": [1], "context": [1.0]}, "key 'context' holds [1.0]"),
        ({"system": [1], "context": "3"}, "key 'context' holds \"3\""),
        ({"system": [1], "context": [True]}, "key 'context' holds [true]"),
        ([1.5], "found [1.5]; expected a list of integer block hashes, or an object"),
        ("abc", 'found "abc"'),
    ],
)
def test_bad_named_hash_lists_name_row_and_key(tmp_path: Path, bad: object, expected: str) -> None:
    path = tmp_path / "qwen.jsonl"
    path.write_text(_qwen([[1], bad]))
    with pytest.raises(TraceFormatError) as err:
        parse_trace(path)
    assert (err.value.row, err.value.column) == (2, "hash_ids")
    assert expected in err.value.message, err.value.message


def test_named_hash_lists_over_rest_and_cli(
    service: Service, cli_db: str, runner: CliRunner, tmp_path: Path
) -> None:
    from api.cli import app
    from api.cli.common import session
    from storage.traces import load_trace_columns

    data = _qwen(NAMED).encode()
    r = _upload(service, "qwen.jsonl", data)
    assert r.status_code == 201, r.text
    stored = _stored_columns(service, r.json()["id"]).prefix_hashes
    assert [h.tolist() for h in stored] == JOINED

    bad = _upload(service, "bad.jsonl", _qwen([[1], {"a": [1], "b": [-1]}]).encode())
    assert bad.status_code == 422, bad.text
    assert bad.json()["detail"].startswith("bad.jsonl, row 2, column 'hash_ids': key 'b'")

    path = tmp_path / "qwen.jsonl"
    path.write_bytes(data)
    result = runner.invoke(app, ["traces", "import", str(path)])
    assert result.exit_code == 0, result.output
    with session() as s:
        assert [h.tolist() for h in load_trace_columns(s, 1).prefix_hashes] == JOINED
