"""MoE, MLA and 4-bit shapes: parameter counts against the published ones, weight and
KV-cache bytes per GPU worked by hand, and the number formats' bytes per weight."""

from __future__ import annotations

from dataclasses import replace

import pytest

from optimizer.parallel import DENSE_LAYOUT, ExpertLayout
from optimizer.shapes import PRESETS, MoESpec, Precision, ShapeError, get_shape

# Published (total, active) parameters in billions, the half-unit of their last digit
# (the rounding they carry) and how many embedding tables (input embedding, LM head) the
# publisher counts among the active parameters: `num_active_params` counts the LM head
# only (1; the input embedding is a row lookup), 2 adds the input embedding, 0 takes the
# LM head out too.
#   gpt-oss: OpenAI's model card, 116.8B / 5.1B (20.9B / 3.6B), embedding not active.
#   Qwen3: model cards, 30.5B / 3.3B and 235B / 22B, embedding counted.
#   DeepSeek-V3: README_WEIGHTS, 671B / 36.6B "including 0.9B for the output head", no MTP.
#   Kimi-K2: tech report 1.04T / 32B; MiniMax-M2: 230B / 10B (transformers docs);
#   Llama-4-Scout: 109B / 17B, its vision encoder (~1.7B) not in the text shape.
#   Qwen3.5 / 3.6 (names and model cards: 27B dense; 35B-A3B, 122B-A10B, 397B-A17B): both
#   tables active (the only count that rounds to every A-figure: 3.46B, 9.77B, 17.35B;
#   the LM head alone gives 2.95B, 9.01B, 16.33B). The totals compared are the text model
#   alone: the checkpoints are vision-language and their vision tower (27 ViT blocks of
#   width 1152 and the merger, ~0.45B: 1.7% of 27B, 1.3% of 35B, under 0.4% of the
#   others) is not in the shape. Whether Qwen's figures include it the rounding does not
#   settle (397B sits nearer text + vision, 396.8B, than the text alone, 396.3B; 122B
#   nearer the text alone, 122.1B, than with it, 122.6B); the text alone is within 1%
#   of every published total, with the tower within 1.4%. The MTP module (one more
#   decoder layer, 2.5B in 122B-A10B) is out of both.
#   Qwen3-Next-80B-A3B: model card 80B / 3B, which only the count without either table
#   (3.25B) rounds to; with both it is 3.87B. Its total 79.674B is that of the
#   Hub's count for the same architecture's Qwen3-Coder-Next (79,674,391,296) less the
#   shared-expert gates and QK norms (104,448).
PUBLISHED = {
    "gpt-oss-120b": (116.8, 5.1, 0.05, 1),
    "gpt-oss-20b": (20.9, 3.6, 0.05, 1),
    "qwen3-30b-a3b": (30.5, 3.3, 0.05, 2),
    "qwen3-235b-a22b": (235, 22, 0.5, 2),
    "deepseek-v3": (671, 36.6, 0.05, 1),
    "deepseek-r1": (671, 36.6, 0.05, 1),
    "deepseek-v3.2": (671, 37, 1, 1),
    "glm-5": (744, 40, 1, 1),
    "kimi-k2": (1040, 32, 5, 1),
    "minimax-m2": (230, 10, 0.5, 1),
    "llama-4-scout": (109, 17, 0.5, 2),
    "llama-4-maverick": (400, 17, 0.5, 2),
    "qwen3-coder-480b-a35b": (480, 35, 0.5, 2),
    "mixtral-8x7b": (46.7, 12.9, 0.05, 2),
    "mixtral-8x22b": (141, 39, 0.5, 2),
    "qwen3.5-27b": (27, 27, 0.5, 2),
    "qwen3.5-35b-a3b": (35, 3, 0.5, 2),
    "qwen3.6-35b-a3b": (35, 3, 0.5, 2),
    "qwen3.5-122b-a10b": (122, 10, 0.5, 2),
    "qwen3.5-397b-a17b": (397, 17, 0.5, 2),
    "qwen3-next-80b-a3b": (80, 3, 0.5, 0),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_ones(name):
    """Within 2% or the published figure's rounding, whichever is wider. Left out of the
    count: biases (gpt-oss: 0.04B), attention sinks, QK norms, shared-expert gates,
    DeepSeek's and Qwen's MTP layers and the vision encoders of Llama-4 (the 1.2% Scout
    is short) and Qwen3.5 / 3.6."""
    total, active, rounding, tables = PUBLISHED[name]
    shape = PRESETS[name]
    ours = shape.num_active_params + (tables - 1) * shape.embedding_params
    assert shape.num_params / 1e9 == pytest.approx(total, abs=max(0.02 * total, rounding))
    assert ours / 1e9 == pytest.approx(active, abs=max(0.02 * active, rounding))


def test_every_moe_and_hybrid_preset_is_checked_against_published_counts():
    checked = {n for n, s in PRESETS.items() if s.is_moe or s.gdn is not None}
    assert checked == set(PUBLISHED)


def test_golden_gpt_oss_120b_mxfp4_tp1():
    """gpt-oss-120b as shipped: MXFP4 routed experts, everything else bf16, one GPU.

    attention / layer: QKV 2880 x (64 + 2 x 8) x 64 = 14,745,600 + out 64 x 64 x 2880
      = 11,796,480 -> 26,542,080; x 36 layers = 955,514,880 (bf16: 1,911,029,760 B)
    experts: 36 x 128 x (3 x 2880 x 2880 = 24,883,200) = 114,661,785,600 weights
      x (0.5 + 1/32 = 17/32 B) = 60,914,073,600 B
    router 36 x 2880 x 128 = 13,271,040; norms 36 x 2 x 2880 + 2880 = 210,240; tables
      2 x 201,088 x 2880 = 1,158,266,880 -> 1,171,748,160 x 2 B = 2,343,496,320 B
    weight bytes = 1,911,029,760 + 60,914,073,600 + 2,343,496,320 = 65,168,599,680
    KV / token (all 36 layers counted in full, an upper bound) = 2 x 36 x 8 x 64 x 2 B
      = 73,728; active = 955,514,880 + 36 x 4 x 24,883,200 + 13,271,040 + 210,240 +
      LM head 579,133,440 = 5,131,310,400.
    """
    shape = get_shape("openai/gpt-oss-120b")
    assert (shape.quantization, shape.quantized_scope) == ("mxfp4", "experts")
    assert shape.num_params == 116_789_048_640
    assert shape.num_active_params == 5_131_310_400
    assert shape.weight_bytes(1) == 65_168_599_680
    assert shape.kv_bytes_per_token(1) == 73_728


def test_golden_qwen3_30b_a3b_bf16_tp2_dp2_expert_parallel():
    """Qwen3-30B-A3B bf16 at tp 2 with dp 2 and EP: 4 GPUs, 32 whole experts on each.

    attention / layer: QKV 2048 x (32 + 8) x 128 = 10,485,760 + out 32 x 128 x 2048 =
      8,388,608 -> 18,874,368; x 48 = 905,969,664
    router 48 x 2048 x 128 = 12,582,912; norms 48 x 2 x 2048 + 2048 = 198,656; tables
      2 x 151,936 x 2048 = 622,329,856
    split over tp 2: (905,969,664 + 12,582,912 + 198,656 + 622,329,856) x 2 B / 2
      = 1,541,081,088 B
    experts: 48 x 128 x (3 x 2048 x 768 = 4,718,592) = 28,991,029,248 x 2 B / 4 GPUs
      = 14,495,514,624 B
    weight bytes / GPU = 16,036,595,712; KV / token at tp 2: 2 x 48 x (4 / 2) x 128 x 2 B
      = 49,152.
    """
    shape = get_shape("qwen3-30b-a3b")
    ep = ExpertLayout(dp=2, expert_parallel=True)
    assert shape.weight_bytes(2, ep) == 16_036_595_712
    assert shape.weight_bytes(2, ExpertLayout(dp=2)) == 16_036_595_712  # tensor-split: same
    assert shape.kv_bytes_per_token(2) == 49_152


def test_golden_deepseek_v3_fp8_mla_tp8():
    """DeepSeek-V3 as shipped (block-scaled FP8 linear layers) at tp 8.

    attention / layer: query 7168 x 1536 + 1536 x 128 x 192 = 48,758,784; KV down
      7168 x (512 + 64) = 4,128,768; KV up 512 x 128 x (128 + 128) = 16,777,216; out
      128 x 128 x 7168 = 117,440,512 -> 187,105,280; x 61 = 11,413,422,080
    dense MLPs 3 x 3 x 7168 x 18432 = 1,189,085,184; shared experts 58 x 3 x 7168 x 2048
      = 2,554,331,136 -> FP8 linear outside the experts 15,156,838,400 B
    router 58 x 7168 x 256 = 106,430,464; norms 61 x (2 x 7168 + 1536 + 512) + 7168 =
      1,006,592; tables 2 x 129,280 x 7168 = 1,853,358,080 -> 1,960,795,136 x 2 B
    split over tp 8: (15,156,838,400 + 3,921,590,272) / 8 = 2,384,803,584 B
    experts: 58 x 256 x 44,040,192 = 653,908,770,816 x 1 B / 8 = 81,738,596,352 B
    weight bytes / GPU = 84,123,399,936; KV / token: 61 x (512 + 64) x 2 B = 70,272 on
    every TP rank (the latent is not split).
    """
    shape = get_shape("deepseek-ai/DeepSeek-V3")
    assert shape.num_params == 671_026_404_352
    assert shape.weight_bytes(8) == 84_123_399_936
    assert shape.kv_bytes_per_token(8) == shape.kv_bytes_per_token(1) == 70_272


def test_experts_shard_over_all_gpus_and_the_rest_over_tp():
    shape = get_shape("qwen3-235b-a22b")
    wide = shape.weight_bytes(2, ExpertLayout(dp=4, expert_parallel=True))
    # dp ranks replicate attention: more dp lowers only the expert share.
    assert shape.weight_bytes(8) < wide < shape.weight_bytes(2)
    assert shape.weight_bytes(1, DENSE_LAYOUT) == shape.weight_bytes()
    dense = get_shape("llama-3.1-8b")  # no experts: the layout changes nothing
    assert dense.weight_bytes(2, ExpertLayout(dp=4)) == dense.weight_bytes(2)


def test_four_bit_bytes_per_weight_include_their_scales():
    base = get_shape("qwen3-30b-a3b")
    widths = {q: base.with_precision(Precision(q)).weight_dtype_bytes for q in ("fp4", "mxfp4")}
    assert widths == {"fp4": 0.5625, "mxfp4": 0.53125}
    assert replace(base, quantization="int4", int4_group_size=128).weight_dtype_bytes == 0.515625
    assert base.weight_dtype_bytes == 2 and isinstance(base.weight_dtype_bytes, int)
    assert base.with_precision(Precision("fp8")).weight_dtype_bytes == 1
    # NVFP4 on every linear layer: all of them at 0.5625 B.
    fp4 = get_shape("nvidia/DeepSeek-R1-FP4")
    assert fp4.dense_weight_dtype_bytes == fp4.expert_weight_dtype_bytes == 0.5625
    rest = fp4.num_params - fp4.num_linear_params
    assert fp4.weight_bytes() == int(fp4.num_linear_params * 0.5625) + 2 * rest


def test_kimi_k2_thinking_quantises_only_the_routed_experts():
    instruct, thinking = get_shape("kimi-k2"), get_shape("moonshotai/Kimi-K2-Thinking")
    assert (thinking.quantization, thinking.quantized_scope) == ("int4", "experts")
    assert thinking.dense_weight_dtype_bytes == 2 and thinking.expert_weight_dtype_bytes == 0.5625
    routed = thinking.routed_expert_params
    others = thinking.num_params - routed
    assert thinking.weight_bytes() == others * 2 + routed * 9 // 16
    assert thinking.weight_bytes() < instruct.weight_bytes()  # FP8 everywhere: 1 B > 0.5625 B
    assert thinking.weight_bytes() / 1e9 == pytest.approx(594, abs=1)


def test_checkpoints_by_id_carry_their_formats():
    assert get_shape("Qwen/Qwen3-235B-A22B-FP8").quantization == "fp8"
    assert get_shape("qwen/qwen3-235b-a22b").quantization == "none"
    assert get_shape("deepseek-ai/DeepSeek-R1") == replace(
        get_shape("deepseek-v3"), name="deepseek-r1"
    )
    scout = get_shape("nvidia/Llama-4-Scout-17B-16E-Instruct-FP4")
    assert (scout.quantization, scout.quantized_scope, scout.kv_cache_dtype) == (
        "fp4",
        "linear",
        "auto",
    )
    assert get_shape("meta-llama/Llama-4-Scout-17B-16E-Instruct").quantization == "none"
    k25 = get_shape("moonshotai/Kimi-K2.5")  # K2's backbone, INT4 routed experts
    assert (k25.name, k25.quantization, k25.quantized_scope) == ("kimi-k2", "int4", "experts")
    m25 = get_shape("MiniMaxAI/MiniMax-M2.5")  # M2's architecture and FP8 weights
    assert m25 == get_shape("minimax-m2")


@pytest.mark.parametrize(
    ("hf_id", "preset", "scope"),
    [
        ("nvidia/Qwen3-235B-A22B-NVFP4", "qwen3-235b-a22b", "linear"),
        ("nvidia/DeepSeek-V3.1-NVFP4", "deepseek-v3", "linear"),
        ("nvidia/Kimi-K2.5-NVFP4", "kimi-k2", "experts"),
        ("nvidia/Kimi-K2.7-Code-NVFP4", "kimi-k2", "experts"),
        ("nvidia/MiniMax-M2.7-NVFP4", "minimax-m2", "experts"),
        ("nvidia/Qwen3.5-397B-A17B-NVFP4", "qwen3.5-397b-a17b", "experts"),
    ],
)
def test_nvfp4_releases_carry_fp4_weights_and_their_fp8_kv_cache(hf_id, preset, scope):
    """ModelOpt NVFP4 checkpoints: the preset's dimensions, FP4 weights over the scope their
    exclusion list leaves, and the FP8 KV cache their hf_quant_config.json declares (which
    halves KV bytes per token against the 16-bit preset's)."""
    shape = get_shape(hf_id)
    base = get_shape(preset)
    assert (shape.name, shape.quantization, shape.quantized_scope) == (base.name, "fp4", scope)
    assert shape.kv_cache_dtype == "fp8" and base.kv_cache_dtype == "auto"
    assert shape.kv_bytes_per_token(1) * 2 == base.kv_bytes_per_token(1)
    assert shape.weight_bytes() < base.with_precision(Precision("fp8")).weight_bytes()


def test_vision_language_and_later_releases_resolve_to_their_text_architecture():
    assert get_shape("Qwen/Qwen3-VL-235B-A22B-Instruct") == get_shape("Qwen/Qwen3-235B-A22B")
    assert get_shape("Qwen/Qwen3-VL-30B-A3B-Instruct") == get_shape("qwen3-30b-a3b")
    assert get_shape("MiniMaxAI/MiniMax-M2.7") == get_shape("minimax-m2")
    assert get_shape("zai-org/GLM-5.2") == get_shape("glm-5")
    glm = get_shape("nvidia/GLM-5.1-NVFP4")  # FP4 experts; the indexer's cache stays FP8
    assert (glm.quantization, glm.quantized_scope, glm.kv_cache_dtype) == ("fp4", "experts", "fp8")
    assert glm.kv_bytes_per_token(1) == 78 * (576 + 132)
    assert get_shape("Qwen/Qwen3-VL-4B-Instruct") == get_shape("qwen3-4b")
    v31 = get_shape("deepseek-ai/DeepSeek-V3.1")
    assert v31.quantization == "fp8" and v31.moe == get_shape("deepseek-v3").moe


def test_another_format_covers_every_linear_layer():
    gpt = get_shape("gpt-oss-20b")
    assert gpt.with_precision(Precision("mxfp4", "fp8")).quantized_scope == "experts"
    fp8 = gpt.with_precision(Precision("fp8"))
    assert fp8.quantized_scope == "linear" and fp8.dense_weight_dtype_bytes == 1
    assert Precision("fp4").label == "w-fp4.kv-auto"
    assert Precision("fp8", "fp8").label == "w-fp8.kv-fp8"


def test_mla_and_sliding_window_kv_bytes():
    kimi = get_shape("kimi-k2")
    assert kimi.kv_bytes_per_token(8) == 61 * (512 + 64) * 2
    assert replace(kimi, kv_cache_dtype="fp8").kv_bytes_per_token(4) == 61 * 576
    gpt = get_shape("gpt-oss-20b")
    assert (gpt.sliding_window, gpt.sliding_window_layers) == (128, 12)
    # Upper bound: sliding layers counted as if they kept every token.
    assert gpt.kv_bytes_per_token(1) == replace(
        gpt, sliding_window=0, sliding_window_layers=0
    ).kv_bytes_per_token(1)
    assert gpt.kv_bytes_per_token(8) == 2 * 24 * 1 * 64 * 2


def test_sliding_layers_hold_only_their_window_per_sequence():
    """gpt-oss-20b at tp 1: 24 layers x 8 KV heads x 64 x 2 (K, V) x 2 B = 2,048 B per layer
    and token; 12 full layers hold all 10,000 tokens, 12 sliding ones their last 128:
    2,048 x (120,000 + 1,536) = 2,048 x 121,536 = 248,905,728 B."""
    gpt = get_shape("gpt-oss-20b")
    assert gpt.kv_bytes_per_sequence(10_000) == 248_905_728
    assert gpt.kv_bytes_per_sequence(100) == 100 * gpt.kv_bytes_per_token()  # within the window
    dense = get_shape("llama-3.1-8b")
    assert dense.kv_bytes_per_sequence(777, tp=2) == 777 * dense.kv_bytes_per_token(2)


def test_bad_shapes_say_what_is_wrong():
    dense = get_shape("llama-3.1-8b")
    with pytest.raises(ShapeError, match="quantized_scope 'experts' needs a MoE shape"):
        replace(dense, quantized_scope="experts")
    with pytest.raises(ShapeError, match="quantized_scope 'blocks' is not one of"):
        replace(get_shape("gpt-oss-20b"), quantized_scope="blocks")
    with pytest.raises(ShapeError, match="no MoE layer among 32 layers"):
        replace(dense, moe=MoESpec(8, 2, 1024, first_dense_layers=32))
    with pytest.raises(ShapeError, match="int4_group_size must be a positive integer"):
        replace(dense, int4_group_size=0)


def test_an_uneven_expert_split_counts_the_busiest_gpu():
    """128 experts over tp 2 x dp 3 = 6 GPUs with EP: vLLM gives the first 128 % 6 = 2 ranks
    22 experts and the others 21, so memory is sized for 22/128 of the routed experts (a
    tensor split instead spreads them evenly: 1/6 of them)."""
    shape = get_shape("qwen3-30b-a3b")
    ep = shape.weight_bytes(2, ExpertLayout(dp=3, expert_parallel=True))
    split = shape.weight_bytes(2, ExpertLayout(dp=3))
    rest = shape.weight_bytes(2, ExpertLayout(dp=3)) - shape.routed_expert_params * 2 // 6
    assert ep == rest + shape.routed_expert_params * 2 * 22 // 128
    assert ep > split


def test_sparse_attention_adds_its_indexer_to_weights_and_kv_cache():
    """DeepSeek-V3.2 is V3 plus, in each of its 61 layers, an indexer of 64 heads x 128:
    wq_b 1,536 x 8,192 + wk 7,168 x 128 + weights_proj 7,168 x 64 = 13,959,168 weights,
    851,509,248 in all; and per token and layer its FP8 key cache, 128 bytes and one
    4-byte scale, beside the MLA latent of 576 elements: 61 x (576 x 2 + 132) = 78,324
    bytes in bf16, the same on every TP rank."""
    v3, v32 = get_shape("deepseek-v3"), get_shape("deepseek-v3.2")
    assert v32.num_params - v3.num_params == 851_509_248
    assert v32.kv_bytes_per_token(1) == v32.kv_bytes_per_token(8) == 78_324
    assert replace(v32, kv_cache_dtype="fp8").kv_bytes_per_token(8) == 61 * (576 + 132)
    # vLLM replicates the indexers: at TP 8 each GPU holds all 0.85B of their FP8 weights.
    assert v32.indexer_params == 851_509_248
    assert v32.weight_bytes(8) - v3.weight_bytes(8) == 851_509_248
    with pytest.raises(ShapeError, match=r"dsa .*needs MLA with a query latent"):
        replace(get_shape("qwen3-30b-a3b"), dsa=v32.dsa)
