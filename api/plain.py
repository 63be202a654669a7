"""Plain (Starlette) routes for hot endpoints: no FastAPI request handling (its routing
and dependency solving were ~40% of a first hit's CPU). Pair each with the checks
FastAPI would make (`api.deps.caller_of`, `query_parser`, `refusal`) and a test
comparing it with a FastAPI route.

FastAPI names the route it matched in the scope (`scope["route"]`, which the metrics
label requests by); for a plain route inside an included router it does not, so the
route built here names itself."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, request_response
from starlette.types import Receive, Scope, Send


class _Named:
    """`endpoint` as an ASGI app that sets `scope["route"]` to its route first."""

    def __init__(self, endpoint: Callable[[Request], Awaitable[Response]]) -> None:
        self._app = request_response(endpoint)
        self.route: Route | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["route"] = self.route
        await self._app(scope, receive, send)


def plain_route(
    path: str,
    endpoint: Callable[[Request], Awaitable[Response]],
    *,
    methods: Collection[str] | None,
) -> Route:
    """A route to `endpoint`, out of the OpenAPI document. `methods`: those it answers
    (GET brings HEAD, as Starlette adds it), others refused with 405; None: every
    method reaches `endpoint`, which refuses those it does not answer itself."""
    app = _Named(endpoint)
    route = Route(path, app, methods=methods, include_in_schema=False)
    app.route = route
    return route
