"""`servetune serve`'s HTTP protocol: uvicorn's httptools protocol, each response sent
in one write where uvicorn makes two, and the requests read in one iteration of the
event loop started least recently served connection first.

**One write.** uvicorn writes a response's status line and headers, then its body,
each with its own `transport.write`: two `send` system calls and two TCP segments for
every response, however small. Under load, on virtual machines where a system call
is dear, those writes were ~30% of the server's CPU for answers kept in memory. Here
the head is held back until the next write on the connection, which is the body when
the app sends `http.response.start` and `http.response.body` in one step (every
non-streaming response: Starlette's `Response`, `api.fastpath`), and the two go out
as one. A head with no write after it in the same step goes out at the loop's next
iteration (`loop.call_soon`): a streaming response's first chunk, an interim
`100 Continue`. Nothing is reordered, and a close sends what is held first.

**Start order.** The event loop reads every connection with a request waiting, in an
order of the kernel's making (on Linux: one that stays fixed for a connection's
life), then runs their requests in that order. Under load a batch takes a while,
and the connections served at its end send their next request after the next batch
has been read: they wait a whole batch more, every time. At 50 clients that made
p99 about twice p50 (p50 32 ms, p99 89 ms for the latest recommendation's first
hits on SQLite). Here each connection notes when its last response was sent (or
when it opened), and the requests read in one iteration start, one iteration later,
least recently served connection first (`StartOrder`): the order in which they
arrived, for clients that send their next request when an answer comes, and a fair
one for any client. A request of its own waits for no other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def _is_head(data: bytes) -> bool:
    """A status line and headers as uvicorn writes them (`HTTP/1.1 ...` to the blank
    line; a body chunk of that shape is only held back like one: harmless)."""
    return data.startswith(b"HTTP/") and data.endswith(b"\r\n\r\n")


class HeadWithBodyTransport:
    """A transport that holds a response head back until the next write (or the loop's
    next iteration), then writes both at once; everything else is the wrapped one's."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif _is_head(data):
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class StartOrder:
    """Starts the requests read in one iteration of the loop at its next iteration, the
    least recently served connection's first (see the module docstring)."""

    __slots__ = ("_loop", "_waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiting: list[tuple[float, Callable[[], None]]] = []

    def add(self, served_at: float, start: Callable[[], None]) -> None:
        """Call `start()` at the loop's next iteration, in order of `served_at`."""
        if not self._waiting:
            self._loop.call_soon(self._start)
        self._waiting.append((served_at, start))

    def _start(self) -> None:
        waiting, self._waiting = self._waiting, []
        waiting.sort(key=itemgetter(0))  # stable: ties keep the order read
        for _, start in waiting:
            start()


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over `HeadWithBodyTransport`, its requests started in
    the server's `StartOrder`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._served_at = time.monotonic()
        state = self.server_state
        order = getattr(state, "servetune_start_order", None)
        if order is None:  # one per server (its connections share one loop)
            order = state.servetune_start_order = StartOrder(self.loop)
        self._start_order = order
        super().connection_made(HeadWithBodyTransport(transport, self.loop))  # type: ignore[arg-type]

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        start = super()._start_asgi_task
        self._start_order.add(self._served_at, lambda: start(cycle, app))

    def on_response_complete(self) -> None:
        self._served_at = time.monotonic()
        super().on_response_complete()
