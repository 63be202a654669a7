"""`servetune serve`'s HTTP protocol: a response's head and body in one write, a head
with nothing after it (streaming, `100 Continue`) never held back for long, and the
requests read together started least recently served connection first."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from api.http_protocol import CoalescingHttpToolsProtocol, HeadWithBodyTransport, StartOrder

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"extra:{name}"


def test_requests_start_at_the_next_turn_least_recently_served_first() -> None:
    async def main() -> list[str]:
        order = StartOrder(asyncio.get_running_loop())
        started: list[str] = []

        def start(name: str, then: tuple[float, str] | None = None):
            def run() -> None:
                started.append(name)
                if then is not None:  # read while this batch starts: the next batch
                    order.add(then[0], start(then[1]))

            return run

        order.add(3.0, start("c"))
        order.add(1.0, start("a", then=(0.5, "late")))
        order.add(2.0, start("b1"))
        order.add(2.0, start("b2"))  # a tie keeps the order read
        assert started == []  # not in the step that read them
        await asyncio.sleep(0)
        assert started == ["a", "b1", "b2", "c"]
        await asyncio.sleep(0)
        return started

    assert asyncio.run(main()) == ["a", "b1", "b2", "c", "late"]


def test_head_and_body_of_one_step_are_one_write() -> None:
    async def main() -> list[bytes]:
        fake = FakeTransport()
        transport = HeadWithBodyTransport(fake, asyncio.get_running_loop())
        transport.write(HEAD)
        assert fake.writes == []  # held
        transport.write(b"ok")
        await asyncio.sleep(0)  # the queued flush finds nothing held
        return fake.writes

    assert asyncio.run(main()) == [HEAD + b"ok"]


def test_a_lone_head_goes_out_at_the_next_turn_and_before_a_close() -> None:
    async def main() -> None:
        fake = FakeTransport()
        transport = HeadWithBodyTransport(fake, asyncio.get_running_loop())
        transport.write(HEAD)
        await asyncio.sleep(0)
        assert fake.writes == [HEAD]
        transport.write(b"ok")  # not a head: straight through
        assert fake.writes == [HEAD, b"ok"]
        transport.write(HEAD)
        transport.close()
        assert fake.writes == [HEAD, b"ok", HEAD] and fake.closed
        await asyncio.sleep(0)  # the queued flush writes nothing to the closed transport
        assert transport.get_extra_info("peername") == "extra:peername"

    asyncio.run(main())


def test_a_head_held_when_the_connection_closes_under_it_is_dropped() -> None:
    async def main() -> list[bytes]:
        fake = FakeTransport()
        transport = HeadWithBodyTransport(fake, asyncio.get_running_loop())
        transport.write(HEAD)
        fake.closed = True  # the peer went away (uvicorn's connection_lost)
        await asyncio.sleep(0)
        return fake.writes

    assert asyncio.run(main()) == []


# -- through a real uvicorn server ----------------------------------------------------
_release = threading.Event()


async def small(request: Request) -> Response:
    return Response(b"small body", media_type="text/plain")


async def stream(request: Request) -> StreamingResponse:
    async def chunks():
        yield b"first"
        # The second chunk waits until the client has read the head and the first one:
        # a head held back until the next write would hang here.
        while not _release.is_set():
            await asyncio.sleep(0.01)
        yield b"second"

    return StreamingResponse(chunks(), media_type="text/plain")


async def echo(request: Request) -> Response:
    return Response(await request.body(), media_type="application/octet-stream")


_who: list[str] = []


async def who(request: Request) -> Response:
    """Notes which connection (its client port) asked, in the order started."""
    _who.append(str(request.client.port))
    return Response(b"", media_type="text/plain")


async def block(request: Request) -> Response:
    time.sleep(0.3)  # holds the event loop: requests sent meanwhile are read together
    return Response(b"", media_type="text/plain")


@pytest.fixture
def server() -> Iterator[int]:
    import uvicorn

    app = Starlette(
        routes=[
            Route("/small", small),
            Route("/stream", stream),
            Route("/echo", echo, methods=["POST"]),
            Route("/who", who),
            Route("/block", block),
        ]
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", http=CoalescingHttpToolsProtocol
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


def _read_until(sock: socket.socket, marker: bytes, buffer: bytes = b"") -> bytes:
    while marker not in buffer:
        data = sock.recv(65536)
        assert data, f"connection closed before {marker!r}; got {buffer!r}"
        buffer += data
    return buffer


def _response(sock: socket.socket, buffer: bytes = b"") -> tuple[bytes, bytes, bytes]:
    """One content-length response read from `buffer` then `sock`: (head, body, the
    bytes after it)."""
    data = _read_until(sock, b"\r\n\r\n", buffer)
    head, rest = data.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        more = sock.recv(65536)
        assert more, f"connection closed inside a body; got {rest!r}"
        rest += more
    return head, rest[:length], rest[length:]


def test_keep_alive_responses_arrive_whole_and_in_order(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        for _ in range(3):
            sock.sendall(b"GET /small HTTP/1.1\r\nhost: t\r\n\r\n")
            head, body, rest = _response(sock)
            assert head.startswith(b"HTTP/1.1 200 OK") and body == b"small body" and not rest
        # Two pipelined requests: two whole responses, in order.
        sock.sendall(
            b"GET /small HTTP/1.1\r\nhost: t\r\n\r\nGET /nowhere HTTP/1.1\r\nhost: t\r\n\r\n"
        )
        head, body, rest = _response(sock)
        assert head.startswith(b"HTTP/1.1 200 OK") and body == b"small body"
        head, body, rest = _response(sock, rest)
        assert head.startswith(b"HTTP/1.1 404 Not Found") and not rest


def test_a_streamed_head_is_not_held_until_the_next_chunk(server: int) -> None:
    _release.clear()
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(b"GET /stream HTTP/1.1\r\nhost: t\r\n\r\n")
        data = _read_until(sock, b"first")  # times out (5 s) if the head waits for "second"
        assert data.startswith(b"HTTP/1.1 200 OK") and b"transfer-encoding: chunked" in data
        _release.set()
        data = _read_until(sock, b"0\r\n\r\n", data)
        assert b"second" in data


def test_100_continue_is_sent_before_the_body_arrives(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=5) as sock:
        sock.sendall(
            b"POST /echo HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n"
        )
        interim = _read_until(sock, b"\r\n\r\n")  # times out if held for a body never sent
        assert interim.startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(b"hello")
        head, body, _ = _response(sock)
        assert head.startswith(b"HTTP/1.1 200 OK") and body == b"hello"


def test_requests_read_together_start_least_recently_served_first(server: int) -> None:
    """Three connections opened a, b, c; b is then served. While the loop is held, b asks,
    then c: both are read in one iteration, and c, served longer ago (never), starts
    first, as it would have arrived first from a client that sends when answered."""
    ask = b"GET /who HTTP/1.1\r\nhost: t\r\n\r\n"
    conns = [socket.create_connection(("127.0.0.1", server), timeout=5) for _ in range(3)]
    try:
        a, b, c = conns
        time.sleep(0.05)  # every connection accepted (its time noted) before b is served
        b.sendall(ask)
        _response(b)
        _who.clear()
        a.sendall(b"GET /block HTTP/1.1\r\nhost: t\r\n\r\n")
        time.sleep(0.1)  # the loop is now held by /block
        b.sendall(ask)
        time.sleep(0.02)
        c.sendall(ask)
        for sock in conns:
            _response(sock)
        ports = {str(sock.getsockname()[1]): name for sock, name in zip(conns, "abc", strict=True)}
        assert [ports[port] for port in _who] == ["c", "b"]
    finally:
        for sock in conns:
            sock.close()
