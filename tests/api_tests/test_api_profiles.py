"""/v1/profiles and /v1/latency-models: uploads of measurements (admin), global reads,
and archives that try to escape their folder or exhaust the disk."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from api.services.archives import ArchiveError, ArchiveTooLarge, UnpackLimits, unpack_upload
from tests.api_tests.conftest import Service

PROBLEM = "application/problem+json"
ALL_REDUCE = (
    ",time_stats.all_reduce.min,time_stats.all_reduce.max,time_stats.all_reduce.mean,"
    "time_stats.all_reduce.median,time_stats.all_reduce.std,rank,num_workers,size,collective,"
    "devices_per_node,max_devices_per_node\n"
    "0,0.015,0.038,0.03,0.037,0.01,0,8,2048,all_reduce,8,8\n"
    "1,0.018,0.036,0.026,0.023,0.007,0,8,10240,all_reduce,8,8\n"
    "2,0.020,0.050,0.031,0.030,0.007,0,2,10240,all_reduce,8,8\n"
)


def _all_reduce_csv(num_rows: int) -> bytes:
    """A synthetic Vidur all_reduce.csv: latency grows with message size and workers."""
    lines = [ALL_REDUCE.splitlines()[0]]
    for i in range(num_rows):
        workers, size = (2, 4, 8)[i % 3], 2048 * 2 ** (i // 3)
        ms = 0.01 + size * workers * 1e-9
        lines.append(
            f"{i},{ms * 0.9},{ms * 1.2},{ms},{ms},{ms * 0.05},0,{workers},{size},all_reduce,8,8"
        )
    return ("\n".join(lines) + "\n").encode()


def _post(service: Service, filename: str, data: bytes, key: str | None = None, **fields: str):
    return service.client.post(
        "/v1/profiles",
        headers=service.auth(key or service.admin),
        files={"file": (filename, data)},
        data=fields,
    )


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _tar(add) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        add(tf)
    return buf.getvalue()


def test_import_list_get_delete_and_admin_scope(service: Service) -> None:
    user = service.auth(service.key_a)
    denied = _post(service, "all_reduce.csv", ALL_REDUCE.encode(), service.key_a, format="vidur")
    assert denied.status_code == 403 and denied.headers["content-type"] == PROBLEM
    r = _post(service, "all_reduce.csv", ALL_REDUCE.encode(), format="vidur", gpu="h100")
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["accelerator"] == "h100" and run["source"] == "vidur" and run["num_samples"] == 3
    assert r.headers["location"] == f"/v1/profiles/{run['id']}"
    # Global: every project's key reads them.
    for key in (service.key_a, service.key_b):
        listing = service.client.get("/v1/profiles", headers=service.auth(key)).json()
        assert listing["total"] == 1 and listing["items"][0]["id"] == run["id"]
    detail = service.client.get(f"/v1/profiles/{run['id']}", headers=user).json()
    assert detail["run"]["name"] == "vidur:all_reduce" and detail["ops"][0]["num_samples"] == 3
    assert service.client.delete(f"/v1/profiles/{run['id']}", headers=user).status_code == 403
    gone = service.client.delete(f"/v1/profiles/{run['id']}", headers=service.auth(service.admin))
    assert gone.status_code == 204
    missing = service.client.get(f"/v1/profiles/{run['id']}", headers=user)
    assert missing.status_code == 404 and "profile run" in missing.json()["detail"]


BAD_UPLOADS = [
    ("all_reduce.csv", ALL_REDUCE.encode(), {}, 422, "missing field 'format'"),
    ("all_reduce.csv", ALL_REDUCE.encode(), {"format": "nvprof"}, 415, "unsupported"),
    ("all_reduce.csv", ALL_REDUCE.encode(), {"format": "vidur"}, 422, "gpu="),
    ("notes.bin", b"\x00\x01 not an archive", {"format": "vidur"}, 422, "neither a zip"),
    ("x.zip", _zip({"../evil.csv": b"a"}), {"format": "vidur"}, 422, "'..'"),
    ("x.zip", _zip({"/etc/evil.csv": b"a"}), {"format": "vidur"}, 422, "absolute"),
    ("x.zip", _zip({}), {"format": "vidur"}, 422, "empty"),
    ("x.zip", b"PK\x03\x04 truncated", {"format": "vidur"}, 422, "neither a zip"),
    ("x.zip", _zip({"h100/notes.txt": b"x"}), {"format": "vidur"}, 422, "no Vidur"),
    ("x.zip", _zip({"h100/mlp.csv": b"a,b\n1,2\n"}), {"format": "vidur"}, 422, "x.zip"),
    ("x.zip", _zip({"h100/x.txt": b"x"}), {"format": "aiconfigurator"}, 422, "x.zip"),
]


def test_bad_uploads_are_precise_problems_and_store_nothing(service: Service) -> None:
    for name, data, fields, status, words in BAD_UPLOADS:
        r = _post(service, name, data, **fields)
        assert r.status_code == status, (name, fields, r.text)
        assert r.headers["content-type"] == PROBLEM and words in r.json()["detail"], r.text
        assert "servetune-profile-" not in r.json()["detail"]  # no server paths leak
    listing = service.client.get("/v1/profiles", headers=service.auth(service.admin)).json()
    assert listing["total"] == 0


def test_links_and_escapes_in_tar_archives_are_refused(service: Service, tmp_path: Path) -> None:
    def symlink(tf: tarfile.TarFile) -> None:
        info = tarfile.TarInfo("h100/mlp.csv")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(info)

    def escape(tf: tarfile.TarFile) -> None:
        info = tarfile.TarInfo("../../escaped.csv")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"a"))

    for add, words in ((symlink, "links"), (escape, "'..'")):
        r = _post(service, "p.tar.gz", _tar(add), format="vidur")
        assert r.status_code == 422 and words in r.json()["detail"], r.text
    assert not list(tmp_path.parent.parent.glob("escaped.csv"))


def test_unpacking_stops_at_the_size_and_member_limits(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("h100/mlp.csv", b"0" * 5_000_000)
    assert bomb.stat().st_size < 50_000
    (tmp_path / "a").mkdir()
    with pytest.raises(ArchiveTooLarge):
        unpack_upload(bomb, "bomb.zip", tmp_path / "a", UnpackLimits(max_unpacked_bytes=1_000_000))
    many = tmp_path / "many.zip"
    many.write_bytes(_zip({f"f{i}.csv": b"x" for i in range(20)}))
    (tmp_path / "b").mkdir()
    with pytest.raises(ArchiveError, match="more than 10 members"):
        unpack_upload(many, "many.zip", tmp_path / "b", UnpackLimits(10**6, max_members=10))


def test_archives_of_the_public_tables_import(service: Service, shared_data: Path) -> None:
    gpu = shared_data / "profiles" / "aiconfigurator" / "h100_sxm"
    data = _tar(lambda tf: tf.add(gpu, arcname="h100_sxm"))
    r = _post(service, "h100_sxm.tar.gz", data, format="aiconfigurator")
    assert r.status_code == 201, r.text
    assert r.json()["accelerator"] == "h100" and r.json()["num_samples"] > 100
    mlp = shared_data / "profiles" / "vidur" / "compute" / "h100" / "meta-llama" / "Llama-2-7b-hf"
    data = _zip({"h100/Llama-2-7b-hf/mlp.csv": (mlp / "mlp.csv").read_bytes()})
    r = _post(service, "vidur.zip", data, format="vidur", name="vidur h100")
    assert r.status_code == 201 and r.json()["name"] == "vidur h100", r.text


def test_latency_models_are_listed_for_every_project(service: Service) -> None:
    from storage.db import make_engine, session_scope
    from storage.latency_models import save_latency_model

    user = service.auth(service.key_b)
    assert service.client.get("/v1/latency-models", headers=user).json()["total"] == 0
    engine = make_engine(service.url)
    with session_scope(engine) as s:
        for accelerator in ("h100", "a100"):
            save_latency_model(s, name="m", accelerator=accelerator, payload=b"x", schema_version=1)
    engine.dispose()
    assert service.client.get("/v1/latency-models", headers=user).json()["total"] == 2
    listing = service.client.get("/v1/latency-models?accelerator=h100", headers=user).json()
    assert listing["total"] == 1 and listing["items"][0]["accelerator"] == "h100"
    mid = listing["items"][0]["id"]
    got = service.client.get(f"/v1/latency-models/{mid}", headers=user).json()
    assert got["id"] == mid and "payload" not in got
    missing = service.client.get("/v1/latency-models/999", headers=user)
    assert missing.status_code == 404 and missing.headers["content-type"] == PROBLEM


# The fit is CPU work on loaded samples; storage on both back-ends is covered above.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_fit_a_latency_model_from_a_stored_profile(service: Service) -> None:
    admin = service.auth(service.admin)
    data = _all_reduce_csv(36)
    run = _post(service, "all_reduce.csv", data, format="vidur", gpu="h100").json()
    body = {"profile_run_id": run["id"], "name": "h100 net"}
    denied = service.client.post(
        "/v1/latency-models", json=body, headers=service.auth(service.key_a)
    )
    assert denied.status_code == 403
    r = service.client.post("/v1/latency-models", json=body, headers=admin)
    assert r.status_code == 201, r.text
    model = r.json()
    assert model["profile_run_id"] == run["id"] and model["accelerator"] == "h100"
    assert model["name"] == "h100 net" and model["version"] == 1
    assert r.headers["location"] == f"/v1/latency-models/{model['id']}"
    tiny = _post(service, "all_reduce.csv", ALL_REDUCE.encode(), format="vidur", gpu="h100")
    for bad, status, words in (
        ({"profile_run_id": 999}, 404, "profile run 999"),
        ({"profile_run_id": run["id"], "shape": "/etc/passwd"}, 422, "unknown model shape"),
        ({"profile_run_id": 0}, 422, "profile_run_id"),
        ({"profile_run_id": tiny.json()["id"]}, 422, "cannot fit"),
    ):
        r = service.client.post("/v1/latency-models", json=bad, headers=admin)
        assert r.status_code == status and r.headers["content-type"] == PROBLEM, r.text
        assert words in r.json()["detail"]
    listing = service.client.get("/v1/latency-models", headers=admin).json()
    assert listing["total"] == 1
