"""Calibration from measured step costs (not from the runs being evaluated).

`fit_step_calibration` fits a `Calibration` so that the calibrated step price

    t = overhead_s + base(load) x (w x prefill_scale + (1 - w) x decode_scale)
        + kv_token_s x (KV tokens read) + seq_s x (sequences in the step)

matches steps whose cost was measured directly (e.g. the reference engine on
synthetic batches, `profiler.reference_engine.selfcal`). The model is linear in its
five parameters, so the fit is a non-negative least squares on relative
errors; steps whose residual lies more than `outlier_mads` median absolute
deviations from the median (a step another process disturbed) are dropped
and the fit repeated. A phase with too few steps keeps the scale 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from optimizer.latency.base import StepLatency, StepLoad
from optimizer.validation.calibration import Calibration, kv_tokens_read, sequences_in
from optimizer.validation.compare import ValidationError

_MIN_PHASE_WEIGHT = 2.0  # summed phase share needed to fit that phase's scale
_MIN_SCALE = 0.05


@dataclass(frozen=True, slots=True)
class StepObservation:
    load: StepLoad
    seconds: float


@dataclass(frozen=True, slots=True)
class StepFit:
    """The fitted calibration and how well it prices the measured steps."""

    calibration: Calibration
    num_steps: int
    num_outliers: int
    median_error_before: float  # median |predicted / measured - 1| uncalibrated
    median_error_after: float


def _prefill_share(load: StepLoad) -> float:
    return sum(load.prefill_q) / load.num_tokens if load.num_tokens > 0 else 0.0


def _solve(a: np.ndarray, free: np.ndarray) -> np.ndarray:
    """Non-negative least squares of a @ x ~ 1 over the free columns (others at their
    neutral value: scales 1, additive terms 0)."""
    from scipy.optimize import nnls

    fixed = np.array([0.0, 1.0, 1.0, 0.0, 0.0])
    rhs = np.ones(len(a)) - a[:, ~free] @ fixed[~free]
    x, _ = nnls(a[:, free], rhs)
    out = fixed.copy()
    out[free] = x
    return out


def fit_step_calibration(
    step: StepLatency,
    observations: Sequence[StepObservation],
    *,
    outlier_mads: float = 5.0,
    kv_term: bool = True,
    seq_term: bool = True,
) -> StepFit:
    """Per-step overhead and phase scales from measured steps (see module doc)."""
    obs = [o for o in observations if o.seconds > 0 and o.load.num_tokens > 0]
    if len(obs) < 3:
        raise ValidationError(f"step calibration needs >= 3 measured steps, got {len(obs)}")
    t = np.array([o.seconds for o in obs])
    base = np.array([step.step_time_s(o.load) for o in obs])
    w = np.array([_prefill_share(o.load) for o in obs])
    # Relative errors: each row divided by its measured time.
    kv = np.array([kv_tokens_read(o.load) for o in obs], dtype=np.float64)
    seqs = np.array([sequences_in(o.load) for o in obs], dtype=np.float64)
    a = np.column_stack([np.ones_like(t), base * w, base * (1 - w), kv, seqs]) / t[:, None]
    free = np.array(
        [
            True,
            w.sum() >= _MIN_PHASE_WEIGHT,
            (1 - w).sum() >= _MIN_PHASE_WEIGHT,
            kv_term,
            seq_term,
        ]
    )
    keep = np.ones(len(t), dtype=bool)
    x = _solve(a, free)
    for _ in range(3):
        resid = a @ x - 1.0
        med = float(np.median(resid[keep]))
        mad = float(np.median(np.abs(resid[keep] - med))) or 1e-9
        new_keep = np.abs(resid - med) <= outlier_mads * 1.4826 * mad
        if new_keep.sum() < 3 or np.array_equal(new_keep, keep):
            break
        keep = new_keep
        x = _solve(a[keep], free)
    cal = Calibration(
        float(x[0]),
        max(float(x[1]), _MIN_SCALE),
        max(float(x[2]), _MIN_SCALE),
        float(x[3]),
        float(x[4]),
    )
    coef = np.array(
        [cal.overhead_s, cal.prefill_scale, cal.decode_scale, cal.kv_token_s, cal.seq_s]
    )
    after = np.abs(a @ coef - 1.0)
    return StepFit(
        cal,
        len(t),
        int((~keep).sum()),
        float(np.median(np.abs(base / t - 1.0))),
        float(np.median(after)),
    )
