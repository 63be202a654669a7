"""Fitting a latency model: one regressor per operator and format (`optimizer.latency.model`:
the profile's own dtype, and FP8 where it measured FP8 GEMMs or FP8-KV attention), then,
when the profile measured whole forwards, how they compose into a step
(`optimizer.latency.mixed_fit.fit_mixed_overhead`: per-iteration overhead and operator
scale)."""

from __future__ import annotations

from collections.abc import Sequence

from optimizer.latency.mixed_fit import fit_mixed_overhead
from optimizer.latency.model import (
    MIN_SAMPLES,
    FitOptions,
    LatencyModel,
    LatencyModelError,
    OpModel,
    fit_op_model,
    group_samples,
    models_of,
)
from optimizer.records import KernelSample, OpKind
from optimizer.shapes import ModelShape


def fit_latency_model(
    samples: Sequence[KernelSample],
    *,
    accelerator: str,
    source: str = "",
    options: FitOptions | None = None,
    shape: ModelShape | None = None,
) -> LatencyModel:
    """Fit one model per operator and format present in `samples` (FP8 samples, dtype
    "fp8", fit the FP8 variants apart; groups with too few samples or without latency
    features are skipped), then the per-iteration overhead when there are
    MIXED_ITERATION samples (of `shape`, else of the preset they name)."""
    from threadpoolctl import threadpool_limits

    options = options or FitOptions()
    # Fits and the predictions of the composition fit run under `options.num_threads`
    # native threads (results are identical for any number).
    with threadpool_limits(limits=options.num_threads):
        ops: dict[OpKind, OpModel] = {}
        fp8_ops: dict[OpKind, OpModel] = {}
        low_bit: dict[tuple[OpKind, str], OpModel] = {}
        for (op, fmt), (batch, t) in group_samples(samples).items():
            if len(batch) >= MIN_SAMPLES:
                fitted = fit_op_model(batch, t, options, models_of(samples, (op, fmt)))
                if fmt == "":
                    ops[op] = fitted
                elif fmt == "fp8":
                    fp8_ops[op] = fitted
                else:
                    low_bit[op, fmt] = fitted
        if not ops and not fp8_ops and not low_bit:
            raise LatencyModelError(
                f"{accelerator}: no operator has {MIN_SAMPLES}+ samples of a modelled kind "
                f"({len(samples)} samples in all); a profile taken with `--grid quick` is a "
                "smoke test too small to fit: profile with `--grid default`"
            )
        model = LatencyModel(accelerator, source, ops, fp8_ops=fp8_ops, low_bit_ops=low_bit)
        mixed = [s for s in samples if s.op is OpKind.MIXED_ITERATION]
        if not mixed:
            return model
        return fit_mixed_overhead(model, mixed, shape)
