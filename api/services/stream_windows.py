"""Rolling windows over trace streams and the drift test between two windows.

A stream's window is its uploads of the last `window_s` seconds. Its summary
combines the uploads' stored statistics: request-weighted means, and p90s as
the request-weighted mean of each upload's p90 (exact for one upload, an
approximation across several; good enough to notice a shift).

The mean rate is the window's requests over the time its uploads cover together.
Uploads keep arrival times relative to their first request, so an upload is placed
on the clock by its upload time: it covers the `duration_s` before `created_at`.
Overlapping spans (two uploads of the same hour, e.g. from two replicas' logs) are
merged, so they count once: their rate is (N + M) / 3600 s, not (N + M) / 7200 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from optimizer.records import TraceInfo
from optimizer.search import TuneRequest
from storage.service_records import WindowSummary
from storage.traces import get_trace, traces_in_window


class EmptyWindow(ValueError):
    """The stream has no uploads in the window, so there is nothing to tune on."""


@dataclass(frozen=True, slots=True)
class FigureChange:
    figure: str
    old: float
    new: float

    @property
    def relative(self) -> float:
        base = max(abs(self.old), 1e-9)
        return abs(self.new - self.old) / base

    def describe(self) -> str:
        sign = "+" if self.new >= self.old else "-"
        return f"{self.figure} {sign}{self.relative:.0%} ({self.old:,.3g} → {self.new:,.3g})"


DRIFT_FIGURES = ("mean_rate", "input_mean", "input_p90", "output_mean", "output_p90")


def covered_s(traces: list[TraceInfo]) -> float:
    """Seconds the uploads cover together: the union of their spans, each the `duration_s`
    before its upload time (overlapping spans merged, gaps not counted)."""
    origin = min(t.created_at for t in traces)
    ends = [(t.created_at - origin).total_seconds() for t in traces]
    spans = sorted((end - t.stats.duration_s, end) for t, end in zip(traces, ends, strict=True))
    total, reached = 0.0, -math.inf
    for start, end in spans:
        if end > reached:
            total += end - max(start, reached)
            reached = end
    return total


def summarize(traces: list[TraceInfo]) -> WindowSummary:
    if not traces:
        raise EmptyWindow("no uploads in the window")
    n = sum(t.stats.num_requests for t in traces)
    duration = covered_s(traces)

    def weighted(get) -> float:
        return sum(get(t) * t.stats.num_requests for t in traces) / n

    return WindowSummary(
        trace_ids=tuple(t.id for t in traces),
        num_requests=n,
        mean_rate=n / duration if duration > 0 else float(n),
        input_mean=weighted(lambda t: t.stats.input_tokens.mean),
        input_p90=weighted(lambda t: t.stats.input_tokens.p90),
        output_mean=weighted(lambda t: t.stats.output_tokens.mean),
        output_p90=weighted(lambda t: t.stats.output_tokens.p90),
    )


def resolve_window(
    session: Session, *, project: str, params: TuneRequest, now: datetime
) -> WindowSummary | None:
    """The workload a job over `params` tunes on, resolved now (EmptyWindow if none; None
    for a closed-loop benchmark, which is its parameters, not stored requests)."""
    if params.workload is not None:
        return None
    if params.trace_id is not None:
        return summarize([get_trace(session, params.trace_id, project=project)])
    since = now - timedelta(seconds=params.window_s)
    traces = traces_in_window(session, project=project, stream=params.stream or "", since=since)
    if not traces:
        raise EmptyWindow(
            f"stream {params.stream!r} has no uploads in the last {params.window_s:g} s; "
            "upload a trace with this stream name first"
        )
    return summarize(traces)


def drift(old: WindowSummary, new: WindowSummary) -> list[FigureChange]:
    """Every drift figure's change, largest relative change first."""
    changes = [FigureChange(f, getattr(old, f), getattr(new, f)) for f in DRIFT_FIGURES]
    return sorted(changes, key=lambda c: c.relative, reverse=True)
