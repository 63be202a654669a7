"""DeepSeek sparse attention decodes priced by vLLM's measured DSA block inside its grid
and by the estimate outside it (`optimizer.latency.dsa`), the block's projections priced
once either way, and the labels; then the installed package's H100 table, fitted.
(The importer's mapping: tests/profiler_tests/test_importers_dsa.py.)"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from optimizer.hardware import get_accelerator
from optimizer.latency import dsa, fit_latency_model
from optimizer.latency.compose import Pricing
from optimizer.latency.model import FitOptions
from optimizer.latency.roofline import RooflinePricer
from optimizer.records import KernelSample, OpKind
from optimizer.shapes import get_shape
from profiler.importers.aiconfigurator_dsa import dsa_samples

H100 = RooflinePricer(get_accelerator("h100"))
GLM5 = get_shape("glm-5")  # bf16 weights, a 16-bit KV cache, 64 heads: 8 a rank at tp 8


def _law_us(b: float, kv: float) -> float:
    return 150.0 + 0.5 * b + 0.001 * b * min(kv, 2048.0)  # the synthetic table, us


def _samples() -> list[KernelSample]:
    """GLM-5's decode block at 8 heads: 1 to 256 sequences over 2 to 32,768 keys."""
    out = []
    for b in 2.0 ** np.arange(9):
        for kv in 2.0 ** np.arange(1, 16):
            ms = _law_us(b, kv) / 1e3
            out.append(
                KernelSample(
                    OpKind.DSA_DECODE,
                    ms,
                    ms,
                    ms,
                    num_tokens=int(b),
                    batch_size=int(b),
                    q_len=1,
                    kv_len=int(kv),
                    num_heads=8,
                    n=512,
                    k=6144,
                    head_dim=256,
                )
            )
    return out


@pytest.fixture(scope="module")
def learned():
    return fit_latency_model(_samples(), accelerator="h100", options=FitOptions(max_iter=50))


def test_inside_the_grid_the_block_prices_the_decode_and_its_projections(learned) -> None:
    """GLM-5 at tp 8: 32 sequences at 4,096 keys are inside the grid (256 x 32,768): each
    of the 78 layers costs the fitted block (150 + 16 + 65.5 us, within 5%), which holds
    the layer's projections, so the step's token-parallel work drops them (q/kv, output,
    RoPE and the indexer's) by exactly `dsa_projections_ms`. 512 sequences lie beyond:
    the estimate's sparse attention and indexer plus those projections over 512 tokens."""
    measured, estimate = Pricing(GLM5, 8, H100, learned), Pricing(GLM5, 8, H100)
    b, kv = np.array([32.0, 512.0]), np.array([4096.0, 4096.0])
    per = measured.decode_attn_ms(b, kv) / 78
    assert per[0] == pytest.approx(_law_us(32, 4096) / 1e3, rel=0.05)
    beyond = estimate.decode_attn_ms(b, kv)[1] / 78 + estimate.dsa_projections_ms(b)[1]
    assert per[1] == pytest.approx(beyond)
    m = np.array([64.0])
    dropped = estimate.layer_ms(m, mlp=False) - measured.layer_ms(m, mlp=False)
    assert dropped == pytest.approx(estimate.dsa_projections_ms(m))
    # a prefill chunk stays the estimate, paying the projections over its own tokens
    q = np.array([1024.0])
    chunk = measured.prefill_attn_ms(q, q) - estimate.prefill_attn_ms(q, q)
    assert chunk == pytest.approx(78 * estimate.dsa_projections_ms(q))
    assert "dsa_decode:beyond_256x32768" in measured.estimated_ops()
    assert "decode_attn:mla" not in measured.estimated_ops()
    assert "decode_attn:mla" in estimate.estimated_ops()


def test_heads_dims_or_formats_not_measured_keep_the_estimate(learned) -> None:
    """At tp 4 (16 heads a rank, not measured), for DeepSeek-V3.2 (other dims) and with an
    FP8 KV cache (no dsa_decode_fp8kv fitted), pricing is the estimate's throughout."""
    fp8_kv = dataclasses.replace(GLM5, kv_cache_dtype="fp8")
    for shape, tp in ((GLM5, 4), (get_shape("deepseek-v3.2"), 8), (fp8_kv, 8)):
        measured, estimate = Pricing(shape, tp, H100, learned), Pricing(shape, tp, H100)
        assert dsa.decode_block(measured) is None
        b, kv = np.array([8.0]), np.array([1024.0])
        assert measured.decode_attn_ms(b, kv) == estimate.decode_attn_ms(b, kv)
        assert measured.layer_ms(b) == estimate.layer_ms(b)


def test_the_installed_h100_table_prices_deepseek_v32_decodes(aic_package) -> None:
    """The H100 vLLM 0.24 decode table: both models, both KV formats, three weight
    formats' rows (bf16 and FP8 block on Hopper). Fitted, DeepSeek-V3.2 (FP8 weights, a
    16-bit cache) at tp 8 is priced within 5% of the table's own rows (16 heads: 0.2377 ms
    for 1 sequence over 4,096 keys, 0.535 ms for 256)."""
    folder = aic_package.folder("h100_sxm")
    samples = dsa_samples(folder)
    counts = Counter((s.op, s.dtype) for s in samples)
    assert set(counts) == {
        (op, dtype)
        for op in (OpKind.DSA_DECODE, OpKind.DSA_DECODE_FP8KV)
        for dtype in ("bfloat16", "fp8")
    }
    v32 = [s for s in samples if s.k == 7168 and s.dtype == "fp8" and s.op is OpKind.DSA_DECODE]
    model = fit_latency_model(v32, accelerator="h100", source="aic")
    pricing = Pricing(get_shape("deepseek-v3.2"), 8, H100, model)
    block = dsa.decode_block(pricing)
    assert block is not None and block[1] == (1.0, 1024.0, 2.0, 131072.0)
    got = dsa.block_decode_ms(pricing, block[0], np.array([1.0, 256.0]), np.array([4096.0] * 2))
    assert got == pytest.approx([0.2377, 0.535], rel=0.05)
