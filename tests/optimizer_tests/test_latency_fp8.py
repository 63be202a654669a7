"""FP8 in the latency model: byte counts, separate FP8 fits, pricing and its fallbacks,
compiled tables per precision, persistence of FP8 variants."""

from __future__ import annotations

import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from optimizer.dims import GEMM_OPS, RankDims, sample_nk
from optimizer.hardware import get_accelerator
from optimizer.latency import StepLoad, TableReach, compile_learned, compile_roofline
from optimizer.latency.catalog import LatencyCatalog, LoadedModel
from optimizer.latency.compose import Pricing
from optimizer.latency.features import FeatureError, OpBatch, is_fp8, work
from optimizer.latency.fit import fit_latency_model
from optimizer.latency.model import FitOptions, LatencyModelError, group_samples
from optimizer.latency.persist import (
    _MAGIC,
    PAYLOAD_SCHEMA_VERSION,
    dump_model,
    feature_names,
    load_model,
)
from optimizer.latency.roofline import RooflinePricer
from optimizer.latency.table import TableGrid
from optimizer.latency.table_bytes import table_from_bytes, table_to_bytes
from optimizer.records import KernelSample, OpKind
from optimizer.shapes import DEFAULT_PRECISION, Precision, get_shape

FAST = FitOptions(max_iter=60)
SHAPE = get_shape("llama-3.1-8b")
FP8_WEIGHTS = SHAPE.with_precision(Precision("fp8", "auto"))
FP8_KV = SHAPE.with_precision(Precision("none", "fp8"))
GRID = TableGrid(max_tokens=8192, max_log2_batch=7, max_log2_q=13, max_log2_kv=16, max_verify_q=2)
H100, A100 = get_accelerator("h100"), get_accelerator("a100")


# -- bytes and FLOPs: the roofline at FP8 ---------------------------------------------------


def test_fp8_weights_move_half_the_weight_bytes_and_fp8_kv_half_the_kv() -> None:
    n = k = 4096
    bf16 = OpBatch.make(OpKind.QKV_PROJ, 2.0, num_tokens=1, n=n, k=k)
    fp8 = OpBatch.make(OpKind.QKV_PROJ, 2.0, weight_dtype_bytes=1.0, num_tokens=1, n=n, k=k)
    assert not is_fp8(bf16) and is_fp8(fp8)
    # activations in (1 x 4096) and out (1 x 4096) at 2 bytes; weights 4096 x 4096
    assert work(bf16)[1][0] == 2 * 4096 + 2 * 4096 + 2 * 4096 * 4096  # 33,570,816
    assert work(fp8)[1][0] == 2 * 4096 + 2 * 4096 + 1 * 4096 * 4096  # 16,793,600
    assert work(fp8)[0][0] == work(bf16)[0][0] == 2 * 4096 * 4096
    # Batch-1 GEMVs are bandwidth-bound: 4 us launch + bytes / (3.35 TB/s x 0.8).
    roof = RooflinePricer(H100)
    assert roof.predict_ms(bf16)[0] == pytest.approx(0.004 + 1e3 * 33_570_816 / 2.68e12)
    assert roof.predict_ms(fp8)[0] == pytest.approx(0.004 + 1e3 * 16_793_600 / 2.68e12)
    # Decode attention, 32 heads over 8 KV heads of 128, 4096 keys: Q and output at 2
    # bytes (2 x 32 x 128 x 2), K and V at 2 or 1 (2 x 4096 x 8 x 128 x width).
    attn = {"batch_size": 1, "q_len": 1, "kv_len": 4096, "num_heads": 32, "num_kv_heads": 8}
    attn |= {"head_dim": 128, "num_tokens": 1}
    kv16 = OpBatch.make(OpKind.DECODE_ATTN, 2.0, **attn)
    kv8 = OpBatch.make(OpKind.DECODE_ATTN, 2.0, kv_dtype_bytes=1.0, **attn)
    assert work(kv16)[1][0] == 2 * 32 * 128 * 2 + 2 * 4096 * 8 * 128 * 2  # 16,793,600
    assert work(kv8)[1][0] == 2 * 32 * 128 * 2 + 2 * 4096 * 8 * 128 * 1  # 8,404,992
    assert is_fp8(kv8) and not is_fp8(kv16)


def test_fp8_gemm_computes_at_the_fp8_peak_only_where_there_is_one() -> None:
    m = n = k = 8192
    flops = 2.0 * 8192**3
    bf16 = OpBatch.make(OpKind.MLP_UP, 2.0, num_tokens=m, n=n, k=k)
    fp8 = OpBatch.make(OpKind.MLP_UP, 2.0, weight_dtype_bytes=1.0, num_tokens=m, n=n, k=k)
    h100, a100 = RooflinePricer(H100), RooflinePricer(A100)
    # compute-bound: FLOPs / (peak x 0.7) + 4 us; H100 FP8 1979 TFLOP/s, bf16 989
    assert h100.predict_ms(bf16)[0] == pytest.approx(0.004 + 1e3 * flops / (989e12 * 0.7))
    assert h100.predict_ms(fp8)[0] == pytest.approx(0.004 + 1e3 * flops / (1979e12 * 0.7))
    # A100: no FP8 tensor cores, FP8 weights run weight-only at the bf16 peak
    assert A100.fp8_tflops is None
    assert a100.predict_ms(fp8)[0] == pytest.approx(0.004 + 1e3 * flops / (312e12 * 0.7))
    assert a100.predict_ms(fp8)[0] == pytest.approx(a100.predict_ms(bf16)[0])
    # FP8 attention (an FP8 KV cache) keeps the bf16 peak: only its bytes shrink
    attn = {"batch_size": 1, "q_len": 8192, "kv_len": 8192, "num_heads": 32}
    attn |= {"num_kv_heads": 8, "head_dim": 128, "num_tokens": 8192}
    kv8 = OpBatch.make(OpKind.PREFILL_ATTN, 2.0, kv_dtype_bytes=1.0, **attn)
    assert h100.peak_flops_per_s(kv8) == H100.flops_per_s


@pytest.mark.parametrize("precision", [DEFAULT_PRECISION, Precision("fp8", "auto")])
def test_a_step_reads_each_linear_weight_once_at_its_width(precision: Precision) -> None:
    """The projections' weight bytes (features.work at zero tokens) add up to the shape's
    linear parameters at their width: what shapes.weight_bytes counts."""
    shape = SHAPE.with_precision(precision)
    pricing = Pricing(shape, 1, RooflinePricer(H100))
    dims = RankDims.of(shape, 1)
    per_layer = 0.0
    for op in GEMM_OPS:
        n, k = sample_nk(op, dims)
        w = pricing._widths(op)["weight_dtype_bytes"]
        per_layer += work(OpBatch.make(op, 2.0, weight_dtype_bytes=w, n=n, k=k))[1][0]
    assert shape.num_layers * per_layer == shape.num_linear_params * shape.weight_dtype_bytes
    # the LM head stays 16-bit in FP8 checkpoints
    assert pricing._widths(OpKind.LM_HEAD)["weight_dtype_bytes"] is None


# -- fitting the FP8 variants apart ---------------------------------------------------------


def _gemm_samples(rng: np.random.Generator, num: int, dtype: str) -> list[KernelSample]:
    """GPU-like GEMMs: FP8 computes twice as fast and streams its weights at 1 byte."""
    m = rng.integers(1, 8192, num)
    n = rng.choice([1024, 4096, 6144, 14336], num)
    k = rng.choice([1024, 4096, 8192], num)
    w, peak = (1.0, 1200e12) if dtype == "fp8" else (2.0, 600e12)
    memory = (2 * (m * k + m * n) + w * k * n) / 2.8e12
    t = 1e3 * np.maximum(2 * m * n * k / peak, memory) + 0.006
    return [
        KernelSample(OpKind.GEMM, x, x, x, dtype=dtype, num_tokens=int(a), n=int(b), k=int(c))
        for a, b, c, x in zip(m, n, k, t, strict=True)
    ]


@pytest.fixture(scope="module")
def synthetic() -> tuple:
    rng = np.random.default_rng(0)
    bf16 = _gemm_samples(rng, 1500, "bfloat16")
    both = bf16 + _gemm_samples(rng, 1500, "fp8")
    return (
        fit_latency_model(both, accelerator="h100", source="synthetic", options=FAST),
        fit_latency_model(bf16, accelerator="h100", source="synthetic", options=FAST),
    )


def test_fp8_samples_fit_their_own_variant_and_price_only_fp8(synthetic) -> None:
    both, bf16_only = synthetic
    assert set(both.ops) == set(both.fp8_ops) == {OpKind.GEMM}
    assert both.fp8_ops[OpKind.GEMM].fp8 and not both.ops[OpKind.GEMM].fp8
    assert sorted(both.op_names()) == ["gemm", "gemm:fp8"]
    big = {"num_tokens": 8192, "n": 14336, "k": 4096}
    slow = both.predict_ms(OpBatch.make(OpKind.GEMM, **big))[0]
    fast = both.predict_ms(OpBatch.make(OpKind.GEMM, weight_dtype_bytes=1.0, **big))[0]
    truth = 1e3 * 2 * 8192 * 14336 * 4096 / np.array([600e12, 1200e12]) + 0.006
    assert slow == pytest.approx(truth[0], rel=0.1) and fast == pytest.approx(truth[1], rel=0.1)
    # Never the other format's model: a 16-bit model refuses an FP8 batch, and back.
    fp8_batch = OpBatch.make(OpKind.GEMM, weight_dtype_bytes=1.0, **big)
    with pytest.raises(LatencyModelError, match="no fitted model of 'gemm:fp8'"):
        bf16_only.predict_ms(fp8_batch)
    with pytest.raises(LatencyModelError, match="fitted and priced apart"):
        both.ops[OpKind.GEMM].predict_ms(fp8_batch)
    groups = group_samples(_gemm_samples(np.random.default_rng(1), 20, "fp8"))
    assert list(groups) == [(OpKind.GEMM, "fp8")] and groups[(OpKind.GEMM, "fp8")][0].k.size == 20


def test_fp8_is_a_gemm_or_kv_format_only() -> None:
    norm = KernelSample(OpKind.NORM, 1.0, 1.0, 1.0, dtype="fp8", num_tokens=8, n=4096)
    with pytest.raises(FeatureError, match=r"GEMMs .* and attention"):
        OpBatch.from_samples(OpKind.NORM, [norm])
    attn = KernelSample(
        OpKind.DECODE_ATTN, 1.0, 1.0, 1.0, dtype="fp8", batch_size=4, q_len=1, kv_len=100
    )
    batch = OpBatch.from_samples(OpKind.DECODE_ATTN, [attn])
    assert (batch.dtype_bytes, batch.weight_dtype_bytes, batch.kv_dtype_bytes) == (2.0, 2.0, 1.0)


# -- pricing: the FP8 variant, else the roofline at FP8 (never the 16-bit model) -------------


def test_without_an_fp8_variant_fp8_ops_are_roofline_priced_and_listed(synthetic) -> None:
    both, bf16_only = synthetic
    roof = RooflinePricer(H100)
    fp8_all = SHAPE.with_precision(Precision("fp8", "fp8"))
    pricing = Pricing(fp8_all, 1, roof, bf16_only)
    m = np.array([1.0, 512.0, 8192.0])
    nk = pricing._nk(OpKind.MLP_UP)
    as_fp8 = OpBatch.make(OpKind.MLP_UP, 2.0, weight_dtype_bytes=1.0, num_tokens=m, **nk)
    np.testing.assert_array_equal(
        pricing.price_ms(OpKind.MLP_UP, num_tokens=m, **nk), roof.predict_ms(as_fp8)
    )
    # The LM head stays 16-bit: the learned bf16 GEMM prices it.
    head = pricing._nk(OpKind.LM_HEAD)
    np.testing.assert_array_equal(
        pricing.lm_head_ms(m), bf16_only.predict_ms(OpBatch.make(OpKind.GEMM, num_tokens=m, **head))
    )
    fp8_ops = {"qkv_proj:fp8", "attn_out_proj:fp8", "mlp_up:fp8", "mlp_down:fp8"}
    estimated = set(pricing.estimated_ops())
    assert fp8_ops | {"prefill_attn:fp8", "decode_attn:fp8"} <= estimated
    assert "lm_head" not in estimated and "qkv_proj" not in estimated
    table = compile_learned(fp8_all, bf16_only, 1, grid=GRID)
    assert set(table.estimated_ops) == estimated and table.precision == "w-fp8.kv-fp8"
    assert not table.is_estimate
    # With an FP8 GEMM variant the projections are learned again.
    assert not fp8_ops & set(Pricing(fp8_all, 1, roof, both).estimated_ops())
    # The bf16 shape's table is the one it always was (nothing FP8 in it).
    plain = compile_learned(SHAPE, bf16_only, 1, grid=GRID)
    assert plain.precision == DEFAULT_PRECISION.label
    assert not any(op.endswith(":fp8") for op in plain.estimated_ops)


def test_roofline_tables_per_precision_and_catalog_keys() -> None:
    reach = TableReach(max_tokens=4096, max_batch=64, max_q=4096, max_kv=32_768)
    catalog = LatencyCatalog(SHAPE)
    tables = {
        p: catalog.for_instance("h200", 1, reach, precision=p)
        for p in (DEFAULT_PRECISION, Precision("fp8", "auto"), Precision("fp8", "fp8"))
    }
    bf16, w8, all8 = tables.values()
    assert [t.precision for t in tables.values()] == ["w-none.kv-auto", "w-fp8.kv-auto",
                                                      "w-fp8.kv-fp8"]  # fmt: skip
    # Batch-1 decode is bandwidth-bound throughout: FP8 weights save one byte per linear
    # parameter (6.98e9 for Llama-3.1-8B) at 4.8 TB/s x 0.8, i.e. 1.82 ms; the LM head,
    # attention and kernel launches cost the same in both. The engine's exposed time per
    # sequence is its share of each table's one-token forward: it shrinks with the bytes.
    one = StepLoad(1, 1, (), (), 1, 1000)
    saved_s = SHAPE.num_linear_params / (4.8e12 * 0.8)
    assert bf16.kernel_time_s(one) - w8.kernel_time_s(one) == pytest.approx(saved_s, rel=1e-6)
    assert bf16.forward_s - w8.forward_s == pytest.approx(saved_s, rel=1e-6)
    share = bf16.overhead.per_seq_s / bf16.forward_s
    assert w8.overhead.per_seq_s == pytest.approx(share * w8.forward_s, rel=1e-9)
    # 64 decodes over 30k keys: an FP8 KV cache saves one byte per K and V element read,
    # 2 x 32 layers x 64 x 30,000 x 8 heads x 128 (interpolated on the KV grid: 1%).
    long = StepLoad(64, 64, (), (), 64, 64 * 30_000)
    saved_s = 2 * 32 * 64 * 30_000 * 8 * 128 / (4.8e12 * 0.8)
    gap = w8.step_time_s(long) - all8.step_time_s(long)
    assert gap == pytest.approx(saved_s, rel=0.01)
    assert table_from_bytes(table_to_bytes(all8)) == all8
    # A100: FP8 weights shrink the bytes but not the compute of a large prefill.
    a_bf16 = compile_roofline(SHAPE, A100, 1, grid=GRID)
    a_fp8 = compile_roofline(FP8_WEIGHTS, A100, 1, grid=GRID)
    prefill = StepLoad(8192, 1, (8192,), (8192,))
    assert a_fp8.step_time_s(prefill) == pytest.approx(a_bf16.step_time_s(prefill), rel=1e-3)
    saved_s = SHAPE.num_linear_params / (2.0e12 * 0.8)  # but its bytes, as on the H200
    gap = a_bf16.kernel_time_s(one) - a_fp8.kernel_time_s(one)
    assert gap == pytest.approx(saved_s, rel=1e-6)


# -- persistence --------------------------------------------------------------------------


def test_fp8_variants_persist_and_payloads_without_them_still_load(synthetic) -> None:
    both, bf16_only = synthetic
    restored = load_model(dump_model(both), PAYLOAD_SCHEMA_VERSION)
    assert set(restored.fp8_ops) == {OpKind.GEMM} and restored.fp8_ops[OpKind.GEMM].fp8
    m = np.array([1.0, 100.0, 5000.0])
    for w in (None, 1.0):
        batch = OpBatch.make(OpKind.GEMM, weight_dtype_bytes=w, num_tokens=m, n=4096, k=4096)
        np.testing.assert_array_equal(restored.predict_ms(batch), both.predict_ms(batch))
    assert "gemm:fp8:flops,bytes,log-shape v2" in feature_names(both)
    # A version-3 payload as written before FP8 variants existed: no fp8_ops part.
    g = bf16_only.ops[OpKind.GEMM]
    row = ("gemm", g.coef, g.residual, g.dtype_bytes, g.num_samples, g.models, g.num_gpus,
           g.square_attention, g.feature_version)  # fmt: skip
    parts = {"accelerator": "h100", "source": "synthetic", "ops": [row],
             "overhead_s": 0.001, "num_mixed": 3, "op_scale": 1.1}  # fmt: skip
    old = load_model(_MAGIC + pickle.dumps((3, parts)), 3)
    assert old.fp8_ops == {} and old.op_names() == ("gemm",)
    assert (old.overhead_s, old.num_mixed, old.op_scale) == (0.001, 3, 1.1)
    batch = OpBatch.make(OpKind.GEMM, num_tokens=m, n=4096, k=4096)
    np.testing.assert_array_equal(old.predict_ms(batch), bf16_only.predict_ms(batch))
    # and a bf16-only model still writes exactly that layout
    _, written = pickle.loads(dump_model(bf16_only)[len(_MAGIC) :])
    assert set(written) == set(parts)
    # Its FP8 shapes then fall back to the roofline for the projections.
    table = compile_learned(FP8_WEIGHTS, replace(old, overhead_s=0.0), 1, grid=GRID)
    assert "mlp_down:fp8" in table.estimated_ops


# -- on the real H100 tables --------------------------------------------------------------


@pytest.fixture(scope="module")
def h100_model(shared_data: Path):
    """A fit of a seeded sample of AIConfigurator's H100 GEMM and attention rows, 16-bit
    and FP8 (6,000 rows per operator and format, to keep the test quick)."""
    from profiler.importers import ImportFormat, import_profile

    profile = import_profile(
        shared_data / "profiles" / "aiconfigurator" / "h100_sxm", ImportFormat.AICONFIGURATOR
    )
    rng = np.random.default_rng(0)
    by_group: dict[tuple[OpKind, str], list[KernelSample]] = {}
    for s in profile.samples:
        by_group.setdefault((s.op, s.dtype), []).append(s)
    picked = [rows[i] for rows in by_group.values() for i in rng.permutation(len(rows))[:6000]]
    model = fit_latency_model(picked, accelerator="h100", source="aiconfigurator", options=FAST)
    return model, profile.samples


@pytest.mark.shared_data
def test_h100_fp8_gemm_model_is_faster_at_large_m(h100_model) -> None:
    model, samples = h100_model
    assert {OpKind.GEMM, OpKind.DECODE_ATTN, OpKind.PREFILL_ATTN} <= set(model.fp8_ops)
    measured = {
        (s.dtype, s.n, s.k): s.median_ms
        for s in samples
        if s.op is OpKind.GEMM and s.num_tokens == 8192
    }
    for n, k in ((8192, 8192), (16384, 4096), (4096, 16384)):
        params = {"num_tokens": 8192, "n": n, "k": k}
        bf16 = model.predict_ms(OpBatch.make(OpKind.GEMM, **params))[0]
        fp8 = model.predict_ms(OpBatch.make(OpKind.GEMM, weight_dtype_bytes=1.0, **params))[0]
        # measured at m = 8192: FP8 takes 0.54-0.65x the bf16 time on these shapes
        assert fp8 < 0.8 * bf16, (n, k, fp8, bf16)
        assert fp8 == pytest.approx(measured[("fp8", n, k)], rel=0.15)
        assert bf16 == pytest.approx(measured[("bfloat16", n, k)], rel=0.15)


@pytest.mark.shared_data
def test_h100_fp8_tables_price_prefill_and_long_decode_faster(h100_model) -> None:
    model, samples = h100_model
    bf16 = compile_learned(SHAPE, model, 1, grid=GRID)
    w8 = compile_learned(FP8_WEIGHTS, model, 1, grid=GRID)
    kv8 = compile_learned(FP8_KV, model, 1, grid=GRID)
    for table in (w8, kv8):  # every FP8 operator priced by a measured FP8 variant
        assert not any(op.endswith(":fp8") for op in table.estimated_ops)
    prefill = StepLoad(8192, 1, (8192,), (8192,))
    ratio = w8.step_time_s(prefill) / bf16.step_time_s(prefill)
    assert 0.6 < ratio < 0.9, ratio  # its GEMMs measured at 0.54-0.85x at m = 8192
    # 16 decodes over 32k keys: only attention differs, and the gap is what the measured
    # rows of this very kernel (16 x 32,768 keys, 32/8 heads of 128) say, over 32 layers.
    decode = StepLoad(16, 16, (), (), 16, 16 * 32_768)
    row = {
        s.dtype: s.median_ms
        for s in samples
        if s.op is OpKind.DECODE_ATTN
        and (s.batch_size, s.kv_len, s.num_heads, s.num_kv_heads, s.head_dim)
        == (16, 32_768, 32, 8, 128)
    }  # bf16 0.692 ms, fp8 0.378 ms per layer
    gap_ms = 1e3 * (bf16.step_time_s(decode) - kv8.step_time_s(decode))
    assert gap_ms == pytest.approx(32 * (row["bfloat16"] - row["fp8"]), rel=0.1)
    # FP8-KV attention is a little slower on short contexts (measured ~1.08x): no free lunch
    short = StepLoad(64, 64, (), (), 64, 64 * 64)
    assert kv8.step_time_s(short) >= 0.97 * bf16.step_time_s(short)


def test_in_memory_fp8_catalog_uses_the_fp8_variant(synthetic) -> None:
    both, _ = synthetic
    catalog = LatencyCatalog(SHAPE, {"h100": LoadedModel(both)})
    reach = TableReach(max_tokens=2048, max_batch=16, max_q=2048, max_kv=4096)
    w8 = catalog.for_instance("h100", 1, reach, precision=Precision("fp8", "auto"))
    bf16 = catalog.for_instance("h100", 1, reach)
    assert w8.precision == "w-fp8.kv-auto" and w8 is not bf16
    assert "qkv_proj:fp8" not in w8.estimated_ops
    load = StepLoad(2048, 1, (2048,), (2048,))
    assert w8.step_time_s(load) < bf16.step_time_s(load)
