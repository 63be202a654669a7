"""A window of a vLLM server's metrics against the prediction for its config: two
scrapes read, the window's traffic rebuilt and simulated, observed against predicted.
`servetune observe` and POST /v1/deployments/{id}/observations both run it. The two
scrapes are saved pages (`read_scrape`) or a deployment's Prometheus server
(`read_prometheus`: the window's increases as AFTER against a zero BEFORE, so the
window is built by the same `observed_window`).

Errors: a scrape or window the telemetry refuses raises its `TelemetryError`; a config
that cannot run the rebuilt traffic raises `ObserveError`. Both carry the message
users see.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from api.services.prometheus import read_window
from optimizer.config import ServingConfig
from optimizer.latency.base import LatencySource
from optimizer.sim import SimulationError, SimulationResult, simulate
from optimizer.telemetry import (
    EmptyWindowError,
    Histogram,
    ObservationReport,
    ObservedWindow,
    VllmScrape,
    compare,
    observed_window,
    parse_exposition,
    read_vllm,
    reconstruct_workload,
)
from optimizer.telemetry.vllm import REQUEST_SUCCESS
from storage.deployments import save_observation
from storage.service_records import DeploymentObservation


class ObserveError(ValueError):
    """The config cannot simulate the window's rebuilt traffic."""


@dataclass(frozen=True, slots=True)
class Scrape:
    """One saved /metrics page, read; `sha256` of its text."""

    metrics: VllmScrape
    sha256: str


@dataclass(frozen=True, slots=True)
class Observed:
    report: ObservationReport
    result: SimulationResult
    window: ObservedWindow  # what the report was read from (stored for calibrations)
    latency: str  # what priced the prediction
    priced_as: str  # the engine release (`ServingConfig.engine_release.label`)
    before_sha256: str
    after_sha256: str

    def document(self) -> dict[str, Any]:
        """The report as stored and as `servetune observe --json` prints it."""
        return self.report.to_dict() | {"latency": self.latency, "priced_as": self.priced_as}


def read_scrape(text: str, which: str, filename: str, *, model_name: str | None = None) -> Scrape:
    """`which` is BEFORE or AFTER; messages name it and `filename`."""
    exposition = parse_exposition(text, source=f"{which} ({filename})")
    metrics = read_vllm(exposition, source=which, model_name=model_name)
    return Scrape(metrics, hashlib.sha256(text.encode("utf-8")).hexdigest())


def read_prometheus(
    url: str, selector: str, window_s: float, end: datetime, *, model_name: str | None = None
) -> tuple[Scrape, Scrape]:
    """The window up to `end` from Prometheus, as (BEFORE, AFTER): AFTER holds each
    cumulative series' `increase()` over the window and the gauges at `end`, BEFORE the
    same series at zero. `sha256`s: of what was asked (BEFORE) and what was answered.
    Raises `PrometheusError` (unreachable, a refused query, no series) or the telemetry's
    `TelemetryError`."""
    window = read_window(url, selector, window_s, end)
    metrics = read_vllm(window.exposition, source=f"Prometheus {selector}", model_name=model_name)
    if round(metrics.num_requests_success) <= 0:
        raise EmptyWindowError(
            f"no request finished in the window (the increase of {REQUEST_SUCCESS}{selector} "
            f"over {window_s:g} s to {end.isoformat(timespec='seconds')} is "
            f"{metrics.num_requests_success:g}); choose a window with traffic"
        )

    def zero(h: Histogram | None) -> Histogram | None:
        return None if h is None else Histogram(h.upper_bounds, (0.0,) * len(h.cumulative), 0, 0)

    def zero_count(value: float | None) -> float | None:
        return None if value is None else 0.0

    before = replace(
        metrics, ttft=zero(metrics.ttft), itl=zero(metrics.itl), e2e=zero(metrics.e2e),
        prompt_tokens=zero(metrics.prompt_tokens), queue=zero(metrics.queue),
        generation_tokens=zero(metrics.generation_tokens), num_requests_success=0.0,
        num_prompt_tokens=zero_count(metrics.num_prompt_tokens),
        num_generation_tokens=zero_count(metrics.num_generation_tokens),
        num_preemptions=zero_count(metrics.num_preemptions),
        prefix_cache_queries=zero_count(metrics.prefix_cache_queries),
        prefix_cache_hits=zero_count(metrics.prefix_cache_hits),
    )  # fmt: skip

    def sha(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    return Scrape(before, sha(window.queries)), Scrape(metrics, sha(window.answers))


def observe(
    before: Scrape,
    after: Scrape,
    window_s: float,
    config: ServingConfig,
    latency: LatencySource,
    latency_label: str,
    *,
    max_model_len: int | None = None,
    seed: int = 0,
) -> Observed:
    """The window between the scrapes, rebuilt and simulated under `config`."""
    window = observed_window(before.metrics, after.metrics, window_s)
    workload = reconstruct_workload(
        window, seed=seed, max_model_len=max_model_len or config.max_model_len
    )
    try:
        result = simulate(workload, config, latency, seed=seed)
    except (SimulationError, LookupError, ValueError) as exc:
        raise ObserveError(str(exc)) from None
    return Observed(
        report=compare(window, workload, result),
        result=result,
        window=window,
        latency=latency_label,
        priced_as=config.engine_release.label,
        before_sha256=before.sha256,
        after_sha256=after.sha256,
    )


def store(
    session: Session,
    deployment_id: int,
    observed: Observed,
    *,
    calibration_id: int | None = None,
    project: str | None = None,
) -> DeploymentObservation:
    """Save the observation for the deployment (its own project's, when `project`);
    `calibration_id`: the deployment calibration that priced it."""
    return save_observation(
        session, deployment_id, report=observed.report.to_dict(), latency=observed.latency,
        priced_as=observed.priced_as, before_sha256=observed.before_sha256,
        after_sha256=observed.after_sha256, window=observed.window,
        calibration_id=calibration_id, project=project,
    )  # fmt: skip
