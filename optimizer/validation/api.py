"""Entry points the CLI and the REST service call (no storage, no torch)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import numpy as np

from optimizer.config import ServingConfig
from optimizer.latency.base import LatencySource
from optimizer.sim import SLO, simulate
from optimizer.validation.calibration import CalibratedSource, Calibration
from optimizer.validation.compare import Comparison, RequestOutcomes, compare, default_slo
from optimizer.validation.observations import Observation
from optimizer.workload import Workload


def compare_observation(
    observation: Observation,
    config: ServingConfig,
    latency: LatencySource,
    *,
    slo: SLO | None = None,
    seed: int = 0,
    draft_latency: LatencySource | None = None,
) -> Comparison:
    """Simulate the observed workload on `config` and compare with what was measured.

    Without an `slo`, goodput is judged against 2x the measured median TTFT/TPOT.
    """
    result = simulate(observation.workload, config, latency, seed=seed, draft_latency=draft_latency)
    slo = slo or default_slo(observation.outcomes)
    return compare(RequestOutcomes.of_simulation(result), observation.outcomes, slo)


def observation_from_arrays(
    name: str,
    arrays: Mapping[str, np.ndarray],
    *,
    summary: Mapping[str, float] | None = None,
    num_failed: int = 0,
) -> Observation:
    """Rebuild an `Observation` from stored per-request arrays
    (arrival_s, input_tokens, output_tokens, ttft_s, e2e_s)."""
    outcomes = RequestOutcomes(
        np.asarray(arrays["arrival_s"], dtype=np.float64),
        np.asarray(arrays["input_tokens"], dtype=np.int64),
        np.asarray(arrays["output_tokens"], dtype=np.int64),
        np.asarray(arrays["ttft_s"], dtype=np.float64),
        np.asarray(arrays["e2e_s"], dtype=np.float64),
    )
    workload = Workload(
        outcomes.arrival_s, outcomes.input_tokens, outcomes.output_tokens, name=name
    )
    return Observation(name, workload, outcomes, dict(summary or {}), num_failed)


def observation_arrays(observation: Observation) -> dict[str, np.ndarray]:
    o = observation.outcomes
    return {
        "arrival_s": o.arrival_s,
        "input_tokens": o.input_tokens,
        "output_tokens": o.output_tokens,
        "ttft_s": o.ttft_s,
        "e2e_s": o.e2e_s,
    }


class CalibrationLike(Protocol):
    accelerator: str
    tp: int
    overhead_s: float
    prefill_scale: float
    decode_scale: float


def _detail(stored: CalibrationLike, name: str) -> float:
    """A term engine self-calibrations store in `details` (kv_token_s, seq_s); 0 if absent."""
    details = getattr(stored, "details", None) or {}
    return float(details.get(name, 0.0))


def calibrated_source(base: LatencySource, stored: Iterable[CalibrationLike]) -> LatencySource:
    """Wrap `base` with stored calibrations (one per accelerator and TP); `base` if none."""
    cals = {
        (c.accelerator.lower(), c.tp): Calibration(
            c.overhead_s,
            c.prefill_scale,
            c.decode_scale,
            _detail(c, "kv_token_s"),
            _detail(c, "seq_s"),
        )
        for c in stored
    }
    return CalibratedSource(base, cals) if cals else base
