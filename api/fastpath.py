"""Answer GETs before routing and dependency solving when the answer is known to be current.

FastAPI spends about 0.3 ms per request routing it and solving its dependencies and
query parameters, most of a request's cost once its database read is kept in memory
(`api.reads`). This ASGI layer answers a GET itself when its answer is known, exactly.

A response that is one kept read's answer (`Reader.response`: a detail, a list, a
job result, the latest recommendation, or the 404 or 409 a kept read raised),
computed with every read at one database version, is stored with that version and
the route under (path, raw query string, the caller's grant: its project and admin
scope). Such an answer depends on the caller through its grant alone (see
`Reader.response`), so every key of a project shares it. The 401 for an API key
unknown to the database is stored the same way under (path, raw query string,
hashed key).

An answer is sent again while the tables its reads read are unchanged since its
version (`Reader.unchanged`, with the version read after the request arrived, as
`Reader` reads it) and the API key cache holds a principal with that grant for the
request's key (no entry, for an unknown key): exactly what the route would send
then, since it would authenticate from that cache (else from the key's read kept at
that version) and answer from the read kept at that version. A commit by any process
to a table it read (on SQLite: any commit) makes the next request go through the route.

Anything else (a miss, another method, no or a malformed header, a response read at
two versions or not from a kept read) goes through the normal route unchanged, so
validation, 401/403/422 problems and the key cache's rules (`api.cache`) are exactly
those of the route. Stored answers are bounded in number and bytes (all dropped when
either fills).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from fastapi.security.utils import get_authorization_scheme_param
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.cache import TtlCache
from api.reads import logging_reads
from storage.keys import hash_key
from storage.service_records import Principal

# A stored answer larger than this is not kept (it stays kept by the reader, if at all).
MAX_ANSWER_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class _Answer:
    """A response that is one kept read's answer at `version`."""

    version: object
    tables: frozenset[str] | None  # what its reads read (None: unknown, any table)
    route: object  # scope["route"] as routing left it (metrics label the replay by it)
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


class CachedGetMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        key_cache: TtlCache[str, Principal],
        max_answers: int = 4096,
        max_bytes: int = 64 << 20,
    ) -> None:
        self.app = app
        self.key_cache = key_cache
        self.max_answers, self.max_bytes = max_answers, max_bytes
        self._answers: dict[Hashable, _Answer] = {}
        self._bytes = 0
        self.replayed = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        hashed = _hashed_key(scope)
        if hashed is not None and await self._answered(scope, send, hashed):
            return
        await self._through_route(scope, receive, send, hashed)

    async def _answered(self, scope: Scope, send: Send, hashed: str) -> bool:
        """Send a stored answer for this request if one is current; True when sent."""
        path, query_string = scope["path"], scope.get("query_string", b"")
        principal = self.key_cache.get(hashed)
        answer = self._answers.get(_answer_key(path, query_string, hashed, principal))
        if answer is None:
            return False
        reader = scope["app"].state.reader
        version = await reader.version()
        if version is None or not reader.unchanged(answer.version, version, answer.tables):
            return False
        self.replayed += 1
        scope["route"] = answer.route
        await _send(send, answer.status, answer.headers, answer.body)
        return True

    async def _through_route(
        self, scope: Scope, receive: Receive, send: Send, hashed: str | None
    ) -> None:
        """The normal route, its answer stored when it is one kept read's answer."""
        start: Message | None = None
        parts: list[bytes] = []
        whole = True

        async def keep(message: Message) -> None:
            nonlocal start, whole
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                parts.append(message.get("body", b""))
                whole = whole and not message.get("more_body", False) and len(parts) == 1
            await send(message)

        with logging_reads() as log:
            await self.app(scope, receive, keep)
        version = log.replayable_at()
        if hashed is None or version is None or not log.authenticated or start is None:
            return
        if not whole or start["status"] >= 500 or len(parts[0]) > MAX_ANSWER_BYTES:
            return
        body = parts[0]
        headers = list(start.get("headers", ()))
        answer = _Answer(version, log.tables, scope.get("route"), start["status"], headers, body)
        where = _answer_key(scope["path"], scope.get("query_string", b""), hashed, log.principal)
        self._store(where, answer)

    def _store(self, where: Hashable, answer: _Answer) -> None:
        old = self._answers.pop(where, None)
        if old is not None:
            self._bytes -= len(old.body)
        size = len(answer.body)
        if len(self._answers) >= self.max_answers or self._bytes + size > self.max_bytes:
            self._answers.clear()
            self._bytes = 0
        self._answers[where] = answer
        self._bytes += size


def _answer_key(
    path: str, query_string: bytes, hashed: str, principal: Principal | None
) -> Hashable:
    """Where an answer for this request is stored: by the caller's grant, or by its key
    when the key is unknown (`principal` None)."""
    if principal is None:
        return ("unknown key", path, query_string, hashed)
    return ("grant", path, query_string, principal.project, principal.is_admin)


def _hashed_key(scope: Scope) -> str | None:
    """The hashed API key of a request's single `Authorization: Bearer` header, else None."""
    auth = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            if auth is not None:
                return None  # ambiguous: let the route decide
            auth = value
    if auth is None:
        return None
    # Exactly as the route's HTTPBearer reads it (Starlette decodes headers as latin-1).
    scheme, token = get_authorization_scheme_param(auth.decode("latin-1"))
    if scheme.lower() != "bearer" or not token:
        return None
    return hash_key(token)


async def _send(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
