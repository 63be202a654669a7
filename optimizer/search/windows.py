"""The stretches of a trace the search evaluates: the whole trace (verification), the
busiest window trials are screened on, and the peak rate fleets are sized for."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from optimizer.search.attainment import Attainment, Load
from optimizer.workload import Workload


@dataclass(frozen=True, slots=True)
class TraceWindow:
    """A stretch of the trace that was evaluated, for the summary."""

    num_requests: int
    start_s: float
    span_s: float
    mean_rate: float


@dataclass(frozen=True, slots=True)
class EvaluatedTrace:
    """What the search evaluated: the trace (verification), the screening window and the
    rate fleets are sized for."""

    trace: TraceWindow
    screened: TraceWindow
    peak_rate: float  # the busiest `peak_window_s` seconds
    peak_window_s: float
    headroom: float
    sizing_rate: float  # max(mean, peak) x headroom
    clients: int = 0  # a closed loop's clients (vllm bench serve --max-concurrency); 0: a trace
    # (window_s, req/s): the busiest rate over longer windows than `peak_window_s`
    peak_rates: tuple[tuple[float, float], ...] = ()

    def load_label(self, load: Load) -> str:
        """What traffic `load` means on this workload, for people."""
        if load is Load.TRACE:
            return "the trace's own rate"
        if load is Load.SIZING:
            extra = f" x headroom {self.headroom:g}" if self.headroom != 1 else ""
            return f"its busiest {self.peak_window_s:g} s{extra}, the sizing rate"
        if load is Load.CLIENTS:
            return "served to the benchmark's clients"
        return "one unit on the screening window"

    def attainment_text(self, att: Attainment) -> str:
        """`att` as one figure with its traffic: "86.7% at 12.05 req/s (its busiest 60 s,
        the sizing rate)"."""
        return f"{att.share:.1%} at {att.rate:,.2f} req/s ({self.load_label(att.load)})"

    def describe(self) -> str:
        t, s = self.trace, self.screened
        if self.clients:
            screened = (
                "trials on every prompt"
                if s.num_requests == t.num_requests
                else f"trials screened on its first {s.num_requests:,} prompts"
            )
            return (
                f"closed loop: {self.clients:,} clients sending {t.num_requests:,} prompts, each "
                f"client its next when its previous one ends; fleets sized for the clients and "
                f"verified on every prompt; {screened}"
            )
        whole = s.num_requests == t.num_requests
        screened = (
            "trials on the whole trace"
            if whole
            else f"trials screened on its busiest {s.num_requests:,} consecutive requests "
            f"({s.start_s:,.0f}-{s.start_s + s.span_s:,.0f} s, {s.mean_rate:.2f} req/s)"
        )
        return (
            f"trace: {t.num_requests:,} requests over {t.span_s:,.0f} s, {t.mean_rate:.2f} req/s "
            f"mean, {self.peak_rate:.2f} req/s in its busiest {self.peak_window_s:g} s; fleets "
            f"sized for {self.sizing_rate:.2f} req/s (peak x headroom {self.headroom:g}) and "
            f"verified on the whole trace; {screened}"
        )


def peak_rate(arrival_s: np.ndarray, window_s: float) -> float:
    """The most requests arriving in any `window_s` seconds, per second (over the span
    when the trace is shorter than the window)."""
    n = arrival_s.shape[0]
    span = float(arrival_s[-1] - arrival_s[0]) if n > 1 else 0.0
    if n < 2 or span <= 0:
        return math.inf if n > 1 else 0.0
    width = min(window_s, span)
    ends = np.searchsorted(arrival_s, arrival_s + width, side="left")
    return float((ends - np.arange(n)).max()) / width


WHAT_IF_WINDOWS_S = (300.0, 900.0, 3600.0)


def longer_peak_rates(arrival_s: np.ndarray, window_s: float) -> tuple[tuple[float, float], ...]:
    """The busiest rate over each of `WHAT_IF_WINDOWS_S` longer than `window_s` and shorter
    than the trace's span, for the answer's what-ifs."""
    n = arrival_s.shape[0]
    span = float(arrival_s[-1] - arrival_s[0]) if n > 1 else 0.0
    return tuple((w, peak_rate(arrival_s, w)) for w in WHAT_IF_WINDOWS_S if window_s < w < span)


def busiest_start(arrival_s: np.ndarray, num_requests: int) -> int | None:
    """Where the `num_requests` consecutive requests with the shortest span start (None:
    the trace is not longer than that, or `num_requests` is 0)."""
    n = arrival_s.shape[0]
    if num_requests <= 0 or num_requests >= n:
        return None
    spans = arrival_s[num_requests - 1 :] - arrival_s[: n - num_requests + 1]
    return int(np.argmin(spans))


def trace_window(workload: Workload, start_s: float) -> TraceWindow:
    span = workload.duration_s
    return TraceWindow(len(workload), start_s, span, workload.mean_rate if span > 0 else 0.0)
