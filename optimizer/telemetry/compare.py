"""Observed against predicted: a window's histograms beside a simulation of it.

Latency quantiles are compared alike: the simulated per-request values (per-token gaps
for ITL) are binned into the observed histogram's own buckets, and both histograms
are read by the same interpolation (`Histogram.quantile`). A simulated p99 is then as
coarse as the observed one, and a bucket-boundary effect shows on both sides.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from optimizer.sim import SimulationResult
from optimizer.telemetry.histogram import Histogram
from optimizer.telemetry.reconstruct import scale_to_window
from optimizer.telemetry.vllm import E2E, TTFT, ObservedWindow
from optimizer.workload import Workload

QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True, slots=True)
class Quantiles:
    """p50 / p90 / p99 in seconds, read from a histogram by bucket interpolation."""

    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, histogram: Histogram) -> Quantiles:
        return cls(*(histogram.quantile(q) for q in QUANTILES))


@dataclass(frozen=True, slots=True)
class LatencyComparison:
    """One latency metric (`metric` the vLLM histogram read), observed and predicted."""

    metric: str
    observed: Quantiles
    predicted: Quantiles
    observed_mean_s: float  # the histogram's _sum / _count (exact, not interpolated)
    predicted_mean_s: float


@dataclass(frozen=True, slots=True)
class Figure:
    """A scalar observed and predicted; None where the page or the simulation has none."""

    observed: float | None
    predicted: float | None


@dataclass(frozen=True, slots=True)
class ObservationReport:
    """The window (length in s, requests finished) and how the simulation compares."""

    window_s: float
    num_requests: int
    num_simulated: int  # requests replayed (capped; counts below are scaled to the window)
    request_rate: float  # finished requests per second
    ttft: LatencyComparison
    itl: LatencyComparison
    e2e: LatencyComparison
    queue_mean_s: Figure
    kv_cache_usage: Figure  # fraction: the AFTER gauge vs the simulated mean over the window
    num_preemptions: Figure  # in the window
    mean_prompt_tokens: Figure  # exact (_sum/_count) vs the reconstructed workload's mean
    mean_output_tokens: Figure
    num_rejected: int  # reconstructed requests the config could not hold
    prefix_cache_hit_ratio: float | None  # observed only (histograms carry no prefixes)
    num_requests_running: float | None  # observed gauges at AFTER
    num_requests_waiting: float | None

    def to_dict(self) -> dict:
        """JSON-ready (NaN as None)."""
        return _clean(asdict(self))


def compare(
    window: ObservedWindow, workload: Workload, result: SimulationResult
) -> ObservationReport:
    """How `result` (a simulation of `workload`, rebuilt from `window`) compares."""
    itl_pred = Histogram.of(result.itl_gaps_s, window.itl.upper_bounds, result.itl_gap_weights)
    queue_obs = window.queue.mean if window.queue is not None else None
    preempt_pred = scale_to_window(float(result.num_preemptions.sum()), window, workload)
    return ObservationReport(
        window_s=window.window_s,
        num_requests=window.num_requests,
        num_simulated=workload.num_requests,
        request_rate=window.request_rate,
        ttft=_latency(TTFT, window.ttft, result.ttft_s),
        itl=LatencyComparison(
            window.itl_name,
            Quantiles.of(window.itl),
            Quantiles.of(itl_pred),
            window.itl.mean,
            itl_pred.mean,
        ),
        e2e=_latency(E2E, window.e2e, result.e2e_s),
        queue_mean_s=Figure(queue_obs, _nanmean(result.queueing_s)),
        kv_cache_usage=Figure(window.kv_cache_usage, _kv_usage(result, workload)),
        num_preemptions=Figure(window.num_preemptions, preempt_pred),
        mean_prompt_tokens=Figure(window.prompt_tokens.mean, float(workload.input_tokens.mean())),
        mean_output_tokens=Figure(
            window.generation_tokens.mean, float(workload.output_tokens.mean())
        ),
        num_rejected=result.num_rejected,
        prefix_cache_hit_ratio=window.prefix_cache_hit_ratio,
        num_requests_running=window.num_requests_running,
        num_requests_waiting=window.num_requests_waiting,
    )


def _latency(metric: str, observed: Histogram, values: np.ndarray) -> LatencyComparison:
    predicted = Histogram.of(values, observed.upper_bounds)
    return LatencyComparison(
        metric, Quantiles.of(observed), Quantiles.of(predicted), observed.mean, predicted.mean
    )


def _nanmean(values: np.ndarray) -> float | None:
    kept = values[~np.isnan(values)]
    return float(kept.mean()) if kept.size else None


def _kv_usage(result: SimulationResult, workload: Workload) -> float | None:
    """The simulated KV-cache usage (fraction of blocks), averaged over the instances and
    over the time the reconstructed arrivals span (the drain after the last is left out)."""
    end = float(workload.arrival_s[-1])
    means = []
    for inst in result.instances:
        inside = inst.series_t_s <= end
        if np.any(inside):
            means.append(float(np.mean(inst.series_kv_utilization[inside])))
    return float(np.mean(means)) if means else None


def _clean(value: object) -> object:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value
