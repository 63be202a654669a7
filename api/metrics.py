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
            for (method, route, status), n in sorted(self._requests.items()):
                lines.append(
                    f'servetune_http_requests_total{{method="{method}",route="{_label(route)}",'
                    f'status="{status}"}} {n}'
                )
            lines += [
                "# HELP servetune_http_request_duration_seconds Request latency by route.",
                "# TYPE servetune_http_request_duration_seconds histogram",
            ]
            for route, buckets in sorted(self._buckets.items()):
                r = _label(route)
                name = "servetune_http_request_duration_seconds_bucket"
                for bound, n in zip(BUCKETS_S, buckets, strict=True):
                    lines.append(f'{name}{{route="{r}",le="{bound}"}} {n}')
                lines.append(
                    f'servetune_http_request_duration_seconds_bucket{{route="{r}",le="+Inf"}} '
                    f"{self._count[route]}"
                )
                lines.append(
                    f'servetune_http_request_duration_seconds_sum{{route="{r}"}} '
                    f"{self._sum[route]:.6f}"
                )
                lines.append(
                    f'servetune_http_request_duration_seconds_count{{route="{r}"}} '
                    f"{self._count[route]}"
                )
        for name, series in gauges.items():
            lines.append(f"# TYPE {name} gauge")
            for labels, value in series.items():
                text = ",".join(f'{k}="{_label(v)}"' for k, v in labels)
                lines.append(f"{name}{{{text}}} {value:g}" if text else f"{name} {value:g}")
        return "\n".join(lines) + "\n"


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
