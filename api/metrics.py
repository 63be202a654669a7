"""Prometheus text exposition, written by hand.

A few counters and one latency histogram kept per app (no process-global
registry, so several apps in one process, as in tests, never share state),
plus gauges read from the database at scrape time (jobs by status), which
are right across every API and worker process sharing the database.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from functools import lru_cache

from starlette.types import ASGIApp, Message, Receive, Scope, Send

BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self._buckets: dict[str, list[int]] = defaultdict(lambda: [0] * len(BUCKETS_S))
        self._sum: dict[str, float] = defaultdict(float)
        self._count: dict[str, int] = defaultdict(int)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self._requests[(method, route, status)] += 1
            buckets = self._buckets[route]
            for i, bound in enumerate(BUCKETS_S):
                if seconds <= bound:
                    buckets[i] += 1
            self._sum[route] += seconds
            self._count[route] += 1

    def render(self, gauges: dict[str, dict[tuple[tuple[str, str], ...], float]]) -> str:
        lines = [
            "# HELP servetune_http_requests_total HTTP requests by method, route and status.",
            "# TYPE servetune_http_requests_total counter",
        ]
        with self._lock:
            for labels, n in sorted(self._requests.items()):
                lines.append(f"{_request_series(*labels)} {n}")
            lines += [
                "# HELP servetune_http_request_duration_seconds Request latency by route.",
                "# TYPE servetune_http_request_duration_seconds histogram",
            ]
            for route, buckets in sorted(self._buckets.items()):
                *bounds, inf, total, count = _histogram_series(route)
                lines += [f"{series} {n}" for series, n in zip(bounds, buckets, strict=True)]
                lines.append(f"{inf} {self._count[route]}")
                lines.append(f"{total} {self._sum[route]:.6f}")
                lines.append(f"{count} {self._count[route]}")
        for name, series in gauges.items():
            lines.append(f"# TYPE {name} gauge")
            for labels, value in series.items():
                text = ",".join(f'{k}="{_label(v)}"' for k, v in labels)
                lines.append(f"{name}{{{text}}} {value:g}" if text else f"{name} {value:g}")
        return "\n".join(lines) + "\n"


# A series' name and labels, written once per series (a scrape writes ~400 of them).
@lru_cache(maxsize=4096)
def _request_series(method: str, route: str, status: int) -> str:
    return (
        f'servetune_http_requests_total{{method="{method}",route="{_label(route)}",'
        f'status="{status}"}}'
    )


@lru_cache(maxsize=1024)
def _histogram_series(route: str) -> tuple[str, ...]:
    """Each bucket's series, then the +Inf bucket's, the sum's and the count's."""
    r, name = _label(route), "servetune_http_request_duration_seconds"
    return (
        *(f'{name}_bucket{{route="{r}",le="{bound}"}}' for bound in BUCKETS_S),
        f'{name}_bucket{{route="{r}",le="+Inf"}}',
        f'{name}_sum{{route="{r}"}}',
        f'{name}_count{{route="{r}"}}',
    )


class MetricsMiddleware:
    """Times every HTTP request and labels it with its route template (not the raw path)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "(unmatched)"
            self.metrics.observe(scope["method"], template, status, time.perf_counter() - start)
