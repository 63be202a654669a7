"""Gated DeltaNet hybrid shapes (Qwen3.5 / 3.6, Qwen3-Next): parameters, weight bytes, KV
bytes and the fixed per-sequence state worked by hand, the tp rules, and bad shapes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from optimizer.dims import RankDims, check_tp, gemm_nk
from optimizer.records import OpKind
from optimizer.shapes import (
    PRESETS,
    GatedDeltaNetSpec,
    MLASpec,
    Precision,
    ShapeError,
    get_shape,
)

QWEN36 = PRESETS["qwen3.6-35b-a3b"]


def test_golden_qwen3_6_35b_a3b_bf16_tp1_and_tp4():
    """Qwen3.6-35B-A3B bf16 (as Qwen ships it), 40 layers: 10 full attention, 30 GDN.

    full attention / layer (gated queries): QKV 2048 x (2 x 16 + 2 x 2) x 256 = 18,874,368
      + out 16 x 256 x 2048 = 8,388,608 -> 27,262,976; x 10 = 272,629,760
    GDN / layer: key_dim 16 x 128 = 2,048, value_dim 32 x 128 = 4,096, conv_dim 8,192;
      in_proj_qkvz 2048 x 12,288 = 25,165,824 + in_proj_ba 2048 x 64 = 131,072 + out_proj
      4,096 x 2048 = 8,388,608 -> 33,685,504 (linear); x 30 = 1,010,565,120; conv1d
      8,192 x 4 = 32,768 + A_log, dt_bias 64 + norm 128 = 32,960; x 30 = 988,800
    experts 40 x 256 x (3 x 2048 x 512 = 3,145,728) = 32,212,254,720; shared 40 x
      3,145,728 = 125,829,120; router 40 x 2048 x 256 = 20,971,520; norms 40 x 2 x 2048 +
      2048 = 165,888; tables 2 x 248,320 x 2048 = 1,017,118,720
    total 34,660,523,648 -> weight bytes tp 1 = 69,321,047,296 (bf16)
    tp 4: (34,660,523,648 - 32,212,254,720) x 2 B / 4 = 1,224,134,464 + experts
      32,212,254,720 x 2 B / 4 = 16,106,127,360 -> 17,330,261,824
    KV / token (full layers only): 2 x 10 x 2 KV heads x 256 x 2 B = 20,480; tp 4: the 2
      KV heads replicate, 1 a GPU: 10,240
    GDN state / sequence: per layer 32 x 128 x 128 x 4 B (fp32) = 2,097,152 + conv 8,192 x
      3 x 2 B = 49,152 -> 2,146,304; x 30 = 64,389,120. tp 4: 8 x 128 x 128 x 4 = 524,288
      + 2,048 x 3 x 2 = 12,288 -> 536,576; x 30 = 16,097,280.
    """
    s = get_shape("Qwen/Qwen3.6-35B-A3B")
    assert s == QWEN36 and s.quantization == "none"
    assert (s.num_full_attention_layers, s.gdn.num_layers) == (10, 30)
    assert s.attention_params == 27_262_976
    assert s.gdn_layer_params == 33_685_504 + 32_960
    assert s.num_params == 34_660_523_648
    assert s.weight_bytes(1) == 69_321_047_296
    assert s.weight_bytes(4) == 17_330_261_824
    assert (s.kv_bytes_per_token(1), s.kv_bytes_per_token(4)) == (20_480, 10_240)
    assert s.gdn_state_bytes_per_sequence(1) == 64_389_120
    assert s.gdn_state_bytes_per_sequence(4) == 16_097_280


def test_one_qwen3_next_layer_matches_its_model_print():
    """A one-layer Qwen3-Next-80B-A3B (its config with num_hidden_layers 1) prints
    1,648,531,648 parameters in its GDN + MoE decoder layer: GDN 33,718,464 (as here),
    router 1,048,576, experts 512 x 3,145,728 = 1,610,612,736, shared expert 3,145,728,
    two norms 4,096, and the shared-expert gate of 2,048 this count leaves out."""
    s = PRESETS["qwen3-next-80b-a3b"]
    moe = s.router_params + s.routed_expert_params + s.shared_expert_params
    layer = s.gdn_layer_params + moe // s.num_moe_layers + 2 * s.hidden_size
    assert s.gdn_layer_params == 33_718_464
    assert layer + 2048 == 1_648_531_648
    # No mamba_ssm_dtype in its config: vLLM keeps the recurrent state in bf16.
    assert s.gdn.ssm_dtype == "bfloat16"
    assert s.gdn_state_bytes_per_sequence(1) == 36 * (32 * 128 * 128 * 2 + 8192 * 3 * 2)


def test_qwen3_5_27b_dense_hybrid():
    s = get_shape("Qwen/Qwen3.5-27B")
    assert not s.is_moe and (s.num_full_attention_layers, s.gdn.num_layers) == (16, 48)
    # Dense: every parameter runs for every token but the input embedding row lookup.
    assert s.num_active_params == s.num_params - s.embedding_params
    assert s.kv_bytes_per_token(1) == 2 * 16 * 4 * 256 * 2
    # conv_dim 2 x 2,048 + 48 x 128 = 10,240 channels, 1,280 a GPU at tp 8.
    assert s.gdn_state_bytes_per_sequence(8) == 48 * (6 * 128 * 128 * 4 + 1280 * 3 * 2)
    for hf in ("Qwen/Qwen3-Next-80B-A3B-Instruct", "qwen/qwen3-next-80b-a3b-thinking"):
        assert get_shape(hf).name == "qwen3-next-80b-a3b"


def test_quantisation_covers_the_gdn_projections_not_its_small_weights():
    """FP8 on every linear layer: GDN in_proj/out_proj at 1 B like attention's
    projections; conv1d, A_log, dt_bias and the gated norm stay 2 B with the norms."""
    fp8 = QWEN36.with_precision(Precision("fp8"))
    small = QWEN36.gdn.num_layers * QWEN36.gdn.small_params
    linear = 10 * 27_262_976 + 30 * 33_685_504 + 32_212_254_720 + 125_829_120
    assert fp8.num_linear_params == linear == QWEN36.num_linear_params
    rest = 20_971_520 + 165_888 + small + 1_017_118_720
    assert fp8.num_params == linear + rest
    assert fp8.weight_bytes(1) == linear + 2 * rest


def test_kv_per_sequence_uses_the_full_layers_only():
    """10 full layers of 2 KV heads x 256 x 2 (K, V) x 2 B = 2,048 B each per token: a
    sequence of 1,000 tokens holds 1,000 x 20,480 B on one GPU, however many GDN layers."""
    assert QWEN36.kv_bytes_per_sequence(1000) == 20_480_000
    no_gdn = replace(QWEN36, gdn=None)  # all 40 layers full attention
    assert no_gdn.kv_bytes_per_sequence(1000) == 4 * QWEN36.kv_bytes_per_sequence(1000)
    assert no_gdn.gdn_state_bytes_per_sequence(4) == 0
    assert no_gdn.num_full_attention_layers == 40 and no_gdn.gdn_layer_params == 0
    dense = get_shape("llama-3.1-8b")
    assert dense.num_full_attention_layers == 32 and dense.gdn_state_bytes_per_sequence() == 0


def test_the_output_gate_widens_the_query_projection():
    gated = replace(PRESETS["qwen3-8b"], attn_output_gate=True)
    plain = PRESETS["qwen3-8b"]
    assert gated.attention_params - plain.attention_params == 4096 * 32 * 128
    n, k = gemm_nk(OpKind.QKV_PROJ, RankDims.of(gated, 2))
    assert (n, k) == ((2 * 16 + 2 * 4) * 128, 4096)
    assert gemm_nk(OpKind.QKV_PROJ, RankDims.of(plain, 2)) == ((16 + 2 * 4) * 128, 4096)
    assert gemm_nk(OpKind.ATTN_OUT_PROJ, RankDims.of(gated, 2)) == (4096, 16 * 128)


def test_tp_must_split_the_deltanet_heads():
    """vLLM divides the GDN key and value heads by tp: 16 / 32 split over tp 8, while 6 key
    heads do not split over tp 4 although the attention's 16 heads (2 KV heads,
    replicated) do."""
    shape = replace(QWEN36, gdn=replace(QWEN36.gdn, num_key_heads=6, num_value_heads=12))
    check_tp(QWEN36, 8)
    with pytest.raises(ValueError, match="gdn num_key_heads 6 / num_value_heads 12"):
        check_tp(shape, 4)
    with pytest.raises(ShapeError, match="tp 4 must divide gdn num_key_heads"):
        shape.gdn_state_bytes_per_sequence(4)
    assert shape.gdn_state_bytes_per_sequence(2) > 0


def test_the_spec_widths():
    spec = GatedDeltaNetSpec(num_layers=3, num_key_heads=4, num_value_heads=8,
                             key_head_dim=64, value_head_dim=32, conv_kernel=3)  # fmt: skip
    assert (spec.key_dim, spec.value_dim, spec.conv_dim) == (256, 256, 768)
    assert spec.projection_params(100) == 100 * (512 + 512) + 100 * 16 + 256 * 100
    assert spec.small_params == 768 * 3 + 16 + 32
    assert spec.state_bytes(2, 2) == 4 * 64 * 32 * 4 + 384 * 2 * 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"num_value_heads": 24},
            r"gdn: num_value_heads \(24\) must be a multiple of "
            r"num_key_heads \(16\)",
        ),
        ({"key_head_dim": 0}, r"gdn: key_head_dim must be a positive integer, got 0"),
        ({"conv_kernel": True}, r"gdn: conv_kernel must be a positive integer, got True"),
        ({"ssm_dtype": "fp8"}, r"gdn: ssm_dtype 'fp8' is not one of float32"),
        (
            {"num_layers": 40},
            r"gdn: num_layers \(40\) must leave at least one of the model's "
            r"40 layers full attention",
        ),
    ],
)
def test_bad_specs_say_what_is_wrong(change, message):
    with pytest.raises(ShapeError, match=message):
        replace(QWEN36, gdn=replace(QWEN36.gdn, **change))


def test_gdn_does_not_combine_with_mla_or_sliding_windows():
    with pytest.raises(ShapeError, match="gdn and sliding_window together are not modelled"):
        replace(QWEN36, sliding_window=128, sliding_window_layers=5)
    mla = MLASpec(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
    with pytest.raises(ShapeError, match="gdn and mla together are not modelled"):
        replace(QWEN36, mla=mla, attn_output_gate=False)
    with pytest.raises(ShapeError, match="attn_output_gate and mla"):
        replace(QWEN36, mla=mla, gdn=None)
    with pytest.raises(ShapeError, match="gdn must be a GatedDeltaNetSpec, got 30"):
        replace(QWEN36, gdn=30)
    with pytest.raises(ShapeError, match="attn_output_gate must be a bool, got 1"):
        replace(QWEN36, attn_output_gate=1)
