"""/v1/keys (admin scope): create, list and revoke API keys of the admin key's own project.

An admin key manages its own project's keys only: there is no key over every
project. Keys for any project are made by whoever runs the server, with
`servetune keys create --project P [--admin]` (direct database access).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy.orm import Session

from api.deps import AdminDep, IdPath, PagingDep, ReaderDep, SessionDep
from api.problems import ApiError
from api.schemas import KeyCreate, KeyCreated, Page, Problem, page
from storage.keys import count_keys, create_key, list_keys, revoke_key
from storage.service_records import ApiKeyInfo, Principal

router = APIRouter(prefix="/v1/keys", tags=["keys"])
ERRORS = {
    401: {"model": Problem, "description": "missing or unknown API key"},
    403: {"model": Problem, "description": "no admin scope, or another project than the key's"},
    404: {"model": Problem, "description": "no such key in this project"},
}


def _own_project(principal: Principal, project: str, doing: str) -> str:
    """`project`, when it is the admin key's own; else a 403 saying who may do it."""
    if project != principal.project:
        raise ApiError(
            403,
            f"an admin key of project {principal.project!r} manages that project's keys only; "
            f"it cannot {doing} project {project!r}. Use an admin key of {project!r}, or "
            f"`servetune keys create --project {project}` on the server",
            kind="forbidden",
        )
    return project


@router.post(
    "", status_code=201, response_model=KeyCreated, responses=ERRORS, summary="Create a key"
)
def create(spec: KeyCreate, session: SessionDep, admin: AdminDep) -> KeyCreated:
    project = _own_project(admin, spec.project, "create keys for")
    try:
        info, token = create_key(session, project=project, name=spec.name, is_admin=spec.is_admin)
    except ValueError as exc:
        raise ApiError(422, str(exc), kind="validation") from None
    return KeyCreated(id=info.id, key=token, info=info)


@router.get(
    "", response_model=Page[ApiKeyInfo], responses=ERRORS, summary="List the project's keys"
)
async def list_(
    reader: ReaderDep,
    admin: AdminDep,
    paging: PagingDep,
    project: Annotated[
        str | None,
        Query(max_length=100, pattern=r"^[A-Za-z0-9._-]+$", description="default: the key's"),
    ] = None,
) -> Response:
    project = _own_project(admin, project or admin.project, "list the keys of")
    limit, offset = paging.limit, paging.offset

    def query(session: Session) -> Page[ApiKeyInfo]:
        items = list_keys(
            session, project=project, limit=limit + 1, offset=offset, after=paging.after
        )
        return page(items, total=count_keys(session, project=project), limit=limit, offset=offset)

    return await reader.json(Page[ApiKeyInfo], query)


@router.delete("/{key_id}", response_model=ApiKeyInfo, responses=ERRORS, summary="Revoke a key")
def revoke(key_id: IdPath, session: SessionDep, request: Request, admin: AdminDep) -> ApiKeyInfo:
    """The key stops working at once in this API process; in others within
    `SERVETUNE_KEY_CACHE_S` (2 s)."""
    info = revoke_key(session, key_id, project=admin.project)  # another project's: 404
    session.commit()  # before the drop, so no request can keep the live key again
    request.app.state.key_cache.drop(key_id)
    return info
