"""Per-operator regressors: accuracy on held-out samples, extrapolation, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from optimizer.latency.features import OpBatch, token_count
from optimizer.latency.model import (
    FitOptions,
    LatencyModelError,
    fit_latency_model,
    fit_op_model,
    group_samples,
)
from storage.records import KernelSample, OpKind

FAST = FitOptions(max_iter=150)


def _gemm_truth(m: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
    """A GPU-like GEMM: tile-quantised m, compute vs bandwidth roofline, launch cost."""
    m_tiles = np.ceil(m / 64.0) * 64.0
    compute = 2 * m_tiles * n * k / 600e12
    memory = 2 * (m * k + k * n + m * n) / 2.8e12
    return 1e3 * np.maximum(compute, memory) + 0.006


def _gemm_samples(rng: np.random.Generator, num: int, max_m: int = 8192) -> list[KernelSample]:
    m = rng.integers(1, max_m, num)
    n = rng.choice([1024, 2048, 4096, 6144, 14336], num)
    k = rng.choice([1024, 4096, 8192], num)
    t = _gemm_truth(m, n, k) * rng.normal(1.0, 0.01, num)
    return [
        KernelSample(
            OpKind.GEMM, float(x), float(x), float(x), num_tokens=int(a), n=int(b), k=int(c)
        )
        for a, b, c, x in zip(m, n, k, t, strict=True)
    ]


def _ape(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    return np.abs(pred / true - 1.0) * 100.0


def test_synthetic_gemm_interpolates_and_extrapolates() -> None:
    rng = np.random.default_rng(1)
    model = fit_latency_model(_gemm_samples(rng, 3000), accelerator="h100", options=FAST)
    test = group_samples(_gemm_samples(np.random.default_rng(2), 500))[OpKind.GEMM]
    ape = _ape(model.predict_ms(test[0]), test[1])
    assert np.median(ape) < 3.0 and np.percentile(ape, 90) < 10.0
    # 4x beyond the largest m seen: the roofline base keeps growing with work
    big = OpBatch.make(OpKind.GEMM, num_tokens=32768, n=4096, k=4096)
    truth = _gemm_truth(np.array([32768.0]), np.array([4096.0]), np.array([4096.0]))
    assert _ape(model.predict_ms(big), truth)[0] < 15.0


def test_real_h100_gemm_and_attention_hold_out(shared_data: Path) -> None:
    from profiler.importers import ImportFormat, import_profile

    profile = import_profile(
        shared_data / "profiles" / "aiconfigurator" / "h100_sxm", ImportFormat.AICONFIGURATOR
    )
    rng = np.random.default_rng(0)
    for op, (batch, t) in group_samples(profile.samples).items():
        idx = rng.permutation(len(batch))[:4000]  # keep the test quick
        cut = int(0.8 * idx.size)
        model = fit_op_model(batch.take(idx[:cut]), t[idx[:cut]], FAST)
        ape = _ape(model.predict_ms(batch.take(idx[cut:])), t[idx[cut:]])
        assert np.median(ape) < 8.0, f"{op}: median APE {np.median(ape):.1f}%"
        # extrapolation: withhold the largest 10% of token counts
        tok = token_count(batch)
        far = tok > np.quantile(tok, 0.9)
        fitted = fit_op_model(batch.take(np.flatnonzero(~far)), t[~far], FAST)
        ape = _ape(fitted.predict_ms(batch.take(np.flatnonzero(far))), t[far])
        assert np.median(ape) < 12.0, f"{op}: extrapolation median APE {np.median(ape):.1f}%"


def test_predictions_positive_and_monotone_in_work() -> None:
    model = fit_latency_model(
        _gemm_samples(np.random.default_rng(3), 2000), accelerator="h100", options=FAST
    )
    m = np.array([1024.0, 4096.0, 16384.0, 65536.0])
    pred = model.predict_ms(OpBatch.make(OpKind.GEMM, num_tokens=m, n=4096, k=4096))
    assert np.all(pred > 0) and np.all(np.diff(pred) > 0)


def test_fit_errors() -> None:
    few = _gemm_samples(np.random.default_rng(4), 3)
    with pytest.raises(LatencyModelError, match="no operator"):
        fit_latency_model(few, accelerator="h100")
    batch = OpBatch.make(OpKind.GEMM, num_tokens=np.arange(1, 20), n=64, k=64)
    with pytest.raises(LatencyModelError, match="finite and > 0"):
        fit_op_model(batch, np.zeros(19), FAST)
    with pytest.raises(LatencyModelError, match="instances but"):
        fit_op_model(batch, np.ones(3), FAST)
    model = fit_latency_model(
        _gemm_samples(np.random.default_rng(5), 200), accelerator="h100", options=FAST
    )
    with pytest.raises(LatencyModelError, match="no fitted model of 'decode_attn'"):
        model.predict_ms(OpBatch.make(OpKind.DECODE_ATTN, batch_size=1, kv_len=10, q_len=1))
