"""/ui/jobs/{id}: a server-rendered result page (no front-end build; no CDN).

The page carries no data itself: it asks for the API key once (kept in the
browser's localStorage) and polls the JSON API with it, so the page obeys the
same project isolation as the API.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from string import Template
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from pydantic import Field, TypeAdapter, ValidationError

from api.deps import MAX_ID, refusal
from api.plain import plain_route

router = APIRouter(tags=["ui"], include_in_schema=False)
# The job id, checked as the API's `IdPath` parameters are.
_JOB_ID = TypeAdapter(Annotated[int, Field(ge=1, le=MAX_ID)])


@lru_cache
def _template() -> Template:
    return Template(resources.files("api.ui").joinpath("job.html").read_text("utf-8"))


@lru_cache(maxsize=1024)
def _page(job_id: int) -> bytes:
    return _template().substitute(job_id=job_id).encode("utf-8")


async def job_page(request: Request) -> HTMLResponse:
    """A plain route, not FastAPI's: the page is static per id, and FastAPI's request
    handling (parameters, dependencies, response checks) was half its CPU (~150 us)."""
    try:
        job_id = _JOB_ID.validate_python(request.path_params["job_id"])
    except ValidationError as exc:
        raise refusal(exc, "path", "job_id") from None
    return HTMLResponse(_page(job_id))


router.routes.append(plain_route("/ui/jobs/{job_id}", job_page, methods=["GET"]))
