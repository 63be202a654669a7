"""Server-rendered pages (no front-end build; no CDN): /ui/jobs/{id}, a tuning job's
result, and /ui/deployments/{id}, a deployment's observed windows over time.

A page carries no data itself: it asks for the API key once (kept in the browser's
localStorage) and reads the JSON API with it, so the page obeys the same project
isolation as the API. common.js, common.css and the key form (key_form.html) are inlined
into every page.
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
def _read(name: str) -> str:
    return resources.files("api.ui").joinpath(name).read_text("utf-8")


def _page(name: str, **values: object) -> HTMLResponse:
    html = Template(_read(name)).substitute(
        common_js=_read("common.js"),
        common_css=_read("common.css"),
        key_form=_read("key_form.html").rstrip("\n"),
        **values,
    )
    return HTMLResponse(html)


@router.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
async def job_page(job_id: IdPath) -> HTMLResponse:
    return _page("job.html", job_id=job_id)


@router.get("/ui/deployments/{deployment_id}", response_class=HTMLResponse)
async def deployment_page(deployment_id: IdPath) -> HTMLResponse:
    return _page("deployment.html", deployment_id=deployment_id)
