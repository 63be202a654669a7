"""A deployment's own calibration, fitted on one observed window and checked on a later one.

The correction is `optimizer.validation.Calibration` with the terms a deployment's
metrics pin down: a per-step engine overhead and scales of the step's priced prefill and
decode work (TTFT is mostly prefill, ITL mostly decode),

    t = overhead_s + base(load) x (w x prefill_scale + (1 - w) x decode_scale)

with w the step's share of prefill tokens.

Histograms hold no per-step timings, so the terms are fitted on the window's own figures:
the p50, p90 and mean of TTFT and of ITL. The window's traffic is rebuilt once (seeded,
as `observe` rebuilds it), simulated under each candidate correction and compared alike
(`optimizer.telemetry.compare`: quantiles read by bucket interpolation on both sides,
means exact on the observed side). Loss: the mean squared log ratio of the six figures,
plus a small ridge (`SPLIT_PENALTY` x log(prefill_scale / decode_scale)^2) that keeps the
two scales together unless the window says otherwise; a coarse grid (one common scale),
then Nelder-Mead over the three terms. A correction that fits worse than none is not kept.
A later window then checks it: the same figures, predicted with and without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from optimizer.config import ServingConfig
from optimizer.latency.base import LatencySource
from optimizer.sim import DecodeFloorError, SimulationError, simulate
from optimizer.telemetry.compare import ObservationReport, compare
from optimizer.telemetry.errors import TelemetryError
from optimizer.telemetry.reconstruct import reconstruct_workload
from optimizer.telemetry.vllm import ObservedWindow
from optimizer.validation import CalibratedSource, Calibration

FIGURES = ("ttft_p50", "ttft_p90", "ttft_mean", "itl_p50", "itl_p90", "itl_mean")
FIT_MAX_REQUESTS = 2_000  # requests replayed per evaluation (a busier window: the same rate)
_INVALID_LOSS = 1e6
SPLIT_PENALTY = 0.01  # per log(prefill_scale / decode_scale)^2, against the figures' loss


def figures(report: ObservationReport, side: str) -> dict[str, float]:
    """The fitted figures (s) of one side ("observed" or "predicted") of a report."""
    out = {}
    for name, c in (("ttft", report.ttft), ("itl", report.itl)):
        q = getattr(c, side)
        out[f"{name}_p50"], out[f"{name}_p90"] = q.p50, q.p90
        out[f"{name}_mean"] = getattr(c, f"{side}_mean_s")
    return out


def relative_errors(predicted: dict[str, float], observed: dict[str, float]) -> dict[str, float]:
    """predicted / observed - 1 per figure; NaN where either is missing or 0."""
    return {
        k: predicted[k] / observed[k] - 1.0
        if _usable(predicted[k]) and _usable(observed[k])
        else math.nan
        for k in FIGURES
    }


def _usable(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x > 0


def calibration_of(overhead_s: float, prefill_scale: float, decode_scale: float) -> Calibration:
    """The deployment correction as the simulator applies it."""
    return Calibration(
        overhead_s=overhead_s, prefill_scale=prefill_scale, decode_scale=decode_scale
    )


def calibrated(latency: LatencySource, calibration: Calibration | None) -> LatencySource:
    """`latency` with the correction applied to every instance (itself when none)."""
    if calibration is None or calibration.is_identity:
        return latency
    return CalibratedSource(latency, default=calibration)


@dataclass(frozen=True, slots=True)
class WindowFit:
    """The correction fitted on a window, and how its figures compare before and after."""

    overhead_s: float
    prefill_scale: float
    decode_scale: float
    observed: dict[str, float]
    before: dict[str, float]  # predicted without the correction
    after: dict[str, float]  # predicted with it
    loss_before: float
    loss_after: float
    num_evaluations: int

    @property
    def calibration(self) -> Calibration:
        return calibration_of(self.overhead_s, self.prefill_scale, self.decode_scale)

    def to_dict(self) -> dict[str, object]:
        return {
            "overhead_s": self.overhead_s,
            "prefill_scale": self.prefill_scale,
            "decode_scale": self.decode_scale,
            "observed": _clean(self.observed),
            "before": _clean(self.before),
            "after": _clean(self.after),
            "loss_before": self.loss_before,
            "loss_after": self.loss_after,
            "num_evaluations": self.num_evaluations,
        }


@dataclass(frozen=True, slots=True)
class WindowCheck:
    """A later window's figures predicted without and with a fitted correction."""

    observed: dict[str, float]
    before: dict[str, float]
    after: dict[str, float]

    @property
    def errors_before(self) -> dict[str, float]:
        return relative_errors(self.before, self.observed)

    @property
    def errors_after(self) -> dict[str, float]:
        return relative_errors(self.after, self.observed)

    def to_dict(self) -> dict[str, object]:
        return {
            "observed": _clean(self.observed),
            "before": _clean(self.before),
            "after": _clean(self.after),
        }


class _Window:
    """One window's traffic rebuilt once; `predict` simulates it under a correction."""

    def __init__(
        self,
        window: ObservedWindow,
        config: ServingConfig,
        latency: LatencySource,
        *,
        seed: int,
        max_model_len: int | None,
        max_requests: int,
    ) -> None:
        self.window, self.config, self.latency, self.seed = window, config, latency, seed
        self.workload = reconstruct_workload(
            window,
            seed=seed,
            max_model_len=max_model_len or config.max_model_len,
            max_requests=max_requests,
        )

    def predict(self, calibration: Calibration | None) -> ObservationReport:
        source = calibrated(self.latency, calibration)
        try:
            result = simulate(self.workload, self.config, source, seed=self.seed)
        except (SimulationError, LookupError, ValueError) as exc:
            raise TelemetryError(f"cannot simulate the window under its config: {exc}") from None
        return compare(self.window, self.workload, result)


def _loss(predicted: dict[str, float], observed: dict[str, float]) -> float:
    terms = [
        math.log(predicted[k] / observed[k]) ** 2
        for k in FIGURES
        if _usable(predicted[k]) and _usable(observed[k])
    ]
    return sum(terms) / len(terms) if terms else _INVALID_LOSS


def fit_window(
    window: ObservedWindow,
    config: ServingConfig,
    latency: LatencySource,
    *,
    seed: int = 0,
    max_model_len: int | None = None,
    max_evaluations: int = 80,
    max_requests: int = FIT_MAX_REQUESTS,
) -> WindowFit:
    """The overhead and scales that make the window's prediction match what it saw."""
    from scipy.optimize import minimize

    w = _Window(window, config, latency, seed=seed, max_model_len=max_model_len,
                max_requests=max_requests)  # fmt: skip
    observed = figures(w.predict(None), "observed")
    evaluations = [0]
    seen: dict[tuple[float, float, float], tuple[float, dict[str, float]]] = {}

    def unpack(x: np.ndarray) -> tuple[float, float, float]:
        p, d = (math.exp(float(np.clip(v, -3.0, 3.0))) for v in x[1:])
        return abs(float(x[0])) * 1e-3, p, d

    def evaluate(x: np.ndarray) -> float:
        key = unpack(x)
        if key not in seen:
            evaluations[0] += 1
            try:
                got = figures(w.predict(calibration_of(*key)), "predicted")
                split = SPLIT_PENALTY * math.log(key[1] / key[2]) ** 2
                seen[key] = (_loss(got, observed) + split, got)
            except (DecodeFloorError, TelemetryError):
                seen[key] = (_INVALID_LOSS, dict.fromkeys(FIGURES, math.nan))
        return seen[key][0]

    before_loss = evaluate(np.zeros(3))
    before = seen[(0.0, 1.0, 1.0)][1]
    unit_ms = observed["itl_mean"] * 1e3 if _usable(observed["itl_mean"]) else 1.0
    grid = [
        np.array([f * unit_ms, math.log(s), math.log(s)])
        for f in (0.0, 0.1, 0.25, 0.5)
        for s in (0.5, 0.7, 1.0, 1.4, 2.0)
    ]
    x0 = min(grid, key=evaluate)
    steps = np.array([max(0.1 * unit_ms, 1e-3), 0.15, 0.15])
    res = minimize(
        evaluate,
        x0,
        method="Nelder-Mead",
        options={
            "initial_simplex": np.vstack([x0, x0 + np.diag(steps)]),
            "maxfev": max(max_evaluations - len(grid) - 1, 1),
            "xatol": 1e-3,
            "fatol": 1e-7,
        },
    )
    best = unpack(res.x)
    after_loss, after = seen[best]
    if after_loss >= before_loss:  # never keep a correction that fits worse than none
        best, after_loss, after = (0.0, 1.0, 1.0), before_loss, before
    return WindowFit(*best, observed, before, after, before_loss, after_loss, evaluations[0])


def check_window(
    window: ObservedWindow,
    config: ServingConfig,
    latency: LatencySource,
    calibration: Calibration,
    *,
    seed: int = 0,
    max_model_len: int | None = None,
    max_requests: int = FIT_MAX_REQUESTS,
) -> WindowCheck:
    """A held-out window's figures predicted without and with `calibration`."""
    w = _Window(window, config, latency, seed=seed, max_model_len=max_model_len,
                max_requests=max_requests)  # fmt: skip
    plain = w.predict(None)
    return WindowCheck(
        figures(plain, "observed"),
        figures(plain, "predicted"),
        figures(w.predict(calibration), "predicted"),
    )


def _clean(d: dict[str, float]) -> dict[str, float | None]:
    return {k: (v if v is not None and math.isfinite(v) else None) for k, v in d.items()}
