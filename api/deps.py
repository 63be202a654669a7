"""Dependencies as named `Annotated` aliases: settings, engine, session, reader, caller,
paging; and `query_of`, a query string validated as one model. `caller_of` and
`query_parser` are the same checks for plain (non-FastAPI) routes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import TypeAdapter, ValidationError
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from api.cache import TtlCache
from api.problems import ApiError
from api.reads import Reader, note_caller
from api.settings import Settings
from storage.db import read_scope, session_scope
from storage.keys import authenticate, hash_key
from storage.service_records import Principal

T = TypeVar("T")
# Dependencies that do no I/O are `async def`: FastAPI runs sync ones in the thread pool.


async def _settings(request: Request) -> Settings:
    return request.app.state.settings


async def _engine(request: Request) -> Engine:
    return request.app.state.engine


async def _key_cache(request: Request) -> TtlCache[str, Principal]:
    return request.app.state.key_cache


async def _reader(request: Request) -> Reader:
    return request.app.state.reader


SettingsDep = Annotated[Settings, Depends(_settings)]
EngineDep = Annotated[Engine, Depends(_engine)]
KeyCacheDep = Annotated[TtlCache[str, Principal], Depends(_key_cache)]
# Read routes: `await reader.json(model, query, key=...)` (see api.reads).
ReaderDep = Annotated[Reader, Depends(_reader)]


_READS = frozenset({"GET", "HEAD"})


def _session(engine: EngineDep, request: Request) -> Iterator[Session]:
    """One transaction per request, committed before the response is sent. GET and HEAD
    only read: on SQLite their transaction does not queue for the single writer's lock."""
    scope = read_scope if request.method in _READS else session_scope
    with scope(engine) as session:
        yield session


SessionDep = Annotated[Session, Depends(_session, scope="function")]

_bearer = HTTPBearer(
    auto_error=False,
    description="An API key from `servetune keys create --project P`: "
    "`Authorization: Bearer st_...`",
)


async def _principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    # Key cache and reader straight from the app state: every request solves this
    # dependency, and each sub-dependency costs FastAPI ~20 us to solve.
    challenge = {"WWW-Authenticate": 'Bearer realm="servetune"'}
    if credentials is None or not credentials.credentials:
        raise ApiError(
            401,
            "missing API key: send `Authorization: Bearer <key>` "
            "(create one with `servetune keys create --project P`)",
            kind="unauthorized",
            headers=challenge,
        )
    token = credentials.credentials
    state = request.app.state
    # A short read of its own, so a long request (an upload) holds no lock for it.
    # An unknown key is not kept by the key cache (a key created a moment ago works at
    # once); the reader keeps its lookup only until the database changes.
    hashed = hash_key(token)
    principal = await state.key_cache.get_or_load(
        hashed,
        lambda session: authenticate(session, token),
        run=lambda work: state.reader.run(work, key=("api-key", hashed)),
    )
    note_caller(principal)
    if principal is None:
        raise ApiError(401, "unknown or revoked API key", kind="unauthorized", headers=challenge)
    return principal


PrincipalDep = Annotated[Principal, Depends(_principal)]


async def caller_of(request: Request) -> Principal:
    """`PrincipalDep` outside FastAPI's dependency solving (a plain route): the same
    checks, errors and key cache."""
    return await _principal(request, await _bearer(request))


async def _admin(principal: PrincipalDep) -> Principal:
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


async def _paging(
    limit: Annotated[int, Query(ge=1, le=1000, description="page size")] = 100,
    offset: Annotated[int, Query(ge=0, le=10**9, description="items to skip")] = 0,
) -> Paging:
    return Paging(limit=limit, offset=offset)


PagingDep = Annotated[Paging, Depends(_paging)]

# Ids are 32-bit integers in every table; larger values can never match.
MAX_ID = 2**31 - 1
IdPath = Annotated[int, Path(ge=1, le=MAX_ID, description="resource id")]
# Names users give (streams, traces, schedules): printable, no control characters.
NAME_PATTERN = r"^[^\x00-\x1f\x7f]+$"


def query_of(model: type[T]) -> Any:
    """`Depends`: the request's query string as `model` (a pydantic dataclass whose
    fields are the optional query parameters), validated in one pass: ~3 us, where
    FastAPI validating seven parameters one at a time took ~100 us, the largest part of
    a first hit's CPU after the read. A bad value is FastAPI's own 422 (each error at
    ("query", name)); unknown parameters are ignored, as FastAPI ignores them; a
    repeated one counts once, with its last value, as FastAPI reads it. Document the
    parameters with the route's `openapi_extra=query_openapi(model)`."""
    return Depends(query_parser(model))


def query_parser(model: type[T]) -> Callable[[Request], Awaitable[T]]:
    """`query_of`'s parser, to call outside FastAPI's dependency solving (a plain route)."""
    adapter = TypeAdapter(model)

    async def parse(request: Request) -> T:
        try:
            return adapter.validate_python(dict(request.query_params))
        except ValidationError as exc:
            raise refusal(exc, "query") from None

    return parse


def refusal(exc: ValidationError, *where: str) -> RequestValidationError:
    """`exc`'s errors as FastAPI reports a bad parameter (422), each at `where` (e.g.
    "path", "job_id") followed by the error's own location."""
    errors = exc.errors(include_url=False)
    return RequestValidationError([{**e, "loc": (*where, *e["loc"])} for e in errors])


def query_openapi(model: type) -> dict[str, Any]:
    """The OpenAPI `parameters` of `model`'s fields as query parameters, as FastAPI writes
    them for `Query()` parameters (for `openapi_extra`; FastAPI drops the null defaults
    when it writes the document)."""
    schema = TypeAdapter(model).json_schema()
    required = set(schema.get("required", ()))
    return {
        "parameters": [
            {"name": name, "in": "query", "required": name in required, "schema": field}
            for name, field in schema["properties"].items()
        ]
    }
