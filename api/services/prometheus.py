"""A deployment's vLLM series over a window, read from a Prometheus server's HTTP API.

One instant query (`/api/v1/query` at the window's end) per series name the telemetry
reads (`optimizer.telemetry.vllm`): `increase(NAME{selector}[window])` for every
cumulative series (histogram `_bucket`, `_sum`, `_count`; counters' `_total`), and the
raw value for the gauges. `increase()` sees counter resets inside the window (a
restarted server) that two raw instants cannot; it extrapolates the first and last
samples in the window to its edges, so counts are fractional and within about one
scrape interval of the true ones. One query per name because range functions drop the
metric name, and a regex over names (`{__name__=~"vllm:.+"}`) would leave series of
different names with the same labels, which Prometheus refuses.

The answers are returned as an `Exposition`, the parsed form of a /metrics page, so
`optimizer.telemetry.read_vllm` reads them exactly as it reads a saved page. The core
does no network I/O; this module does it, with the stdlib (urllib).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from optimizer.telemetry import Exposition
from optimizer.telemetry import vllm as names
from optimizer.telemetry.exposition import MetricType, Sample

TIMEOUT_S = 10.0  # per HTTP request
LOOKBACK_S = 300  # Prometheus's default instant-query look-back (5 min)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(s|m|h|d)")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}

HISTOGRAMS = (
    names.TTFT, names.ITL, names.ITL_OLD, names.E2E, names.QUEUE, names.PROMPT_TOKENS,
    names.GENERATION_TOKENS,
)  # fmt: skip
COUNTERS = (
    names.REQUEST_SUCCESS, names.PROMPT_TOKENS_TOTAL, names.GENERATION_TOKENS_TOTAL,
    names.PREEMPTIONS, *names.PREFIX_QUERIES, *names.PREFIX_HITS,
)  # fmt: skip
GAUGES = (names.RUNNING, names.WAITING, *names.KV_USAGE)
REQUIRED = (names.TTFT, names.E2E, names.PROMPT_TOKENS, names.GENERATION_TOKENS)


class PrometheusError(RuntimeError):
    """Prometheus could not answer, refused a query, or holds no such series; the
    message is what users see."""


@dataclass(frozen=True, slots=True)
class PrometheusWindow:
    """The increases over the window (and gauges at its end) as one page's samples;
    `queries` and `answers` are the canonical JSON of what was asked and answered."""

    exposition: Exposition
    queries: str
    answers: str


def parse_window(text: str) -> float:
    """`30s`, `10m`, `1h`, `1d` (a number and one unit) as seconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(
            f"--window {text!r}: expected a positive duration such as 30s, 10m, 1h, 1d"
        )
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def parse_time(text: str | None, *, now: datetime | None = None) -> datetime:
    """RFC 3339 (`2026-12-01T16:00:00Z`; UTC if no offset), unix seconds, or None: now.
    A time after `now` is refused: Prometheus holds nothing there yet."""
    now = now or datetime.now(UTC)
    if text is None:
        return now
    try:
        at = datetime.fromtimestamp(float(text), UTC)
    except (ValueError, OverflowError, OSError):
        try:
            at = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"--at {text!r}: expected an RFC 3339 time (2026-12-01T16:00:00Z) or unix seconds"
            ) from None
        at = at if at.tzinfo else at.replace(tzinfo=UTC)
    if at > now:
        raise ValueError(f"--at {_show(at)} is in the future (now {_show(now)})")
    return at


def _show(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class _Client:
    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.log: list[tuple[str, float, object]] = []

    def query(self, promql: str, at: datetime) -> list[dict]:
        """An instant query's result (a vector, or a matrix for a range selector)."""
        ts = at.timestamp()
        body = urllib.parse.urlencode({"query": promql, "time": f"{ts:.3f}"}).encode()
        request = urllib.request.Request(f"{self.url}/api/v1/query", data=body, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:  # 400 bad query, 422 execution error, 503
            raw = exc.read()
            if not _error_text(raw):
                raise PrometheusError(
                    f"Prometheus at {self.url} answered HTTP {exc.code} to {promql}: is "
                    "that URL a Prometheus server's base URL?"
                ) from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusError(
                f"Prometheus at {self.url} is unreachable ({reason}; timeout "
                f"{self.timeout_s:g} s): is the deployment's prometheus_url right?"
            ) from None
        try:
            doc = json.loads(raw)
        except ValueError:
            raise PrometheusError(
                f"Prometheus at {self.url} answered {promql} with something not JSON: is "
                "that URL a Prometheus server's base URL?"
            ) from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            error = doc.get("error", doc) if isinstance(doc, dict) else doc
            raise PrometheusError(f"Prometheus at {self.url} refused {promql}: {error}")
        result = (doc.get("data") or {}).get("result")
        if not isinstance(result, list):
            raise PrometheusError(
                f"Prometheus at {self.url} answered {promql} without a data.result list"
            )
        self.log.append((promql, ts, result))
        return result


def _error_text(raw: bytes) -> str | None:
    try:
        return json.loads(raw).get("error")
    except (ValueError, AttributeError):
        return None


def read_window(
    url: str, selector: str, window_s: float, end: datetime, *, timeout_s: float = TIMEOUT_S
) -> PrometheusWindow:
    """The vLLM series matching `selector` over the `window_s` seconds up to `end`."""
    client = _Client(url, timeout_s)
    start = datetime.fromtimestamp(end.timestamp() - window_s, UTC)
    success = f"{names.REQUEST_SUCCESS}{selector}"

    def none_match(name: str, at: datetime) -> PrometheusError:
        return PrometheusError(
            f"no {name} series match {selector} at {_show(at)} (Prometheus at {client.url}): "
            "is the selector right and is Prometheus scraping the server?"
        )

    spell = _vllm_spelling(client, selector, end)
    if spell is None:
        raise none_match(names.REQUEST_SUCCESS, end)
    success = f"{spell(names.REQUEST_SUCCESS)}{selector}"
    if not client.query(success, start):
        held = client.query(f"{success}[{_ms(window_s)}]", end)
        oldest = min((float(v[0]) for s in held for v in s["values"]), default=end.timestamp())
        raise PrometheusError(
            f"the window {_show(start)} to {_show(end)} ({window_s:g} s) is longer than the "
            f"data Prometheus at {client.url} holds for {success}: its oldest sample in the "
            f"window is at {_show(datetime.fromtimestamp(oldest, UTC))}; choose a shorter "
            "--window or an earlier --at"
        )
    samples: list[Sample] = []
    types: list[tuple[str, MetricType]] = []

    def read(name: str, promql: str) -> bool:
        found = client.query(promql, end)
        samples.extend(_sample(name, s) for s in found)  # under vLLM's own name
        return bool(found)

    over = f"{selector}[{_ms(window_s)}])"  # closes increase(
    for family in HISTOGRAMS:
        parts = [
            read(family + s, f"increase({spell(family + s)}{over}")
            for s in ("_bucket", "_sum", "_count")
        ]
        if any(parts):
            types.append((family, MetricType.HISTOGRAM))
    for name in COUNTERS:
        if read(name, f"increase({spell(name)}{over}"):
            types.append((name.removesuffix("_total"), MetricType.COUNTER))
    found = {s.name for s in samples}
    wanted = [f"{f}_count" for f in REQUIRED] + [names.REQUEST_SUCCESS]
    if f"{names.ITL}_count" not in found and f"{names.ITL_OLD}_count" not in found:
        wanted.append(f"{names.ITL}_count (or {names.ITL_OLD}_count)")
    for name in wanted:
        if name not in found:
            raise PrometheusError(
                f"no increase of {name}{selector} over the window {_show(start)} to "
                f"{_show(end)} (Prometheus at {client.url}): is the selector right, is "
                "Prometheus scraping the server, and does the window span two scrapes?"
            )
    for name in GAUGES:
        if read(name, f"{spell(name)}{selector}"):
            types.append((name, MetricType.GAUGE))
    queries = json.dumps({"url": client.url, "selector": selector, "window_s": window_s,
                          "end": end.timestamp()}, sort_keys=True)  # fmt: skip
    answers = json.dumps(client.log, sort_keys=True)
    return PrometheusWindow(Exposition(tuple(samples), tuple(types)), queries, answers)


def _vllm_spelling(client: _Client, selector: str, end: datetime) -> Callable[[str], str] | None:
    """How Prometheus stores vLLM's names for this selector: as vLLM spells them
    (`vllm:...`), or with the colon escaped (`vllm_...`: prometheus_client 0.26 answering
    a Prometheus 2.x scrape in OpenMetrics escapes it, client_python issue 1177); None
    when neither matches."""
    if client.query(f"{names.REQUEST_SUCCESS}{selector}", end):
        return lambda name: name
    escaped = names.REQUEST_SUCCESS.replace("vllm:", "vllm_", 1)
    if client.query(f"{escaped}{selector}", end):
        return lambda name: name.replace("vllm:", "vllm_", 1)
    return None


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _sample(name: str, series: dict) -> Sample:
    labels = tuple(sorted((k, v) for k, v in series["metric"].items() if k != "__name__"))
    return Sample(name, labels, float(series["value"][1]))  # "NaN", "+Inf" parse as such
