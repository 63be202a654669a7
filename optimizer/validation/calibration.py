"""Calibration: a small correction of a latency model fitted from observed runs.

The correction prices a step as

    t = overhead_s + base(load) x (w x prefill_scale + (1 - w) x decode_scale)
        + kv_token_s x (KV tokens the step reads) + seq_s x (sequences in the step)

where `base` is the uncalibrated `StepLatency` and w the share of prefill
tokens in the step. The KV term (0 unless fitted on measured steps, see
`optimizer.validation.stepfit`) prices gathering a paged KV cache, which
per-op profiles of contiguous caches do not see; the per-sequence term (also
0 unless fitted on measured steps) prices the engine's work per request in a
step (batch rows, block tables, sampling), which per-op profiles do not see
either. `CalibratedStepLatency`
applies it and `CalibratedSource` wraps any `LatencySource`, so the simulator
and the search pick calibration up through the interface they already use.

`fit_calibration` finds the three parameters that make simulations of the
observed workloads reproduce the observed mean and p10-p90 of TTFT and TPOT (least
squares on log ratios; a coarse grid, then Nelder-Mead; each evaluation
simulates every case). When decode batch sizes vary little, the overhead and
the decode scale trade off against each other (only their sum at the typical
batch is pinned down); predictions stay right either way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from optimizer.config import ServingConfig
from optimizer.engines import DEFAULT_RELEASE, EngineRelease
from optimizer.latency.base import (
    LatencySource,
    StepLatency,
    StepLoad,
    TableReach,
    idle_step_time,
)
from optimizer.parallel import DENSE_LAYOUT, ExpertLayout
from optimizer.shapes import DEFAULT_PRECISION, Precision
from optimizer.sim import SLO, DecodeFloorError, simulate
from optimizer.validation.compare import Comparison, RequestOutcomes, ValidationError, compare
from optimizer.workload import Workload

_INVALID_LOSS = 1e6


@dataclass(frozen=True, slots=True)
class Calibration:
    """Per-step overhead (s) and efficiency scales for prefill and decode work."""

    overhead_s: float = 0.0
    prefill_scale: float = 1.0
    decode_scale: float = 1.0
    kv_token_s: float = 0.0  # per KV token read in the step (paged-KV gathering)
    seq_s: float = 0.0  # per sequence in the step (decoding sequences + prefill chunks)

    def __post_init__(self) -> None:
        for name in ("overhead_s", "kv_token_s", "seq_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValidationError(f"calibration {name} must be >= 0, got {v}")
        for name in ("prefill_scale", "decode_scale"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValidationError(f"calibration {name} must be > 0, got {v}")

    @property
    def is_identity(self) -> bool:
        return (
            self.overhead_s == 0
            and self.prefill_scale == 1
            and self.decode_scale == 1
            and self.kv_token_s == 0
            and self.seq_s == 0
        )


@dataclass(frozen=True, slots=True)
class CalibratedStepLatency:
    """A `StepLatency` with a `Calibration` applied (picklable when `base` is)."""

    base: StepLatency
    calibration: Calibration

    @property
    def is_estimate(self) -> bool:
        return self.base.is_estimate

    def step_time_s(self, load: StepLoad) -> float:
        return self._calibrated(self.base.step_time_s(load), load)

    def idle_step_time_s(self, load: StepLoad) -> float:
        return self._calibrated(idle_step_time(self.base)(load), load)

    def _calibrated(self, t: float, load: StepLoad) -> float:
        c = self.calibration
        prefill = sum(load.prefill_q)
        w = prefill / load.num_tokens if load.num_tokens > 0 else 0.0
        t = c.overhead_s + t * (w * c.prefill_scale + (1.0 - w) * c.decode_scale)
        if c.kv_token_s:
            t += c.kv_token_s * kv_tokens_read(load)
        if c.seq_s:
            t += c.seq_s * sequences_in(load)
        return t


def sequences_in(load: StepLoad) -> int:
    """Sequences a step works on: every decoding sequence and every prefill chunk."""
    return load.num_decode_seqs + len(load.prefill_q)


def kv_tokens_read(load: StepLoad) -> int:
    """KV tokens a step reads: every decoding sequence's and every prefill chunk's context."""
    return load.decode_kv_tokens + sum(load.prefill_kv)


@dataclass(frozen=True, slots=True)
class CalibratedSource:
    """A `LatencySource` applying a calibration per (accelerator, TP), or `default` to all."""

    base: LatencySource
    calibrations: dict[tuple[str, int], Calibration] = field(default_factory=dict)
    default: Calibration | None = None

    def for_instance(
        self,
        accelerator: str,
        tp: int,
        reach: TableReach | None = None,
        precision: Precision = DEFAULT_PRECISION,
        engine: EngineRelease = DEFAULT_RELEASE,
        layout: ExpertLayout = DENSE_LAYOUT,
    ) -> StepLatency:
        step = self.base.for_instance(accelerator, tp, reach, precision, engine, layout)
        cal = self.calibrations.get((accelerator.lower(), tp), self.default)
        if cal is None or cal.is_identity:
            return step
        return CalibratedStepLatency(step, cal)


@dataclass(frozen=True, slots=True)
class CalibrationCase:
    """One observed run: the workload, the deployment serving it, what was measured."""

    workload: Workload
    config: ServingConfig
    measured: RequestOutcomes
    name: str = ""


@dataclass(frozen=True, slots=True)
class CalibrationFit:
    calibration: Calibration
    loss_before: float
    loss_after: float
    num_evaluations: int
    outliers: tuple[str, ...] = ()  # cases left out of the fit (see `fit_calibration`)


def predict(
    case: CalibrationCase,
    latency: LatencySource,
    *,
    seed: int = 0,
    draft_latency: LatencySource | None = None,
) -> RequestOutcomes:
    result = simulate(case.workload, case.config, latency, seed=seed, draft_latency=draft_latency)
    return RequestOutcomes.of_simulation(result)


def evaluate(
    cases: Sequence[CalibrationCase],
    latency: LatencySource,
    slo: SLO,
    *,
    seed: int = 0,
    draft_latency: LatencySource | None = None,
) -> list[Comparison]:
    """Predicted against measured for every case."""
    return [
        compare(predict(c, latency, seed=seed, draft_latency=draft_latency), c.measured, slo)
        for c in cases
    ]


def _figures(o: RequestOutcomes) -> np.ndarray:
    """Mean and percentiles of TTFT and TPOT (smoother in the parameters than per request)."""
    ttft, tpot = o.ttft_s, o.tpot_s
    tpot = tpot[~np.isnan(tpot)]
    out = [np.nanmean(ttft), *np.nanpercentile(ttft, (50, 90))]
    out += [np.mean(tpot), *np.percentile(tpot, (10, 50, 90))] if tpot.size else [np.nan] * 4
    return np.asarray(out, dtype=np.float64)


def _loss(predicted: list[np.ndarray], measured: list[np.ndarray]) -> float:
    """Mean squared log ratio of the figures."""
    total, count = 0.0, 0
    for p, m in zip(predicted, measured, strict=True):
        ok = np.isfinite(p) & np.isfinite(m) & (p > 0) & (m > 0)
        total += float(np.sum(np.log(p[ok] / m[ok]) ** 2))
        count += int(ok.sum())
    return total / max(count, 1)


def fit_calibration(
    cases: Sequence[CalibrationCase],
    latency: LatencySource,
    *,
    seed: int = 0,
    draft_latency: LatencySource | None = None,
    max_evaluations: int = 200,
    outlier_factor: float = 4.0,
) -> CalibrationFit:
    """Fit one `Calibration` (shared by every case) to observed TTFT and TPOT.

    With three or more cases, a case whose own loss under the fitted correction
    exceeds `outlier_factor` x the median case loss (a run disturbed by other
    load, or a deployment the correction's form cannot describe) is flagged,
    left out and the fit repeated on the rest; `CalibrationFit.outliers` names
    them. `outlier_factor=0` keeps every case."""
    fit = _fit(cases, latency, seed, draft_latency, max_evaluations)
    if outlier_factor <= 0 or len(cases) < 3:
        return fit
    source = CalibratedSource(latency, default=fit.calibration)
    losses = []
    for c in cases:
        try:
            p = _figures(predict(c, source, seed=seed, draft_latency=draft_latency))
            losses.append(_loss([p], [_figures(c.measured)]))
        except DecodeFloorError:
            losses.append(_INVALID_LOSS)
    limit = outlier_factor * max(float(np.median(losses)), 1e-4)
    out = [i for i, x in enumerate(losses) if x > limit]
    if not out:
        return fit
    keep = [c for i, c in enumerate(cases) if i not in out]
    refit = _fit(keep, latency, seed, draft_latency, max_evaluations)
    names = tuple(cases[i].name or f"case {i}" for i in out)
    evals = fit.num_evaluations + refit.num_evaluations
    return CalibrationFit(refit.calibration, refit.loss_before, refit.loss_after, evals, names)


def _fit(
    cases: Sequence[CalibrationCase],
    latency: LatencySource,
    seed: int,
    draft_latency: LatencySource | None,
    max_evaluations: int,
) -> CalibrationFit:
    from scipy.optimize import minimize

    if not cases:
        raise ValidationError("calibration needs at least one observed run")
    measured = [_figures(c.measured) for c in cases]
    evaluations = [0]

    def loss_of(cal: Calibration) -> float:
        evaluations[0] += 1
        source = CalibratedSource(latency, default=cal)
        try:
            preds = [
                _figures(predict(c, source, seed=seed, draft_latency=draft_latency)) for c in cases
            ]
        except DecodeFloorError:  # a correction that beats the weight-bandwidth floor
            return _INVALID_LOSS
        return _loss(preds, measured)

    def unpack(x: np.ndarray) -> Calibration:
        return Calibration(abs(float(x[0])) * 1e-3, math.exp(x[1]), math.exp(x[2]))

    before = loss_of(Calibration())
    # A coarse grid first (the loss is piecewise: simulations are discrete), then Nelder-Mead.
    tpots = np.concatenate([c.measured.tpot_s[~np.isnan(c.measured.tpot_s)] for c in cases])
    unit_ms = float(np.median(tpots)) * 1e3 if tpots.size else 1.0
    scales = np.log([0.5, 0.7, 1.0, 1.4, 2.0])
    grid = [
        np.array([f * unit_ms, p, d]) for f in (0.0, 0.1, 0.25, 0.5) for p in scales for d in scales
    ]
    x0 = min(grid, key=lambda x: loss_of(unpack(x)))
    steps = np.array([max(0.1 * unit_ms, 1e-3), 0.15, 0.15])
    simplex = np.vstack([x0, x0 + np.diag(steps)])
    res = minimize(
        lambda x: loss_of(unpack(x)),
        x0,
        method="Nelder-Mead",
        options={
            "initial_simplex": simplex,
            "maxfev": max_evaluations,
            "xatol": 1e-4,
            "fatol": 1e-9,
        },
    )
    best = unpack(res.x)
    after = float(res.fun)
    if after > before:  # never return a correction that fits worse than none
        best, after = Calibration(), before
    return CalibrationFit(best, before, after, evaluations[0])
