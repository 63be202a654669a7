"""`servetune serve`'s HTTP protocol: uvicorn's httptools protocol, each response sent
in one write where uvicorn makes two.

uvicorn writes a response's status line and headers, then its body, each with its own
`transport.write`: two `send` system calls and two TCP segments for every response,
however small. Under load, on virtual machines where a system call is dear, those
writes were ~30% of the server's CPU for answers kept in memory. Here the head is held
back until the next write on the connection, which is the body when the app sends
`http.response.start` and `http.response.body` in one step (every non-streaming
response: Starlette's `Response`, `api.fastpath`), and the two go out as one. A head
with no write after it in the same step goes out at the loop's next iteration
(`loop.call_soon`): a streaming response's first chunk, an interim
`100 Continue`. Nothing is reordered, and a close sends what is held first.
"""

from __future__ import annotations

import asyncio
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


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over `HeadWithBodyTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(HeadWithBodyTransport(transport, self.loop))  # type: ignore[arg-type]
