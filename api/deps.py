"""Dependencies as named `Annotated` aliases: settings, engine, session, caller, paging."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from api.problems import ApiError
from api.settings import Settings
from storage.db import session_scope
from storage.keys import authenticate
from storage.service_records import Principal


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _engine(request: Request) -> Engine:
    return request.app.state.engine


SettingsDep = Annotated[Settings, Depends(_settings)]
EngineDep = Annotated[Engine, Depends(_engine)]


def _session(engine: EngineDep) -> Iterator[Session]:
    """One transaction per request, committed before the response is sent."""
    with session_scope(engine) as session:
        yield session


SessionDep = Annotated[Session, Depends(_session, scope="function")]

_bearer = HTTPBearer(
    auto_error=False,
    description="An API key from `servetune keys create --project P`: "
    "`Authorization: Bearer st_...`",
)


def _principal(
    engine: EngineDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    challenge = {"WWW-Authenticate": 'Bearer realm="servetune"'}
    if credentials is None or not credentials.credentials:
        raise ApiError(
            401,
            "missing API key: send `Authorization: Bearer <key>` "
            "(create one with `servetune keys create --project P`)",
            kind="unauthorized",
            headers=challenge,
        )
    # A short transaction of its own, so a long request (an upload) holds no lock for it.
    with session_scope(engine) as session:
        principal = authenticate(session, credentials.credentials)
    if principal is None:
        raise ApiError(401, "unknown or revoked API key", kind="unauthorized", headers=challenge)
    return principal


PrincipalDep = Annotated[Principal, Depends(_principal)]


def _admin(principal: PrincipalDep) -> Principal:
    if not principal.is_admin:
        raise ApiError(
            403,
            "this API key has no admin scope; create one with `servetune keys create --admin`",
            kind="forbidden",
        )
    return principal


AdminDep = Annotated[Principal, Depends(_admin)]


@dataclass(frozen=True, slots=True)
class Paging:
    limit: int
    offset: int


def _paging(
    limit: Annotated[int, Query(ge=1, le=1000, description="page size")] = 100,
    offset: Annotated[int, Query(ge=0, le=10**9, description="items to skip")] = 0,
) -> Paging:
    return Paging(limit=limit, offset=offset)


PagingDep = Annotated[Paging, Depends(_paging)]

# Ids are 32-bit integers in every table; larger values can never match.
IdPath = Annotated[int, Path(ge=1, le=2**31 - 1, description="resource id")]
# Names users give (streams, traces, schedules): printable, no control characters.
NAME_PATTERN = r"^[^\x00-\x1f\x7f]+$"
