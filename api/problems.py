"""RFC 9457 problem details (`application/problem+json`) for every error the API returns.

One handler per error family: `ApiError` (raised by routes and dependencies),
HTTP errors from the framework (404 route, 405 method), request validation,
the storage layer's not-found errors (a stored id that does not exist or
belongs to another project: the one lookup-or-404 path), and anything else
(500, no details leaked).
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.schemas import FieldError, Problem
from optimizer.traces.errors import MAX_ECHO_ITEMS, MAX_MESSAGE_CHARS, clip
from storage.deployments import DeploymentNotFound
from storage.jobs import JobNotFound
from storage.keys import KeyNotFound
from storage.latency_models import LatencyModelNotFound
from storage.profiles import ProfileRunNotFound
from storage.recommendations import RecommendationNotFound
from storage.schedules import ScheduleNotFound
from storage.traces import TraceNotFound

PROBLEM_JSON = "application/problem+json"
TYPE_BASE = "https://servetune.dev/problems/"
log = logging.getLogger("servetune.api")
# A stored id that does not exist, or belongs to another project: the one 404 path.
NOT_FOUND_ERRORS = (
    TraceNotFound,
    JobNotFound,
    ScheduleNotFound,
    KeyNotFound,
    RecommendationNotFound,
    ProfileRunNotFound,
    LatencyModelNotFound,
    DeploymentNotFound,
)


class ApiError(Exception):
    """An error with an HTTP status and a precise, user-facing detail."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        kind: str | None = None,
        errors: list[FieldError] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.kind = kind
        self.errors = errors
        self.headers = headers


def problem_response(
    request: Request,
    status: int,
    detail: str,
    *,
    kind: str | None = None,
    errors: list[FieldError] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    title = HTTPStatus(status).phrase
    slug = kind or title.lower().replace(" ", "-").replace("'", "")
    if errors is not None and len(errors) > MAX_ECHO_ITEMS:
        errors = errors[:MAX_ECHO_ITEMS]  # the detail says how many there were
    body = Problem(
        type=TYPE_BASE + slug,
        title=title,
        status=status,
        detail=clip(detail, MAX_MESSAGE_CHARS),
        instance=clip(request.url.path),
        errors=[FieldError(where=clip(e.where), message=clip(e.message, 500)) for e in errors]
        if errors is not None
        else None,
    )
    return JSONResponse(
        body.model_dump(exclude_none=True),
        status_code=status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


def _where(loc: tuple) -> str:
    return ".".join(str(part) for part in loc)


def install_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return problem_response(
            request, exc.status, exc.detail, kind=exc.kind, errors=exc.errors, headers=exc.headers
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.method} {request.url.path}; see /docs for the API"
        if exc.status_code == 405:
            detail = f"method {request.method} is not allowed on {request.url.path}"
        return problem_response(request, exc.status_code, detail, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            FieldError(where=_where(tuple(e.get("loc", ()))), message=str(e.get("msg", "")))
            for e in exc.errors()
        ]
        summary = "; ".join(f"{e.where}: {e.message}" for e in errors[:5])
        return problem_response(
            request, 422, f"invalid request: {summary}", kind="validation", errors=errors
        )

    async def _not_found(request: Request, exc: Exception) -> JSONResponse:
        return problem_response(request, 404, str(exc), kind="not-found")

    for error in NOT_FOUND_ERRORS:
        app.add_exception_handler(error, _not_found)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem_response(
            request, 500, "internal server error; the request left stored data unchanged"
        )
