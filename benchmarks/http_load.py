"""Closed-loop HTTP/1.1 GET load for bench_api.py, run in a process of its own.

A raw asyncio client (keep-alive connections, pre-encoded requests, no HTTP
library) spends tens of microseconds a request, so on a small machine the
server, not the client, sets the pace. `load_process(port, phases, clients,
duration, server_pid)` runs each phase (a list of requests: label index, raw
bytes, expected status) in turn: `clients` connections send its requests for
`duration` seconds, round-robin, each connection starting at its own offset. It
returns per phase the latencies in ms and the unexpected statuses per label, the
wall time, and the CPU seconds the server process (`server_pid`, all its threads;
Linux `/proc`, else None) used during the phase.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Mapping

Request = tuple[int, bytes, int]  # label index, raw request, expected status
Phase = list[Request]


def encode_get(path: str, key: str | None, headers: Mapping[str, str] | None = None) -> bytes:
    """A GET request with a bearer key (or none) and any extra headers, as sent on the wire
    (e.g. `{"If-None-Match": etag}`: then the expected status is 304)."""
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1"]
    if key:
        lines.append(f"Authorization: Bearer {key}")
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    if status in (204, 304) or status < 200:  # no body, whatever the headers say
        return status
    lower = head.lower()
    at = lower.find(b"content-length:")
    if at >= 0:
        await reader.readexactly(int(lower[at + 15 : lower.find(b"\r\n", at)]))
    elif b"transfer-encoding: chunked" in lower:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of process `pid` and its threads so far (Linux), else None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


async def _phase(
    port: int, requests: Phase, clients: int, duration: float, server_pid: int
) -> tuple[dict[int, list[float]], dict[int, int], float, float | None]:
    """Latencies in ms and unexpected statuses per label index, the wall time in s and
    the server's CPU seconds."""
    latencies: dict[int, list[float]] = {i: [] for i, _, _ in requests}
    errors = dict.fromkeys(latencies, 0)
    end = time.monotonic() + duration

    async def client(start: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        n = start
        while time.monotonic() < end:
            label, raw, expected = requests[n % len(requests)]
            n += 1
            t = time.perf_counter()
            writer.write(raw)
            status = await _read_response(reader)
            latencies[label].append((time.perf_counter() - t) * 1e3)
            errors[label] += status != expected
        writer.close()

    t0, cpu0 = time.monotonic(), cpu_seconds(server_pid)
    await asyncio.gather(*(client(len(requests) * c // clients) for c in range(clients)))
    wall, cpu1 = time.monotonic() - t0, cpu_seconds(server_pid)
    return latencies, errors, wall, None if cpu0 is None or cpu1 is None else cpu1 - cpu0


async def _drive(port: int, phases: list[Phase], clients: int, duration: float, pid: int):
    return [await _phase(port, phase, clients, duration, pid) for phase in phases]


def load_process(port: int, phases: list[Phase], clients: int, duration: float, server_pid: int):
    # No collector pauses in the measuring process (a full collection of what it imported
    # takes tens of ms, which would be counted as server latency): the load makes no cycles.
    gc.collect()
    gc.disable()
    try:
        return asyncio.run(_drive(port, phases, clients, duration, server_pid))
    finally:
        gc.enable()
