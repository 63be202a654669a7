"""Pages for people (no front-end build; no CDN).

/ui/jobs/{id}: a tuning job's status, progress and result, rendered on the server
(`api.ui.render`): curl or a browser without JavaScript reads the whole summary.
/ui/plans/{id}: a plan job's, likewise (`api.ui.plan_page`): the capacity, the lower
bound, the fleets, the picture as inline SVG and the KEDA ScaledObject. Both answer to
the same API keys and project isolation as `GET /v1/tuning-jobs/{id}` and
`GET /v1/plans/{id}`: a key as `Authorization: Bearer <key>` (curl), or kept by the
browser in a cookie that the key form sets:

- `POST /ui/key` (form fields `key`, `next`) checks the key as the API does
  (`api.deps.principal_of`) and keeps it in an HttpOnly, SameSite=Strict cookie whose
  path is /ui (the JSON API never receives it: `/v1` takes the Bearer header only, so no
  other site can make a browser write through it); then back to `next`, a job or plan
  page.
- `POST /ui/key/forget` drops it.

Both refuse a form posted from another site (`Sec-Fetch-Site`, else `Origin`). A key is
never put in a URL. Without a key the page is a 401 with the key form; another project's
job (or a job of the other kind) is a 404.

/ui/deployments/{id} plots a deployment's observed windows over time; it carries no data
itself: it asks for the API key once (kept in the browser's localStorage) and reads the
JSON API with it. common.js, common.css and key_form.html are inlined into it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from string import Template
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy.orm import Session

from api.deps import UNKNOWN_KEY, IdPath, ReaderDep, principal_of
from api.routes.jobs import result_body
from api.routes.plans import plan_body, read_plan_text
from api.ui import plan_page as plans
from api.ui import render
from storage.jobs import JobNotFinished, JobNotFound, get_job, get_result_text
from storage.service_records import JobInfo, JobKind, Principal

router = APIRouter(tags=["ui"], include_in_schema=False)

KEY_COOKIE = "servetune_key"
KEY_COOKIE_PATH = "/ui"
# Where the key form may send the browser back to: a job or plan page of this site.
_NEXT = re.compile(r"/ui/(jobs|plans)/([1-9][0-9]{0,9})")
_PAGES = {"jobs": JobKind.TUNING, "plans": JobKind.PLAN}
_PAGE_OF = {kind: page for page, kind in _PAGES.items()}
# Answers that hold a project's data: no cache keeps them, no other site frames them, and
# the page runs no script but job.js.
_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="servetune"'}
MISSING_KEY = (
    "This page needs an API key of the job's project: enter it below, or send "
    "`Authorization: Bearer <key>`."
)


def _csp() -> str:
    return (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
        f"script-src {render.script_hash()}; form-action 'self'; frame-ancestors 'none'; "
        "base-uri 'none'"
    )


def _html(text: str, status: int = 200, headers: dict[str, str] | None = None) -> HTMLResponse:
    response = HTMLResponse(text, status_code=status)
    response.headers.update(_PAGE_HEADERS)
    response.headers["Content-Security-Policy"] = _csp()
    response.headers.update(headers or {})
    return response


def _forget_cookie(response: Response) -> None:
    response.delete_cookie(KEY_COOKIE, path=KEY_COOKIE_PATH, httponly=True, samesite="strict")


@dataclass(frozen=True, slots=True)
class _Caller:
    """Who asks for a page: the principal of the key presented (None: no key, or one the
    API refuses, `why`), and whether that key came from the cookie."""

    principal: Principal | None
    why: str = ""
    from_cookie: bool = False


async def _caller(request: Request) -> _Caller:
    """The caller by the Bearer header (first) or the key cookie."""
    scheme, token = get_authorization_scheme_param(request.headers.get("authorization"))
    from_cookie = scheme.lower() != "bearer" or not token
    if from_cookie:
        token = request.cookies.get(KEY_COOKIE, "")
    if not token:
        return _Caller(None, MISSING_KEY)
    principal = await principal_of(request, token)
    why = "" if principal is not None else f"{UNKNOWN_KEY}: enter another key."
    return _Caller(principal, why, from_cookie)


def _key_form(caller: _Caller, job_id: int, kind: JobKind = JobKind.TUNING) -> HTMLResponse:
    path = f"/ui/{_PAGE_OF[kind]}/{job_id}"
    page = render.key_page(f"{kind.label} {job_id}", caller.why, path)
    response = _html(page, 401, headers=_CHALLENGE)
    if caller.from_cookie and caller.why != MISSING_KEY:  # a revoked or unknown key
        _forget_cookie(response)
    return response


@router.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
async def job_page(job_id: IdPath, request: Request, reader: ReaderDep) -> HTMLResponse:
    caller = await _caller(request)
    if caller.principal is None:
        return _key_form(caller, job_id)
    project = caller.principal.project

    def read(session: Session) -> tuple[JobInfo, str | None]:
        job = get_job(session, job_id, project=project, kind=JobKind.TUNING)
        if not job.status.finished:
            return job, None
        try:
            return job, get_result_text(session, job_id, project=project)
        except JobNotFinished:  # failed, or cancelled before any result
            return job, None

    try:
        job, text = await reader.run(read)
    except JobNotFound as exc:
        page = render.message_page(
            f"tuning job {job_id}",
            f"{str(exc).capitalize()}: it does not exist, or it belongs to another project "
            "than this API key's (forget the key to enter another).",
            forget=render.forget_form(f"/ui/jobs/{job_id}"),
        )
        return _html(page, 404)
    return _html(render.job_page(job, render.read_result(text)))


@router.get("/ui/jobs/{job_id}/result.json")
async def job_result_json(job_id: IdPath, request: Request, reader: ReaderDep) -> Response:
    """The stored result as `GET /v1/tuning-jobs/{id}/result` answers it, for the page's
    link: read-only, with the page's key."""
    caller = await _caller(request)
    if caller.principal is None:
        return _key_form(caller, job_id)
    project = caller.principal.project
    try:
        text = await reader.run(lambda s: get_result_text(s, job_id, project=project))
    except (JobNotFound, JobNotFinished) as exc:
        status = 404 if isinstance(exc, JobNotFound) else 409
        return _html(render.message_page(f"tuning job {job_id}", str(exc)), status)
    response = Response(result_body(job_id, text), media_type="application/json")
    response.headers.update(_PAGE_HEADERS)
    return response


@router.get("/ui/plans/{job_id}", response_class=HTMLResponse)
async def plan_page(job_id: IdPath, request: Request, reader: ReaderDep) -> HTMLResponse:
    caller = await _caller(request)
    if caller.principal is None:
        return _key_form(caller, job_id, JobKind.PLAN)
    project = caller.principal.project

    def read(session: Session) -> tuple[JobInfo, str | None]:
        job = get_job(session, job_id, project=project, kind=JobKind.PLAN)
        try:
            return job, read_plan_text(session, job_id, project)[1]
        except JobNotFinished:  # queued, running, failed or cancelled: no plan
            return job, None

    try:
        job, text = await reader.run(read)
    except JobNotFound as exc:
        page = render.message_page(
            f"plan job {job_id}",
            f"{str(exc).capitalize()}: it does not exist, or it belongs to another project "
            "than this API key's (forget the key to enter another).",
            forget=render.forget_form(f"/ui/plans/{job_id}"),
        )
        return _html(page, 404)
    return _html(plans.plan_page(job, plans.read_plan(text)))


@router.get("/ui/plans/{job_id}/result.json")
async def plan_result_json(job_id: IdPath, request: Request, reader: ReaderDep) -> Response:
    """The stored plan as `GET /v1/plans/{id}/result` answers it, for the page's link."""
    caller = await _caller(request)
    if caller.principal is None:
        return _key_form(caller, job_id, JobKind.PLAN)
    project = caller.principal.project
    try:
        plan_id, text = await reader.run(lambda s: read_plan_text(s, job_id, project))
    except (JobNotFound, JobNotFinished) as exc:
        status = 404 if isinstance(exc, JobNotFound) else 409
        return _html(render.message_page(f"plan job {job_id}", str(exc)), status)
    response = Response(plan_body(job_id, plan_id, text), media_type="application/json")
    response.headers.update(_PAGE_HEADERS)
    return response


def _same_site(request: Request) -> bool:
    """Whether a form post comes from this site's own page (a browser names where a
    request comes from; clients without those headers, like curl, are not browsers)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == request.headers.get("host", "")


def _refused() -> HTMLResponse:
    message = "A form posted from another site is refused: open the page itself to enter a key."
    return _html(render.message_page("API key", message), 403)


def _back(next_path: str) -> str | None:
    return next_path if _NEXT.fullmatch(next_path) else None


@router.post("/ui/key", response_class=HTMLResponse)
async def enter_key(
    request: Request,
    key: Annotated[str, Form(max_length=1000)] = "",
    next_path: Annotated[str, Form(alias="next", max_length=200)] = "",
) -> Response:
    """Check a key as the API does, keep it in the page's cookie and go back to `next`."""
    if not _same_site(request):
        return _refused()
    back = _back(next_path)
    what = None
    if back is not None:
        page, number = _NEXT.fullmatch(back).groups()  # type: ignore[union-attr]
        what = f"{_PAGES[page].label} {number}"
    token = key.strip()
    if not token:
        return _html(render.key_page(what, MISSING_KEY, back or ""), 401, _CHALLENGE)
    principal = await principal_of(request, token)
    if principal is None:
        message = f"{UNKNOWN_KEY}: enter another key."
        return _html(render.key_page(what, message, back or ""), 401, _CHALLENGE)
    if back is not None:
        response: Response = RedirectResponse(back, status_code=303)
        response.headers.update(_PAGE_HEADERS)
    else:
        kept = f"The key of project {principal.project} is kept for this site's job and plan pages."
        response = _html(render.message_page("API key", kept, forget=render.forget_form("")))
    response.set_cookie(
        KEY_COOKIE,
        token,
        max_age=render.KEY_COOKIE_DAYS * 24 * 3600,
        path=KEY_COOKIE_PATH,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return response


@router.post("/ui/key/forget", response_class=HTMLResponse)
async def forget_key(
    request: Request, next_path: Annotated[str, Form(alias="next", max_length=200)] = ""
) -> Response:
    """Drop the page's key cookie and go back to `next` (which then asks for a key)."""
    if not _same_site(request):
        return _refused()
    back = _back(next_path)
    if back is not None:
        response: Response = RedirectResponse(back, status_code=303)
        response.headers.update(_PAGE_HEADERS)
    else:
        response = _html(render.message_page("API key", "The key is forgotten."))
    _forget_cookie(response)
    return response


@router.get("/ui/deployments/{deployment_id}", response_class=HTMLResponse)
async def deployment_page(deployment_id: IdPath) -> HTMLResponse:
    html = Template(render.read("deployment.html")).substitute(
        common_js=render.read("common.js"),
        common_css=render.read("common.css"),
        key_form=render.read("key_form.html").rstrip("\n"),
        deployment_id=deployment_id,
    )
    return HTMLResponse(html)
