"""/v1/keys (admin scope): create, list and revoke API keys of any project."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import AdminDep, IdPath, KeyCacheDep, PagingDep, SessionDep
from api.problems import ApiError
from api.schemas import KeyCreate, KeyCreated, Page, Problem, page
from storage.keys import count_keys, create_key, list_keys, revoke_key
from storage.service_records import ApiKeyInfo

router = APIRouter(prefix="/v1/keys", tags=["keys"])
ERRORS = {
    401: {"model": Problem, "description": "missing or unknown API key"},
    403: {"model": Problem, "description": "the key has no admin scope"},
    404: {"model": Problem, "description": "no such key"},
}


@router.post(
    "", status_code=201, response_model=KeyCreated, responses=ERRORS, summary="Create a key"
)
def create(spec: KeyCreate, session: SessionDep, _: AdminDep) -> KeyCreated:
    try:
        info, token = create_key(
            session, project=spec.project, name=spec.name, is_admin=spec.is_admin
        )
    except ValueError as exc:
        raise ApiError(422, str(exc), kind="validation") from None
    return KeyCreated(id=info.id, key=token, info=info)


@router.get("", response_model=Page[ApiKeyInfo], responses=ERRORS, summary="List keys")
def list_(
    session: SessionDep,
    _: AdminDep,
    paging: PagingDep,
    project: Annotated[str | None, Query(max_length=100, pattern=r"^[A-Za-z0-9._-]+$")] = None,
) -> Page[ApiKeyInfo]:
    items = list_keys(session, project=project, limit=paging.limit, offset=paging.offset)
    return page(
        items, total=count_keys(session, project=project), limit=paging.limit, offset=paging.offset
    )


@router.delete("/{key_id}", response_model=ApiKeyInfo, responses=ERRORS, summary="Revoke a key")
def revoke(key_id: IdPath, session: SessionDep, cache: KeyCacheDep, _: AdminDep) -> ApiKeyInfo:
    info = revoke_key(session, key_id)
    session.commit()  # before the cache drop, so no request can re-cache the live key
    cache.discard_where(lambda principal: principal.key_id == key_id)
    return info
