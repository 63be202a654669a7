"""/v1/traces: upload (multipart, streamed), list, get, stats, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.deps import (
    NAME_PATTERN,
    EngineDep,
    IdPath,
    PagingDep,
    PrincipalDep,
    ReaderDep,
    SessionDep,
)
from api.problems import ApiError
from api.schemas import FieldError, Page, Problem, TraceCreated, page
from api.services.ingest import IngestResult, ingest_trace
from api.uploads import TEXT_FIELDS, Upload, receive_upload
from optimizer.records import TraceFormat, TraceInfo, TraceStats
from optimizer.traces import (
    ColumnMapping,
    IngestLimits,
    TimeUnit,
    TraceFormatError,
    generic_mapping,
)
from storage.db import session_scope
from storage.traces import count_traces, delete_trace, get_trace, list_traces

router = APIRouter(prefix="/v1/traces", tags=["traces"])
# The generic format's column mapping: the names of `servetune traces import`'s options.
MAPPING_FIELDS = ("arrival", "input", "output", "arrival_unit")
UPLOAD_FIELDS = (*TEXT_FIELDS, *MAPPING_FIELDS)
_MAPPING_DOC = "format generic (implied by arrival, input and output): "

ERRORS = {
    401: {"model": Problem, "description": "missing or unknown API key"},
    404: {"model": Problem, "description": "no such trace in this project"},
}
_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "trace file: CSV, JSONL or Parquet",
                        },
                        "format": {
                            "type": "string",
                            "enum": [f.value for f in TraceFormat],
                            "description": "force a format (default: detected)",
                        },
                        "name": {"type": "string", "maxLength": 200},
                        "stream": {
                            "type": "string",
                            "maxLength": 200,
                            "description": "add the upload to a named trace stream",
                        },
                        "arrival": {
                            "type": "string",
                            "maxLength": 200,
                            "description": _MAPPING_DOC + "the arrival time column",
                        },
                        "input": {
                            "type": "string",
                            "maxLength": 200,
                            "description": _MAPPING_DOC + "the input (prompt) tokens column",
                        },
                        "output": {
                            "type": "string",
                            "maxLength": 200,
                            "description": _MAPPING_DOC + "the output tokens column",
                        },
                        "arrival_unit": {
                            "type": "string",
                            "enum": [u.value for u in TimeUnit],
                            "description": _MAPPING_DOC + "the arrival column's unit (default s)",
                        },
                    },
                    "additionalProperties": False,
                },
                "example": {"file": "(azure_code.csv)", "stream": "prod-chat"},
            }
        },
    }
}


def _format(upload: Upload) -> TraceFormat | None:
    value = upload.text("format")
    if value is None:
        return None
    try:
        return TraceFormat(value)
    except ValueError:
        allowed = ", ".join(f.value for f in TraceFormat)
        raise ApiError(
            415, f"unsupported trace format {value!r}; supported: {allowed}", kind="unsupported"
        ) from None


def _mapping(upload: Upload, fmt: TraceFormat | None) -> ColumnMapping | None:
    """The generic column mapping the form fields name, built as the CLI builds it."""
    try:
        return generic_mapping(
            fmt,
            arrival=upload.text("arrival"),
            input_tokens=upload.text("input"),
            output_tokens=upload.text("output"),
            arrival_unit=upload.text("arrival_unit", 16),
        )
    except ValueError as exc:
        raise ApiError(
            422,
            f"{exc} (form fields {', '.join(MAPPING_FIELDS)})",
            kind="validation",
            errors=[FieldError(where="body", message=str(exc))],
        ) from None


def _format_error(exc: TraceFormatError, upload: Upload, limits: IngestLimits) -> ApiError:
    where = [upload.filename]
    if exc.row is not None:
        where.append(f"row {exc.row}")
    if exc.column is not None:
        where.append(f"column {exc.column!r}")
    detail = f"{', '.join(where)}: {exc.message}"
    field = FieldError(where=", ".join(["file", *where[1:]]), message=exc.message)
    if "row limit" in exc.message or "size limit" in exc.message:
        return ApiError(413, detail, kind="too-large", errors=[field])
    return ApiError(422, detail, kind="invalid-trace", errors=[field])


@router.post(
    "",
    status_code=201,
    response_model=TraceCreated,
    openapi_extra=_UPLOAD_BODY,
    summary="Upload a trace (multipart field `file`; idempotent by content per project)",
    responses={
        **ERRORS,
        200: {"model": TraceCreated, "description": "the same content was already stored"},
        400: {"model": Problem, "description": "the upload was cut off (no closing boundary)"},
        413: {"model": Problem, "description": "over the size or row limit"},
        415: {"model": Problem, "description": "not multipart, or an unknown `format`"},
        422: {
            "model": Problem,
            "description": "not a valid trace, an unknown field, or a bad column mapping",
        },
    },
)
async def upload_trace(
    request: Request, response: Response, principal: PrincipalDep, engine: EngineDep
) -> TraceCreated:
    settings = request.app.state.settings
    upload = await receive_upload(
        request,
        max_bytes=settings.max_upload_bytes,
        tmp_dir=settings.upload_dir,
        text_fields=UPLOAD_FIELDS,
    )
    try:
        fmt = _format(upload)
        mapping = _mapping(upload, fmt)
        name = (upload.text("name") or upload.filename.rsplit(".", 1)[0] or "upload")[:200]
        stream = upload.text("stream")
        limits = IngestLimits(max_bytes=settings.max_upload_bytes, max_rows=settings.max_trace_rows)

        def ingest() -> IngestResult:
            with session_scope(engine) as session:
                return ingest_trace(
                    session,
                    upload.path,
                    name=name,
                    format=fmt,
                    mapping=mapping,
                    limits=limits,
                    project=principal.project,
                    stream=stream,
                )

        try:
            result = await run_in_threadpool(ingest)
        except TraceFormatError as exc:
            raise _format_error(exc, upload, limits) from None
    finally:
        upload.discard()
    if not result.created:
        response.status_code = 200
    response.headers["Location"] = f"/v1/traces/{result.trace.id}"
    return TraceCreated(
        id=result.trace.id,
        created=result.created,
        name=result.trace.name,
        stream=result.trace.stream,
        num_requests=result.trace.stats.num_requests,
        warnings=list(result.warnings),
        num_dropped=result.num_dropped,
        plausibility_warnings=list(result.plausibility_warnings),
    )


@router.get("", response_model=Page[TraceInfo], responses=ERRORS, summary="List traces")
async def list_(
    reader: ReaderDep,
    principal: PrincipalDep,
    paging: PagingDep,
    stream: Annotated[
        str | None, Query(max_length=200, pattern=NAME_PATTERN, description="only this stream")
    ] = None,
) -> Response:
    """Oldest first."""
    project, limit, offset = principal.project, paging.limit, paging.offset

    def query(session: Session) -> Page[TraceInfo]:
        items = list_traces(
            session, project=project, stream=stream, limit=limit + 1, offset=offset,
            after=paging.after,
        )  # fmt: skip
        total = count_traces(session, project=project, stream=stream)
        return page(items, total=total, limit=limit, offset=offset)

    return await reader.json(Page[TraceInfo], query)


@router.get("/{trace_id}", response_model=TraceInfo, responses=ERRORS, summary="Get a trace")
async def get(trace_id: IdPath, reader: ReaderDep, principal: PrincipalDep) -> Response:
    return await reader.json(
        TraceInfo,
        lambda session: get_trace(session, trace_id, project=principal.project),
    )


@router.get(
    "/{trace_id}/stats", response_model=TraceStats, responses=ERRORS, summary="A trace's stats"
)
async def stats(trace_id: IdPath, reader: ReaderDep, principal: PrincipalDep) -> Response:
    return await reader.json(
        TraceStats,
        lambda session: get_trace(session, trace_id, project=principal.project).stats,
    )


@router.delete("/{trace_id}", status_code=204, responses=ERRORS, summary="Delete a trace")
def delete(trace_id: IdPath, session: SessionDep, principal: PrincipalDep) -> Response:
    delete_trace(session, trace_id, project=principal.project)
    return Response(status_code=204)
