"""Dependencies as named `Annotated` aliases: engine, session, reader, caller, paging; and
the API-key cache the caller is looked up in."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from time import monotonic
from typing import Annotated, TypeVar

from fastapi import Depends, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from api.problems import ApiError
from api.reads import Reader
from storage.db import session_scope
from storage.keys import authenticate, hash_key
from storage.service_records import Principal

T = TypeVar("T")
# Dependencies that do no I/O are `async def`: FastAPI runs sync ones in the thread pool.


async def _engine(request: Request) -> Engine:
    return request.app.state.engine


async def _reader(request: Request) -> Reader:
    return request.app.state.reader


EngineDep = Annotated[Engine, Depends(_engine)]
# Read routes: `await reader.json(model, query)` (see api.reads).
ReaderDep = Annotated[Reader, Depends(_reader)]


def _session(engine: EngineDep) -> Iterator[Session]:
    """The write routes' transaction, committed before the response is sent (reads go
    through the `Reader`)."""
    with session_scope(engine) as session:
        yield session


SessionDep = Annotated[Session, Depends(_session, scope="function")]

_bearer = HTTPBearer(
    auto_error=False,
    description="An API key from `servetune keys create --project P`: "
    "`Authorization: Bearer st_...`",
)


MISSING_KEY = (
    "missing API key: send `Authorization: Bearer <key>` "
    "(create one with `servetune keys create --project P`)"
)
UNKNOWN_KEY = "unknown or revoked API key"


async def principal_of(request: Request, token: str) -> Principal | None:
    """The principal an API key stands for (None: unknown or revoked), through the key
    cache: every way of presenting a key (the API's Bearer header, the result page's
    cookie) is checked by this one lookup."""
    keys: KeyCache = request.app.state.key_cache
    hashed = hash_key(token)
    principal = keys.get(hashed)
    if principal is None:  # a short read of its own: a long request holds no lock for it
        principal = await request.app.state.reader.run(lambda s: authenticate(s, token))
        if principal is None:
            return None
        keys.put(hashed, principal)
    return principal


async def _principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    challenge = {"WWW-Authenticate": 'Bearer realm="servetune"'}
    if credentials is None or not credentials.credentials:
        raise ApiError(401, MISSING_KEY, kind="unauthorized", headers=challenge)
    principal = await principal_of(request, credentials.credentials)
    if principal is None:
        raise ApiError(401, UNKNOWN_KEY, kind="unauthorized", headers=challenge)
    return principal


class KeyCache:
    """The principals of API keys looked up in the last `ttl_s` seconds
    (`SERVETUNE_KEY_CACHE_S`; 0: none), so that most requests read the database once, not
    twice. A key revoked through this process's API is dropped at once (`drop`); revoked
    elsewhere (the CLI, another API process) it works at most `ttl_s` longer. Unknown keys
    are not kept (a key created a moment ago works at once), so it holds at most one entry
    per stored key."""

    def __init__(self, ttl_s: float, *, clock: Callable[[], float] = monotonic) -> None:
        self.ttl_s, self._clock = ttl_s, clock
        self._entries: dict[str, tuple[float, Principal]] = {}

    def get(self, hashed: str) -> Principal | None:
        entry = self._entries.get(hashed)
        if entry is None or self._clock() >= entry[0]:
            return None
        return entry[1]

    def put(self, hashed: str, principal: Principal) -> None:
        if self.ttl_s > 0:
            self._entries[hashed] = (self._clock() + self.ttl_s, principal)

    def drop(self, key_id: int) -> None:
        """Forget key `key_id` (revoked). Safe from a thread-pool route: it walks a copy."""
        for hashed, (_, principal) in list(self._entries.items()):
            if principal.key_id == key_id:
                self._entries.pop(hashed, None)


PrincipalDep = Annotated[Principal, Depends(_principal)]


async def _admin(principal: PrincipalDep) -> Principal:
    if not principal.is_admin:
        raise ApiError(
            403,
            "this API key has no admin scope; create one with `servetune keys create --admin`",
            kind="forbidden",
        )
    return principal


AdminDep = Annotated[Principal, Depends(_admin)]


# Ids are 32-bit integers in every table; larger values can never match.
MAX_ID = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Paging:
    """A page of a list: `limit` items, `offset` skipped, counted after the item `after`
    (a keyset cursor: a page's `next_after`, the id of its last item) when given."""

    limit: int
    offset: int
    after: int | None = None

    def of(self, items: Sequence[T]) -> list[T]:
        """This page of a whole list held in memory (ordered by id, oldest first), with
        one item more when another page follows (as `api.schemas.page` takes it)."""
        if self.after is not None:
            items = [item for item in items if item.id > self.after]  # type: ignore[attr-defined]
        return list(items[self.offset : self.offset + self.limit + 1])


async def _paging(
    limit: Annotated[int, Query(ge=1, le=1000, description="page size")] = 100,
    offset: Annotated[int, Query(ge=0, le=10**9, description="items to skip")] = 0,
    after: Annotated[
        int | None,
        Query(
            ge=1,
            le=MAX_ID,
            description="keyset cursor: start after the item with this id, in the list's "
            "order (a page's `next_after`); `offset` then counts from there",
        ),
    ] = None,
) -> Paging:
    return Paging(limit=limit, offset=offset, after=after)


PagingDep = Annotated[Paging, Depends(_paging)]
IdPath = Annotated[int, Path(ge=1, le=MAX_ID, description="resource id")]
# Names users give (streams, traces, schedules): printable, no control characters.
NAME_PATTERN = r"^[^\x00-\x1f\x7f]+$"
