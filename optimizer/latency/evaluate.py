"""Hold-out accuracy of fitted latency models (issue 3's accuracy targets).

Per operator and format (its FP8 variant apart, named "<op>:fp8"), two splits
of its samples, each fitted afresh on the rest:

- random: a seeded random `random_fraction` (20%) of the rows;
- extrapolation: the rows with the largest `extrapolation_fraction` (10%) of
  token counts (`features.token_count`: tokens for GEMMs and elementwise ops,
  batch x q_len for prefill attention, batch x kv_len for decode attention,
  message bytes for all-reduce), so the model is judged beyond its grid.

Errors are absolute percentage errors of the predicted median latency; a
metric holds their median and p90. Operators with too few rows to hold some
out are skipped. `evaluate_mixed` checks composed step times against measured
whole iterations. Shared by `servetune latency fit` and the benchmark.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from optimizer.latency.compose import iterations_ms
from optimizer.latency.features import OpBatch, token_count
from optimizer.latency.mixed_fit import fit_composition, mixed_load, mixed_pricing
from optimizer.latency.model import (
    MIN_SAMPLES,
    FitOptions,
    LatencyModel,
    fit_op_model,
    group_samples,
    op_name,
)
from optimizer.records import HoldoutMetric, HoldoutSplit, KernelSample, OpKind
from optimizer.shapes import ModelShape

# (operator name as in HoldoutMetric.op, split) just evaluated
EvalProgress = Callable[[str, HoldoutSplit], None]


@dataclass(frozen=True, slots=True)
class HoldoutOptions:
    random_fraction: float = 0.2
    extrapolation_fraction: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("random_fraction", "extrapolation_fraction"):
            value = getattr(self, name)
            if not 0.0 < value < 1.0:
                raise ValueError(f"hold-out {name} must be in (0, 1), got {value}")


@dataclass(frozen=True, slots=True)
class AccuracyTargets:
    """Issue 3: GPU tables median <= 5%, own CPU profiles <= 10% (random hold-out)."""

    random_median: float = 5.0
    random_p90: float = 15.0
    extrapolation_median: float = 10.0

    def met(self, metric: HoldoutMetric) -> bool:
        if metric.split is HoldoutSplit.RANDOM:
            return metric.median_ape <= self.random_median and metric.p90_ape <= self.random_p90
        return metric.median_ape <= self.extrapolation_median


def ape(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Absolute percentage errors."""
    return np.abs(np.asarray(predicted) / np.asarray(measured) - 1.0) * 100.0


def _metric(name: str, split: HoldoutSplit, errors: np.ndarray) -> HoldoutMetric:
    return HoldoutMetric(
        name,
        split,
        int(errors.size),
        float(np.median(errors)),
        float(np.percentile(errors, 90)),
    )


def _split_error(
    batch: OpBatch, t: np.ndarray, test: np.ndarray, options: FitOptions
) -> np.ndarray | None:
    """Errors on rows `test` (boolean mask) of a model fitted on the others."""
    train = np.flatnonzero(~test)
    if train.size < MIN_SAMPLES or not test.any():
        return None
    model = fit_op_model(batch.take(train), t[train], options)
    held = np.flatnonzero(test)
    return ape(model.predict_ms(batch.take(held)), t[held])


def holdout_masks(batch: OpBatch, holdout: HoldoutOptions) -> dict[HoldoutSplit, np.ndarray]:
    """Boolean masks of the rows each split withholds."""
    n = len(batch)
    rng = np.random.default_rng(holdout.seed)
    rand = np.zeros(n, dtype=bool)
    rand[rng.permutation(n)[: max(1, round(holdout.random_fraction * n))]] = True
    tok = token_count(batch)
    top = np.quantile(tok, 1.0 - holdout.extrapolation_fraction)
    far = tok > top
    if not far.any():
        far = tok >= top
    return {HoldoutSplit.RANDOM: rand, HoldoutSplit.EXTRAPOLATION: far}


def evaluate_holdout(
    samples: Sequence[KernelSample],
    *,
    options: FitOptions | None = None,
    holdout: HoldoutOptions | None = None,
    progress: EvalProgress | None = None,
) -> tuple[HoldoutMetric, ...]:
    """Per operator, format and split, the hold-out error of models fitted like the real
    one (`HoldoutMetric.op`: the op, or "<op>:fp8" for an FP8 variant)."""
    from threadpoolctl import threadpool_limits

    options = options or FitOptions()
    holdout = holdout or HoldoutOptions()
    metrics: list[HoldoutMetric] = []
    with threadpool_limits(limits=options.num_threads):  # predictions too, not only fits
        for (op, fp8), (batch, t) in group_samples(samples).items():
            name = op_name(op, fp8)
            for split, mask in holdout_masks(batch, holdout).items():
                errors = _split_error(batch, t, mask, options)
                if errors is not None:
                    metrics.append(_metric(name, split, errors))
                if progress is not None:
                    progress(name, split)
    return tuple(metrics)


@dataclass(frozen=True, slots=True)
class MixedAccuracy:
    """Composed step times against measured mixed iterations."""

    num_fit: int  # iterations the overhead and scale were fitted on
    num_test: int
    overhead_s: float
    scale: float  # operators in a forward / alone
    median_ape: float
    p90_ape: float
    errors: tuple[float, ...]  # signed % error per test iteration (predicted / measured - 1)


def evaluate_mixed(
    model: LatencyModel,
    shape: ModelShape,
    mixed: Sequence[KernelSample],
    *,
    fit_fraction: float = 0.5,
    seed: int = 0,
) -> MixedAccuracy:
    """Fit the overhead and operator scale on a seeded `fit_fraction` of the
    iterations (`mixed_fit.fit_composition`), test on the rest."""
    mixed = [s for s in mixed if s.op is OpKind.MIXED_ITERATION]
    if len(mixed) < 2:
        raise ValueError(f"need at least 2 mixed iterations, got {len(mixed)}")
    pricing = mixed_pricing(model, shape)
    idx = np.random.default_rng(seed).permutation(len(mixed))
    cut = min(max(1, round(fit_fraction * len(mixed))), len(mixed) - 1)
    loads = [mixed_load(s) for s in mixed]
    fit = fit_composition(
        pricing, [loads[i] for i in idx[:cut]], [mixed[i].median_ms / 1e3 for i in idx[:cut]]
    )
    test = idx[cut:]
    composed = iterations_ms(pricing, [loads[i] for i in test], 0.0)
    pred = fit.scale * composed + 1e3 * fit.overhead_s
    true = np.array([mixed[i].median_ms for i in test])
    signed = (pred / true - 1.0) * 100.0
    errors = np.abs(signed)
    return MixedAccuracy(
        cut,
        int(test.size),
        fit.overhead_s,
        fit.scale,
        float(np.median(errors)),
        float(np.percentile(errors, 90)),
        tuple(float(e) for e in signed),
    )
