"""MLA pricing: the work of vLLM's whole MLA block, `Pricing` using the measured block
for DeepSeek-V3-dims shapes (and nothing twice), the roofline fallback otherwise, and the
H200 tables' fit (issue 27)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from optimizer.hardware import get_accelerator
from optimizer.latency import fit_latency_model
from optimizer.latency.compose import Pricing
from optimizer.latency.evaluate import evaluate_holdout
from optimizer.latency.features import OpBatch, op_format, work
from optimizer.latency.mla import BLOCK_OPS, block_models
from optimizer.latency.mla_module import MLA_OPS
from optimizer.latency.model import FitOptions
from optimizer.latency.persist import dump_model, load_model
from optimizer.latency.roofline import RooflinePricer
from optimizer.records import HoldoutSplit, KernelSample, OpKind
from optimizer.shape_parts import MLASpec
from optimizer.shapes import get_shape

H200 = RooflinePricer(get_accelerator("h200"))
DSV3 = get_shape("deepseek-ai/DeepSeek-V3")  # FP8 (block-scaled) weights, 16-bit KV cache
DIMS = {"n": 512, "k": 7168, "head_dim": 192}  # the measured layer's, as the import stores
FAST = FitOptions(max_iter=30)


def _block_samples(op: OpKind, dtype: str, rng: np.random.Generator) -> list[KernelSample]:
    """Synthetic block timings: linear in the block's work, with noise (enough to fit)."""
    decode = op in {OpKind.MLA_DECODE, OpKind.MLA_DECODE_FP8KV}
    out = []
    for _ in range(160):
        heads, b = int(2 ** rng.integers(0, 8)), int(2 ** rng.integers(0, 9))
        q = 1 if decode else int(2 ** rng.integers(4, 14))
        kv = int(2 ** rng.integers(1, 16)) if decode else q
        sample = KernelSample(op, 0.0, 0.0, 0.0, dtype=dtype, num_tokens=b * q, batch_size=b,
                              q_len=q, kv_len=kv, num_heads=heads, **DIMS)  # fmt: skip
        flops, moved = work(OpBatch.from_samples(op, [sample]))
        ms = (0.03 + flops[0] / 4e11 + moved[0] / 3e9) * float(rng.uniform(0.95, 1.05))
        out.append(dataclasses.replace(sample, median_ms=ms, p10_ms=ms, p90_ms=ms))
    return out


@pytest.fixture(scope="module")
def fp8_blocks():
    """A model holding the FP8-weight blocks over a 16-bit KV cache (DeepSeek-V3's)."""
    rng = np.random.default_rng(7)
    samples = _block_samples(OpKind.MLA_PREFILL, "fp8", rng)
    samples += _block_samples(OpKind.MLA_DECODE, "fp8", rng)
    return fit_latency_model(samples, accelerator="h200", options=FAST)


def test_block_work_worked_by_hand() -> None:
    one = {"num_tokens": 1, "batch_size": 1, "q_len": 1, "kv_len": 1, "num_heads": 1, **DIMS}
    flops, moved = work(OpBatch.make(OpKind.MLA_DECODE, 2.0, **one))
    # q_a + kv_a (7168 -> 1536 + 512 + 64), q_b (1536 -> 192), o (128 -> 7168), the
    # absorbed W_UK (128 -> 512) and W_UV (512 -> 128), one key scored (576) and summed (512)
    weights = 7168 * 2112 + 1536 * 192 + 128 * 7168
    assert flops[0] == 2 * (weights + 2 * 128 * 512) + 2 * (576 + 512)
    acts = 2 * (2 * 7168 + 1536 + 576 + 192 + 128)
    assert moved[0] == 2 * weights + 2 * 2 * 128 * 512 + 2 * 576 + acts
    # FP8 weights halve the projections' bytes; an FP8 cache halves the latent's
    long = one | {"kv_len": 65536, "batch_size": 64, "num_tokens": 64}
    bf16 = work(OpBatch.make(OpKind.MLA_DECODE, 2.0, **long))[1][0]
    fp8_kv = work(OpBatch.make(OpKind.MLA_DECODE_FP8KV, 2.0, kv_dtype_bytes=1.0, **long))[1][0]
    assert bf16 - fp8_kv == 64 * 65536 * 576
    fp8_w = OpBatch.make(OpKind.MLA_DECODE, 2.0, weight_dtype_bytes=1.0, **long)
    assert bf16 - work(fp8_w)[1][0] == weights and op_format(fp8_w) == "fp8"
    # prefill: the projections per token, kv_b (512 -> 128 + 128) per key, and the causal
    # (query, key) pairs scored (192) and summed (128) per head
    pre = one | {"q_len": 4096, "kv_len": 4096, "num_tokens": 4096}
    pairs = 4096 * 4097 / 2
    expected = 2 * 4096 * weights + 2 * 4096 * 512 * 256 + 2 * pairs * (192 + 128)
    assert work(OpBatch.make(OpKind.MLA_PREFILL, 2.0, **pre))[0][0] == expected


def test_deepseek_attention_is_priced_by_the_measured_block(fp8_blocks) -> None:
    p = Pricing(DSV3, 8, H200, fp8_blocks)
    prefill, decode = block_models(p)
    seqs, kv = np.array([32.0]), np.array([2048.0])
    params = {"num_heads": 16.0, **DIMS}  # 128 heads / tp 8
    one = decode.predict_ms(OpBatch.make(OpKind.MLA_DECODE, 2.0, weight_dtype_bytes=1.0,
                                         batch_size=seqs, q_len=1, kv_len=kv,
                                         num_tokens=seqs, **params))  # fmt: skip
    assert p.decode_attn_ms(seqs, kv) == pytest.approx(61 * one)
    q = np.array([4096.0])
    chunk = prefill.predict_ms(OpBatch.make(OpKind.MLA_PREFILL, 2.0, weight_dtype_bytes=1.0,
                                            batch_size=1, q_len=q, kv_len=q, num_tokens=q,
                                            **params))  # fmt: skip
    assert p.prefill_attn_ms(q, q) == pytest.approx(61 * chunk)
    roofline = Pricing(DSV3, 8, H200)
    assert p.decode_attn_ms(seqs, kv)[0] != pytest.approx(roofline.decode_attn_ms(seqs, kv)[0])
    estimated = p.estimated_ops()
    assert not {"prefill_attn:mla", "decode_attn:mla", "rope", "qkv_proj:fp8"} & set(estimated)
    assert "prefill_attn:mla" in roofline.estimated_ops()
    # verification: K+1 query positions per sequence priced as K+1 decoding sequences
    assert p.decode_attn_ms(seqs, kv, decode_q=3) == pytest.approx(p.decode_attn_ms(3 * seqs, kv))
    # and so does the ratio the compiled tables scale decode by
    ratio = p.verify_ratio(seqs, kv, 3)
    assert p.decode_attn_ms(seqs, kv) * ratio == pytest.approx(p.decode_attn_ms(3 * seqs, kv))


def test_the_block_holds_the_projections_so_they_are_not_priced_twice(fp8_blocks) -> None:
    m = np.array([1.0, 64.0, 4096.0])
    with_block = Pricing(DSV3, 8, H200, fp8_blocks)
    without = Pricing(DSV3, 8, H200)  # the same roofline GEMMs, attention by the roofline
    inside = sum(without.price_ms(op, num_tokens=m, **without._nk(op)) for op in BLOCK_OPS)
    assert with_block.layer_ms(m, mlp=False) == pytest.approx(
        without.layer_ms(m, mlp=False) - inside
    )
    assert np.all(inside > 0)


def test_kimi_k2_heads_and_other_dims_or_formats(fp8_blocks) -> None:
    kimi = get_shape("kimi-k2")  # 64 heads: 8 per GPU at tp 8, the same MLA dims
    assert kimi.quantization == "fp8" and block_models(Pricing(kimi, 8, H200, fp8_blocks))
    # other MLA dims: the roofline at its latent dimensions, labelled
    lite = dataclasses.replace(DSV3, mla=MLASpec(512, 64, 128, 128, q_lora_rank=0))
    p = Pricing(lite, 8, H200, fp8_blocks)
    assert block_models(p) is None
    assert {"prefill_attn:mla", "decode_attn:mla"} <= set(p.estimated_ops())
    # an FP8 KV cache the model has no _fp8kv blocks for; 16-bit weights it lacks too
    for shape in (dataclasses.replace(DSV3, kv_cache_dtype="fp8"),
                  dataclasses.replace(DSV3, quantization="none")):  # fmt: skip
        p = Pricing(shape, 8, H200, fp8_blocks)
        assert block_models(p) is None
        assert any(name.endswith(":mla") for name in p.estimated_ops())


def test_a_dense_shape_prices_exactly_as_without_the_blocks(fp8_blocks) -> None:
    rng = np.random.default_rng(3)
    gemms = []
    for _ in range(120):
        m, n, k = (int(2 ** rng.integers(0, 13)) for _ in range(3))
        ms = 0.01 + 2 * m * n * k / 5e11 * float(rng.uniform(0.95, 1.05))
        gemms.append(KernelSample(OpKind.GEMM, ms, ms, ms, num_tokens=m, n=n, k=k))
    blocks = _block_samples(OpKind.MLA_DECODE, "bfloat16", rng)
    plain = fit_latency_model(gemms, accelerator="h200", options=FAST)
    mixed = fit_latency_model(gemms + blocks, accelerator="h200", options=FAST)
    assert mixed.has(OpKind.MLA_DECODE)
    llama = get_shape("llama-3.1-8b")
    a, b = Pricing(llama, 2, H200, plain), Pricing(llama, 2, H200, mixed)
    m, kv = np.array([1.0, 100.0, 4096.0]), np.array([512.0, 2048.0, 8192.0])
    assert np.array_equal(a.dense_ms(m), b.dense_ms(m))
    assert np.array_equal(a.prefill_attn_ms(m, kv), b.prefill_attn_ms(m, kv))
    assert np.array_equal(a.decode_attn_ms(m, kv), b.decode_attn_ms(m, kv))
    assert a.estimated_ops() == b.estimated_ops()


def test_block_models_round_trip(fp8_blocks) -> None:
    again = load_model(dump_model(fp8_blocks))
    seqs, kv = np.array([32.0, 256.0]), np.array([2048.0, 16384.0])
    assert np.array_equal(
        Pricing(DSV3, 8, H200, again).decode_attn_ms(seqs, kv),
        Pricing(DSV3, 8, H200, fp8_blocks).decode_attn_ms(seqs, kv),
    )


@pytest.mark.shared_data
def test_h200_tables_fit_and_price_a_deepseek_step(shared_data: Path) -> None:
    from profiler.importers.aiconfigurator_mla import mla_samples

    folder = shared_data / "profiles" / "aiconfigurator" / "h200_sxm"
    samples = [s for s in mla_samples(folder) if s.dtype == "fp8"]  # DeepSeek-V3's FP8
    model = fit_latency_model(samples, accelerator="h200")
    p = Pricing(DSV3, 8, H200, model)
    # the measured rows (16 heads, FP8 block weights, 16-bit KV): FLASH_ATTN_MLA decode of
    # 32 sequences at 2,048 keys 0.1310 ms, FlashAttention prefill of 4,096 tokens 0.6997
    decode = p.decode_attn_ms(np.array([32.0]), np.array([2048.0]))[0] / 61
    assert decode == pytest.approx(0.1310, rel=0.05)
    q = np.array([4096.0])
    assert p.prefill_attn_ms(q, q)[0] / 61 == pytest.approx(0.6997, rel=0.05)
    assert not any(":mla" in name for name in p.estimated_ops())
    # hold-out (measured: random median 0.6%, p90 2.5%; top-tenth extrapolation 1-7%)
    metrics = {(m.op, m.split): m for m in evaluate_holdout(samples)}
    assert {op for op, _ in metrics} == {f"{op.value}:fp8" for op in MLA_OPS}
    for (_, split), m in metrics.items():
        if split is HoldoutSplit.RANDOM:
            assert m.median_ape < 3.0 and m.p90_ape < 10.0, m
        else:
            assert m.median_ape < 20.0, m
