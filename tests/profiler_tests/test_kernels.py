"""Operator kernels: output shapes, hand-checked values, and the recorded GEMM shapes."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from optimizer.dims import RankDims, check_tp, sample_nk
from optimizer.records import OpKind
from optimizer.shapes import get_shape
from profiler import kernels
from profiler.cases import Case, build_call, case_sample
from profiler.timing import Timing

TINY = get_shape("tiny")  # h=256, a=8, g=2, d=32, f=768, V=4096
CPU = torch.device("cpu")


def test_elementwise_golden_values() -> None:
    x = torch.tensor([[3.0, 4.0]])
    # RMS of (3, 4) = sqrt(12.5); weight 2 doubles it.
    expected = torch.tensor([[3.0, 4.0]]) / math.sqrt(12.5) * 2
    assert torch.allclose(kernels.rms_norm(x, torch.full((2,), 2.0)), expected, atol=1e-5)
    gate_up = torch.tensor([[0.0, 1.0, 5.0, 7.0]])  # gate (0, 1), up (5, 7)
    silu1 = 1.0 / (1.0 + math.exp(-1.0))
    assert torch.allclose(kernels.silu_and_mul(gate_up), torch.tensor([[0.0, 7.0 * silu1]]))
    assert torch.equal(kernels.residual_add(x, x), 2 * x)


def test_rope_is_identity_at_position_zero_and_keeps_norms() -> None:
    x = torch.randn(3, 4, 8)
    cos, sin = kernels.rope_tables(torch.tensor([0, 5, 9]), 8)
    y = kernels.rope(x, cos, sin)
    assert y.shape == x.shape
    assert torch.allclose(y[0], x[0])
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    # Position 1, lowest frequency pair (theta = 1): (1, 0) rotates to (cos 1, sin 1).
    cos1, sin1 = kernels.rope_tables(torch.tensor([1]), 2)
    out = kernels.rope(torch.tensor([[[1.0, 0.0]]]), cos1, sin1)
    assert torch.allclose(out, torch.tensor([[[math.cos(1.0), math.sin(1.0)]]]))


def _reference_attention(q, k, v):
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    q_len, kv_len = q.shape[2], k.shape[2]
    allowed = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize(("q_len", "kv_len"), [(5, 5), (5, 12), (1, 7), (4, 9)])
def test_attention_is_bottom_right_causal_gqa(q_len: int, kv_len: int) -> None:
    q = torch.randn(2, 8, q_len, 16)
    k, v = torch.randn(2, 2, kv_len, 16), torch.randn(2, 2, kv_len, 16)
    out = kernels.prefill_attention(q, k, v)
    assert out.shape == (2, 8, q_len, 16)
    assert torch.allclose(out, _reference_attention(q, k, v), atol=1e-5)
    assert torch.allclose(kernels.verify_attention(q, k, v), out)
    if q_len == 1:
        assert torch.allclose(kernels.decode_attention(q, k, v), out, atol=1e-6)


def test_write_kv_fills_the_tail() -> None:
    cache = torch.zeros(1, 1, 5, 2)
    kernels.write_kv(cache, torch.ones(1, 1, 2, 2))
    assert cache[0, 0, :, 0].tolist() == [0, 0, 0, 1, 1]


def test_gemm_embedding_lm_head_shapes() -> None:
    assert kernels.gemm(torch.randn(7, 256), torch.randn(384, 256)).shape == (7, 384)
    table = torch.randn(4096, 256)
    ids = torch.tensor([0, 4095, 17])
    assert torch.equal(kernels.embedding(ids, table), table[ids])
    assert kernels.lm_head(torch.randn(3, 256), table).shape == (3, 4096)
    assert F.gelu(torch.zeros(1)).item() == 0.0


# Hand-worked per-rank (n, k) for the tiny shape.
@pytest.mark.parametrize(
    ("op", "tp", "nk"),
    [
        (OpKind.QKV_PROJ, 1, (384, 256)),  # (8 + 2·2)·32
        (OpKind.QKV_PROJ, 2, (192, 256)),  # (4 + 2·1)·32
        (OpKind.QKV_PROJ, 4, (128, 256)),  # (2 + 2·1)·32, KV heads replicated
        (OpKind.ATTN_OUT_PROJ, 2, (256, 128)),
        (OpKind.MLP_UP, 1, (1536, 256)),
        (OpKind.MLP_UP, 2, (768, 256)),
        (OpKind.MLP_DOWN, 2, (256, 384)),
        (OpKind.LM_HEAD, 2, (2048, 256)),
        (OpKind.EMBEDDING, 2, (256, 2048)),
        (OpKind.ACTIVATION, 2, (384, 0)),
        (OpKind.ROPE, 2, (160, 0)),  # (4 + 1)·32
        (OpKind.NORM, 1, (256, 0)),
        (OpKind.DECODE_ATTN, 2, (0, 0)),
    ],
)
def test_recorded_gemm_shapes(op: OpKind, tp: int, nk: tuple[int, int]) -> None:
    assert sample_nk(op, RankDims.of(TINY, tp)) == nk


@pytest.mark.parametrize(
    ("case", "out_shape"),
    [
        (Case(OpKind.QKV_PROJ, tp=2, num_tokens=5), (5, 192)),
        (Case(OpKind.ATTN_OUT_PROJ, tp=1, num_tokens=5), (5, 256)),
        (Case(OpKind.MLP_UP, tp=1, num_tokens=3), (3, 1536)),
        (Case(OpKind.MLP_DOWN, tp=4, num_tokens=3), (3, 256)),
        (Case(OpKind.NORM, num_tokens=4), (4, 256)),
        (Case(OpKind.ADD, num_tokens=4), (4, 256)),
        (Case(OpKind.ACTIVATION, tp=2, num_tokens=4), (4, 384)),
        (Case(OpKind.EMBEDDING, tp=2, num_tokens=6), (6, 256)),
        (Case(OpKind.LM_HEAD, tp=1, num_tokens=2), (2, 4096)),
        (Case(OpKind.PREFILL_ATTN, tp=1, batch_size=2, q_len=8, kv_len=24), (2, 8, 8, 32)),
        (Case(OpKind.DECODE_ATTN, tp=2, batch_size=3, q_len=1, kv_len=10), (3, 4, 1, 32)),
        (Case(OpKind.VERIFY_ATTN, tp=1, batch_size=2, q_len=4, kv_len=10), (2, 8, 4, 32)),
    ],
)
def test_built_calls_produce_the_documented_shapes(case: Case, out_shape: tuple) -> None:
    out = build_call(case, TINY, CPU, torch.float32)()
    assert tuple(out.shape) == out_shape


def test_rope_call_rotates_q_and_k() -> None:
    q, k = build_call(Case(OpKind.ROPE, tp=2, num_tokens=3), TINY, CPU, torch.float32)()
    assert q.shape == (3, 4, 32) and k.shape == (3, 1, 32)


def test_case_sample_fields() -> None:
    timing = Timing(median_ms=2.0, p10_ms=1.0, p90_ms=3.0, num_repeats=9)
    s = case_sample(Case(OpKind.PREFILL_ATTN, tp=2, batch_size=2, q_len=8, kv_len=24), TINY, timing)
    assert (s.batch_size, s.q_len, s.kv_len, s.num_tokens) == (2, 8, 24, 16)
    assert (s.num_heads, s.num_kv_heads, s.head_dim, s.tp) == (4, 1, 32, 2)
    assert (s.model, s.dtype, s.median_ms, s.num_repeats) == ("tiny", "float32", 2.0, 9)
    g = case_sample(Case(OpKind.MLP_DOWN, tp=2, num_tokens=64), TINY, timing)
    assert (g.num_tokens, g.n, g.k, g.num_heads, g.batch_size) == (64, 256, 384, 0, 0)


def test_bad_cases_are_rejected() -> None:
    with pytest.raises(ValueError, match="num_heads 8 is not a multiple"):
        check_tp(TINY, 3)
    with pytest.raises(ValueError, match="q_len <= kv_len"):
        build_call(
            Case(OpKind.PREFILL_ATTN, batch_size=1, q_len=9, kv_len=4), TINY, CPU, torch.float32
        )
    with pytest.raises(ValueError, match="cannot be profiled"):
        kernels.torch_dtype("fp8")


def test_fp8_gemm_matches_a_float64_reference() -> None:
    """W8A8 with per-tensor scales: the error is FP8 rounding (~4%), not a wrong layout."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=gen)
    w = torch.randn(96, 256, generator=gen) * 0.05
    sx, sw = x.abs().max() / 448, w.abs().max() / 448
    out = kernels.gemm_fp8(
        (x / sx).to(kernels.FP8), (w / sw).to(kernels.FP8), sx.float(), sw.float()
    )
    ref = x.double() @ w.double().t()
    assert out.dtype == torch.bfloat16 and out.shape == (64, 96)
    assert float((out.double() - ref).norm() / ref.norm()) < 0.08


def test_fp8_shape_profiles_projections_in_fp8_and_the_rest_in_its_dtype() -> None:
    shape = dataclasses.replace(get_shape("tiny"), dtype="bfloat16", quantization="fp8")
    timing = Timing(1.0, 1.0, 1.0, 1)
    for op in (OpKind.QKV_PROJ, OpKind.MLP_DOWN):
        case = Case(op, num_tokens=8)
        out = build_call(case, shape, torch.device("cpu"), torch.bfloat16)()
        assert out.dtype == torch.bfloat16 and out.shape[0] == 8
        assert case_sample(case, shape, timing).dtype == "fp8"
    for op in (OpKind.LM_HEAD, OpKind.NORM):
        assert case_sample(Case(op, num_tokens=8), shape, timing).dtype == "bfloat16"
