"""/v1/profiles: stored GPU kernel measurements (list, get, import an uploaded archive).

Profiles are global, not per project: they are measurements of hardware, shared
by every project's tuning (the newest fitted latency model per accelerator prices
every search). Any key may read them; importing or deleting one needs the admin
scope. The server never reads a folder named by the client: the measurements are
uploaded as a zip or tar.gz of an AIConfigurator GPU folder or a Vidur folder, or
as one Vidur CSV, and unpacked safely into a temporary folder (`api.services.archives`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.deps import AdminDep, EngineDep, IdPath, PagingDep, PrincipalDep, ReaderDep, SessionDep
from api.problems import ApiError
from api.schemas import Page, Problem, page
from api.services.archives import (
    ArchiveError,
    ArchiveTooLarge,
    UnpackLimits,
    remove_tree,
    unpack_upload,
)
from api.uploads import Upload, receive_upload, spool_prefix
from optimizer.records import OpKind, ProfileRunInfo
from profiler.importers import ImportedProfile, ImportFormat, ProfileImportError, import_profile
from storage.db import session_scope
from storage.profiles import (
    create_profile_run,
    delete_profile_run,
    list_profile_runs,
    profile_run_detail,
)

router = APIRouter(prefix="/v1/profiles", tags=["profiles"])
ERRORS = {
    401: {"model": Problem, "description": "missing or unknown API key"},
    404: {"model": Problem, "description": "no such profile run"},
}
ADMIN_ERRORS = {**ERRORS, 403: {"model": Problem, "description": "the key has no admin scope"}}
TEXT_FIELDS = ("format", "gpu", "name")
_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "format"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "a .zip or .tar.gz of an AIConfigurator GPU folder "
                            "(e.g. h100_sxm/) or of a Vidur folder, or one Vidur CSV "
                            "(mlp.csv, attention.csv, all_reduce.csv)",
                        },
                        "format": {"type": "string", "enum": [f.value for f in ImportFormat]},
                        "gpu": {
                            "type": "string",
                            "maxLength": 64,
                            "description": "accelerator preset (default: inferred from folder "
                            "names such as h100_sxm)",
                        },
                        "name": {"type": "string", "maxLength": 200},
                    },
                },
                "example": {"file": "(h100_sxm.tar.gz)", "format": "aiconfigurator"},
            }
        },
    }
}


class OpSummary(BaseModel):
    op: OpKind
    num_samples: int
    min_median_ms: float
    max_median_ms: float


class ProfileDetail(BaseModel):
    run: ProfileRunInfo
    ops: list[OpSummary]


def _format(upload: Upload) -> ImportFormat:
    value = upload.text("format", 32)
    allowed = ", ".join(f.value for f in ImportFormat)
    if value is None:
        raise ApiError(422, f"missing field 'format': one of {allowed}", kind="validation")
    try:
        return ImportFormat(value)
    except ValueError:
        raise ApiError(
            415, f"unsupported profile format {value!r}; supported: {allowed}", kind="unsupported"
        ) from None


def _import(
    upload: Upload, fmt: ImportFormat, gpu: str | None, limits: UnpackLimits, tmp: Path
) -> ImportedProfile:
    root = unpack_upload(upload.path, upload.filename, tmp, limits)
    return import_profile(root, fmt, gpu)


@router.post(
    "",
    status_code=201,
    response_model=ProfileRunInfo,
    openapi_extra=_UPLOAD_BODY,
    summary="Import measurements (admin): an uploaded archive or Vidur CSV, stored atomically",
    responses={
        **ADMIN_ERRORS,
        400: {"model": Problem, "description": "the upload was cut off (no closing boundary)"},
        413: {"model": Problem, "description": "the upload or its unpacked size is too large"},
        415: {"model": Problem, "description": "not multipart, or an unknown `format`"},
        422: {"model": Problem, "description": "not a readable archive or profile"},
    },
)
async def import_(
    request: Request, response: Response, _: AdminDep, engine: EngineDep
) -> ProfileRunInfo:
    settings = request.app.state.settings
    upload = await receive_upload(
        request,
        max_bytes=settings.max_profile_bytes,
        tmp_dir=settings.upload_dir,
        text_fields=TEXT_FIELDS,
        setting="SERVETUNE_MAX_PROFILE_BYTES",
    )
    tmp: Path | None = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=spool_prefix("profile"), dir=settings.upload_dir))
        fmt = _format(upload)
        gpu = upload.text("gpu", 64)
        stem = upload.filename.split(".", 1)[0] or "upload"
        name = upload.text("name") or f"{fmt.value}:{stem}"[:200]
        limits = UnpackLimits(max_unpacked_bytes=settings.max_profile_unpacked_bytes)
        try:
            imported = await run_in_threadpool(_import, upload, fmt, gpu, limits, tmp)
        except ArchiveTooLarge as exc:
            raise ApiError(413, f"{upload.filename}: {exc}", kind="too-large") from None
        except (ArchiveError, ProfileImportError) as exc:
            detail = str(exc).replace(str(tmp), upload.filename)  # no server paths
            raise ApiError(422, detail, kind="invalid-profile") from None

        def store() -> ProfileRunInfo:
            with session_scope(engine) as session:
                return create_profile_run(
                    session,
                    name=name,
                    source=imported.source,
                    accelerator=imported.accelerator,
                    device=imported.device,
                    samples=imported.samples,
                    engine=imported.engine,
                )

        try:
            info = await run_in_threadpool(store)
        except ValueError as exc:
            raise ApiError(422, f"{upload.filename}: {exc}", kind="invalid-profile") from None
    finally:
        upload.discard()
        if tmp is not None:
            remove_tree(tmp)
    response.headers["Location"] = f"/v1/profiles/{info.id}"
    return info


@router.get("", response_model=Page[ProfileRunInfo], responses=ERRORS, summary="List profiles")
async def list_(reader: ReaderDep, _: PrincipalDep, paging: PagingDep) -> Response:
    """Oldest first."""

    def query(session: Session) -> Page[ProfileRunInfo]:
        runs = list_profile_runs(session)
        return page(paging.of(runs), total=len(runs), limit=paging.limit, offset=paging.offset)

    return await reader.json(Page[ProfileRunInfo], query)


@router.get(
    "/{run_id}",
    response_model=ProfileDetail,
    responses=ERRORS,
    summary="A profile run and its samples per operator",
)
async def get(run_id: IdPath, reader: ReaderDep, _: PrincipalDep) -> Response:
    def query(session: Session) -> ProfileDetail:
        run, counts = profile_run_detail(session, run_id)
        ops = [
            OpSummary(op=op, num_samples=n, min_median_ms=lo, max_median_ms=hi)
            for op, (n, lo, hi) in counts.items()
        ]
        return ProfileDetail(run=run, ops=ops)

    return await reader.json(ProfileDetail, query)


@router.delete(
    "/{run_id}", status_code=204, responses=ADMIN_ERRORS, summary="Delete a profile run (admin)"
)
def delete(run_id: IdPath, session: SessionDep, _: AdminDep) -> Response:
    delete_profile_run(session, run_id)
    return Response(status_code=204)
