"""A trace cut into windows: per window its requests, rate and length mix.

Windows start at the trace's first arrival and are `window_s` long; the last one ends at
the last arrival. A remainder shorter than half a window joins the window before it (a
few seconds at the end would otherwise make a window whose rate is one request over
almost no time). A window with no request is kept: it needs no replica.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from optimizer.plan.errors import PlanError
from optimizer.workload import Workload


@dataclass(frozen=True, slots=True)
class PlanWindow:
    """Requests [first, stop) of the trace arrive in [start_s, end_s) (seconds from its
    first arrival; the last window also holds the request at its end)."""

    index: int
    start_s: float
    end_s: float
    first: int
    stop: int
    mean_input_tokens: float  # NaN without requests
    mean_output_tokens: float

    @property
    def num_requests(self) -> int:
        return self.stop - self.first

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def rate(self) -> float:
        """Requests per second over the window."""
        return self.num_requests / self.duration_s

    def label(self) -> str:
        """ "window 3 (00:45-01:00)": its index and its span in hours and minutes from the
        trace's start."""
        return f"window {self.index} ({_clock(self.start_s)}-{_clock(self.end_s)})"


def _clock(t_s: float) -> str:
    minutes = round(t_s / 60.0)
    days, rest = divmod(minutes, 24 * 60)
    text = f"{rest // 60:02d}:{rest % 60:02d}"
    return f"d{days + 1} {text}" if days else text


def cut_windows(workload: Workload, window_s: float) -> tuple[PlanWindow, ...]:
    """`workload` cut into windows of `window_s` seconds (see the module docstring).
    Raises `PlanError` when the window is longer than the trace or the trace is shorter
    than two windows."""
    if not (math.isfinite(window_s) and window_s > 0):
        raise PlanError(f"--window: expected a positive number of seconds, got {window_s!r}")
    arrival = workload.arrival_s - workload.arrival_s[0]
    span = float(arrival[-1])
    name = f"trace {workload.name!r}" if workload.name else "the trace"
    spans = f"its {len(workload):,} requests arrive over {span:,.0f} s"
    if window_s > span:
        raise PlanError(
            f"--window {window_s:g} s is longer than {name}: {spans}; expected a window of "
            f"at most half of that ({span / 2:,.0f} s) so the plan has two windows"
        )
    if span < 2 * window_s:
        raise PlanError(
            f"{name} is shorter than two windows of {window_s:g} s: {spans}; expected a trace "
            f"of at least {2 * window_s:,.0f} s, or a window of at most {span / 2:,.0f} s"
        )
    count = math.floor(span / window_s)
    if span - count * window_s >= window_s / 2:
        count += 1
    starts = np.arange(count, dtype=np.float64) * window_s
    ends = np.append(starts[1:], span)
    firsts = np.searchsorted(arrival, starts, side="left")
    stops = np.append(firsts[1:], len(workload))
    inp = np.concatenate(([0], np.cumsum(workload.input_tokens)))
    out = np.concatenate(([0], np.cumsum(workload.output_tokens)))
    windows = []
    for i in range(count):
        lo, hi = int(firsts[i]), int(stops[i])
        n = hi - lo
        windows.append(
            PlanWindow(
                index=i,
                start_s=float(starts[i]),
                end_s=float(ends[i]),
                first=lo,
                stop=hi,
                mean_input_tokens=float(inp[hi] - inp[lo]) / n if n else math.nan,
                mean_output_tokens=float(out[hi] - out[lo]) / n if n else math.nan,
            )
        )
    return tuple(windows)


def window_of(windows: tuple[PlanWindow, ...], num_requests: int) -> np.ndarray:
    """Each request's window index (requests in trace order)."""
    idx = np.empty(num_requests, dtype=np.int64)
    for w in windows:
        idx[w.first : w.stop] = w.index
    return idx
