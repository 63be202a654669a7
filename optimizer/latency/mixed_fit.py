"""Fitting the composition of a step on measured mixed iterations.

A step costs `overhead_s + scale x` its composed operators
(`optimizer.latency.compose`); both are fitted on whole mixed iterations (one
prefill chunk and a batch of decodes, `profiler.mixed`) measured on the engine:
`fit_composition` for a pricing and its loads, `fit_mixed_overhead` for a fitted
latency model (its `overhead_s` and `op_scale`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from optimizer.hardware import HardwareError, get_accelerator
from optimizer.latency.base import StepLoad
from optimizer.latency.compose import Pricing, iterations_ms
from optimizer.latency.model import LatencyModel, LatencyModelError
from optimizer.latency.roofline import RooflinePricer
from optimizer.records import KernelSample, OpKind
from optimizer.shapes import ModelShape, ShapeError, get_shape

MIN_SCALE_FIT = 3  # mixed iterations needed to fit a scale besides the overhead


@dataclass(frozen=True, slots=True)
class Composition:
    """How measured whole steps relate to their composed operators:
    step = overhead_s + scale x composed."""

    overhead_s: float
    scale: float


def fit_composition(
    pricing: Pricing, loads: Sequence[StepLoad], measured_s: Sequence[float]
) -> Composition:
    """Fit `Composition` to measured iterations of `loads` (priced by `pricing`).

    Non-negative least squares on relative error, so a 1 ms decode step weighs
    as much as a 40 ms prefill. A constant alone cannot fit both: on this
    project's CPU the operators of a forward run ~15% slower than alone, and a
    constant sized for the large steps (~2 ms) doubles the small ones. With
    fewer than `MIN_SCALE_FIT` iterations, or no positive scale, the scale stays
    at the pricing's own and the overhead is the median gap (>= 0).
    """
    if len(loads) != len(measured_s) or not loads:
        raise ValueError(
            "need matching non-empty loads and measurements, "
            f"got {len(loads)} and {len(measured_s)}"
        )
    measured = np.asarray(measured_s, dtype=np.float64)
    composed = iterations_ms(pricing, loads, 0.0) / 1e3
    if len(loads) >= MIN_SCALE_FIT and np.all(measured > 0):
        from scipy.optimize import nnls

        a = np.column_stack([np.ones_like(measured), composed]) / measured[:, None]
        (overhead, scale), _ = nnls(a, np.ones_like(measured))
        if scale > 0:
            return Composition(float(overhead), float(scale * pricing.scale))
    return Composition(max(0.0, float(np.median(measured - composed))), pricing.scale)


def mixed_load(sample: KernelSample) -> StepLoad:
    """The StepLoad a MIXED_ITERATION sample measured (conventions of profiler.mixed:
    one fresh prefill chunk of q_len tokens, batch_size decodes of kv_len keys each)."""
    if sample.op is not OpKind.MIXED_ITERATION:
        raise ValueError(f"expected a {OpKind.MIXED_ITERATION.value} sample, got {sample.op}")
    chunk, decodes = sample.q_len, sample.batch_size
    return StepLoad(
        num_tokens=chunk + decodes,
        num_logits=decodes + (1 if chunk else 0),
        prefill_q=(chunk,) if chunk else (),
        prefill_kv=(chunk,) if chunk else (),
        num_decode_seqs=decodes,
        decode_kv_tokens=decodes * sample.kv_len,
    )


def mixed_pricing(model: LatencyModel, shape: ModelShape) -> Pricing:
    """How `model` prices, operator by operator as measured alone (scale 1), the
    tensor-parallel-1 forwards of `shape` that mixed iterations measure."""
    try:
        acc = get_accelerator(model.accelerator)
    except HardwareError as exc:
        raise LatencyModelError(f"mixed iterations: {exc}") from exc
    return Pricing(shape, 1, RooflinePricer(acc), replace(model, op_scale=1.0))


def _mixed_of(
    samples: Sequence[KernelSample], shape: ModelShape | None
) -> tuple[ModelShape, list[KernelSample]]:
    """The shape mixed iterations measured and its samples (`shape`'s, when given)."""
    names = sorted({s.model for s in samples})
    if shape is not None:
        mine = [s for s in samples if s.model == shape.name]
        if not mine:
            raise LatencyModelError(f"no mixed iterations of shape {shape.name!r}, only of {names}")
        return shape, mine
    if len(names) != 1:
        raise LatencyModelError(
            f"mixed iterations of several shapes {names}; name the one to fit the overhead on"
        )
    try:
        return get_shape(names[0]), list(samples)
    except ShapeError as exc:
        raise LatencyModelError(f"mixed iterations: {exc}; pass the shape explicitly") from exc


def fit_mixed_overhead(
    model: LatencyModel, mixed: Sequence[KernelSample], shape: ModelShape | None = None
) -> LatencyModel:
    """`model` with its per-iteration overhead and operator scale fitted on measured
    mixed iterations."""
    shape, mixed = _mixed_of(mixed, shape)
    pricing = mixed_pricing(model, shape)
    fit = fit_composition(
        pricing, [mixed_load(s) for s in mixed], [s.median_ms / 1e3 for s in mixed]
    )
    return replace(model, overhead_s=fit.overhead_s, op_scale=fit.scale, num_mixed=len(mixed))
