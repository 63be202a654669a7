"""/metrics' exposition text, checked line by line against a hand-written scrape."""

from __future__ import annotations

from api.metrics import Metrics


def test_a_scrape_is_exactly_the_prometheus_text_format() -> None:
    m = Metrics()
    m.observe("POST", "/x", 422, 0.001)
    m.observe("GET", '/a"b', 200, 0.02)
    m.observe("GET", '/a"b', 200, 3.0)
    h = "servetune_http_request_duration_seconds"
    a, x = 'route="/a\\"b"', 'route="/x"'
    a_counts = (0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 2)
    bounds = ("0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0")
    expected = [
        "# HELP servetune_http_requests_total HTTP requests by method, route and status.",
        "# TYPE servetune_http_requests_total counter",
        'servetune_http_requests_total{method="GET",route="/a\\"b",status="200"} 2',
        'servetune_http_requests_total{method="POST",route="/x",status="422"} 1',
        f"# HELP {h} Request latency by route.",
        f"# TYPE {h} histogram",
        *(f'{h}_bucket{{{a},le="{b}"}} {n}' for b, n in zip(bounds, a_counts, strict=True)),
        f'{h}_bucket{{{a},le="+Inf"}} 2',
        f"{h}_sum{{{a}}} 3.020000",
        f"{h}_count{{{a}}} 2",
        *(f'{h}_bucket{{{x},le="{b}"}} 1' for b in bounds),
        f'{h}_bucket{{{x},le="+Inf"}} 1',
        f"{h}_sum{{{x}}} 0.001000",
        f"{h}_count{{{x}}} 1",
        "# TYPE servetune_jobs gauge",
        'servetune_jobs{status="queued"} 3',
        "# TYPE servetune_up gauge",
        "servetune_up 1",
    ]
    gauges = {"servetune_jobs": {(("status", "queued"),): 3.0}, "servetune_up": {(): 1.0}}
    assert m.render(gauges).split("\n") == [*expected, ""]
