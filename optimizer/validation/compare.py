"""Predicted against measured: per-request outcomes, summaries and their errors.

`RequestOutcomes` holds what a run measured per request (from the reference
engine, an imported `vllm bench serve` result, or a simulation).
`summarize` reduces it to the figures users compare (mean/p50/p90/p99 TTFT
and TPOT, goodput under an SLO); `compare` pairs a prediction with a
measurement and gives each figure's relative error. Percentiles are
nearest-rank, as the simulator reports them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from optimizer.sim.metrics import SLO, Percentiles, SimulationResult


class ValidationError(ValueError):
    """Inputs to a validation that cannot be compared."""


class Metric(StrEnum):
    MEAN_TTFT = "mean_ttft_s"
    P50_TTFT = "p50_ttft_s"
    P90_TTFT = "p90_ttft_s"
    P99_TTFT = "p99_ttft_s"
    MEAN_TPOT = "mean_tpot_s"
    P50_TPOT = "p50_tpot_s"
    P90_TPOT = "p90_tpot_s"
    P99_TPOT = "p99_tpot_s"
    GOODPUT = "goodput_rps"
    ATTAINMENT = "slo_attainment"


@dataclass(frozen=True, slots=True)
class RequestOutcomes:
    """Per-request results of one run (seconds; TPOT nan for 1-token outputs)."""

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    ttft_s: np.ndarray
    e2e_s: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("input_tokens", "output_tokens", "ttft_s", "e2e_s"):
            if len(getattr(self, name)) != n:
                raise ValidationError(f"outcomes.{name}: {len(getattr(self, name))} values for {n}")
        if n == 0:
            raise ValidationError("outcomes: no requests")

    @property
    def num_requests(self) -> int:
        return len(self.arrival_s)

    @property
    def tpot_s(self) -> np.ndarray:
        out = self.output_tokens
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(out > 1, (self.e2e_s - self.ttft_s) / np.maximum(out - 1, 1), np.nan)

    @property
    def makespan_s(self) -> float:
        finish = self.arrival_s + self.e2e_s
        return float(np.nanmax(finish) - np.min(self.arrival_s))

    @classmethod
    def of_simulation(cls, result: SimulationResult) -> RequestOutcomes:
        return cls(
            result.arrival_s - result.arrival_s.min(),
            result.input_tokens,
            result.output_tokens,
            result.ttft_s,
            result.e2e_s,
        )


@dataclass(frozen=True, slots=True)
class Summary:
    """The figures compared between prediction and measurement."""

    num_requests: int
    ttft: Percentiles
    tpot: Percentiles
    goodput_rps: float  # requests meeting the SLO per second (first arrival to last finish)
    slo_attainment: float
    makespan_s: float

    def value(self, metric: Metric) -> float:
        p = self.ttft if "ttft" in metric.value else self.tpot
        match metric:
            case Metric.GOODPUT:
                return self.goodput_rps
            case Metric.ATTAINMENT:
                return self.slo_attainment
            case Metric.MEAN_TTFT | Metric.MEAN_TPOT:
                return p.mean
            case Metric.P50_TTFT | Metric.P50_TPOT:
                return p.p50
            case Metric.P90_TTFT | Metric.P90_TPOT:
                return p.p90
            case _:
                return p.p99


def summarize(outcomes: RequestOutcomes, slo: SLO) -> Summary:
    ttft, tpot = outcomes.ttft_s, outcomes.tpot_s
    ok = (ttft <= slo.ttft_s) & (np.isnan(tpot) | (tpot <= slo.tpot_s))
    if slo.e2e_s is not None:
        ok &= outcomes.e2e_s <= slo.e2e_s
    span = outcomes.makespan_s
    return Summary(
        num_requests=outcomes.num_requests,
        ttft=Percentiles.of(ttft),
        tpot=Percentiles.of(tpot),
        goodput_rps=float(ok.sum()) / span if span > 0 else math.inf,
        slo_attainment=float(ok.mean()),
        makespan_s=span,
    )


@dataclass(frozen=True, slots=True)
class MetricError:
    metric: Metric
    predicted: float
    measured: float

    @property
    def relative_error(self) -> float:
        """(predicted - measured) / measured; nan when the measurement is 0 or missing."""
        if not math.isfinite(self.measured) or self.measured == 0:
            return math.nan
        return (self.predicted - self.measured) / self.measured


@dataclass(frozen=True, slots=True)
class Comparison:
    """A prediction against a measurement of the same workload on the same config."""

    predicted: Summary
    measured: Summary
    slo: SLO
    errors: tuple[MetricError, ...]

    def error(self, metric: Metric) -> float:
        return next(e.relative_error for e in self.errors if e.metric is metric)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready figures (for storage and the API)."""
        return {
            "slo": {"ttft_s": self.slo.ttft_s, "tpot_s": self.slo.tpot_s, "e2e_s": self.slo.e2e_s},
            "num_requests": self.measured.num_requests,
            "metrics": [
                {
                    "metric": e.metric.value,
                    "predicted": _finite(e.predicted),
                    "measured": _finite(e.measured),
                    "relative_error": _finite(e.relative_error),
                }
                for e in self.errors
            ],
        }


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def compare(predicted: RequestOutcomes, measured: RequestOutcomes, slo: SLO) -> Comparison:
    if predicted.num_requests != measured.num_requests:
        raise ValidationError(
            f"prediction has {predicted.num_requests} requests, measurement "
            f"{measured.num_requests}: they must describe the same workload"
        )
    p, m = summarize(predicted, slo), summarize(measured, slo)
    errors = tuple(MetricError(k, p.value(k), m.value(k)) for k in Metric)
    return Comparison(p, m, slo, errors)


def default_slo(measured: RequestOutcomes, *, ttft_factor: float = 2.0) -> SLO:
    """An SLO that a run can meet or miss: 2x the measured median TTFT and TPOT."""
    ttft = float(np.nanmedian(measured.ttft_s))
    tpot = measured.tpot_s
    tpot_med = float(np.nanmedian(tpot)) if np.any(~np.isnan(tpot)) else 1.0
    return SLO(ttft_s=max(ttft * ttft_factor, 1e-6), tpot_s=max(tpot_med * ttft_factor, 1e-6))
