"""A window of a vLLM server's metrics against the prediction for its config: two
scrapes read, the window's traffic rebuilt and simulated, observed against predicted.
`servetune observe` and POST /v1/deployments/{id}/observations both run it.

Errors: a scrape or window the telemetry refuses raises its `TelemetryError`; a config
that cannot run the rebuilt traffic raises `ObserveError`. Both carry the message
users see.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from optimizer.config import ServingConfig
from optimizer.latency.base import LatencySource
from optimizer.sim import SimulationError, SimulationResult, simulate
from optimizer.telemetry import (
    ObservationReport,
    VllmScrape,
    compare,
    observed_window,
    parse_exposition,
    read_vllm,
    reconstruct_workload,
)
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
        latency=latency_label,
        priced_as=config.engine_release.label,
        before_sha256=before.sha256,
        after_sha256=after.sha256,
    )


def store(
    session: Session, deployment_id: int, observed: Observed, *, project: str | None = None
) -> DeploymentObservation:
    """Save the observation for the deployment (its own project's, when `project`)."""
    return save_observation(
        session, deployment_id, report=observed.report.to_dict(), latency=observed.latency,
        priced_as=observed.priced_as, before_sha256=observed.before_sha256,
        after_sha256=observed.after_sha256, project=project,
    )  # fmt: skip
