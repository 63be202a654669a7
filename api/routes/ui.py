"""/ui/jobs/{id}: a server-rendered result page (no front-end build; no CDN).

The page carries no data itself: it asks for the API key once (kept in the
browser's localStorage) and polls the JSON API with it, so the page obeys the
same project isolation as the API.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from string import Template

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from api.deps import IdPath

router = APIRouter(tags=["ui"], include_in_schema=False)


@lru_cache
def _template() -> Template:
    return Template(resources.files("api.ui").joinpath("job.html").read_text("utf-8"))


@router.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
async def job_page(job_id: IdPath) -> HTMLResponse:
    return HTMLResponse(_template().substitute(job_id=job_id))
