"""Gated DeltaNet hybrid presets (Qwen3.5 / 3.6, Qwen3-Next) and the checkpoints people
deploy them from.

Three of every four layers are Gated DeltaNet linear attention (`GatedDeltaNetSpec`: a
fixed state per sequence, no KV cache), every fourth full attention whose query
projection also yields an output gate (`attn_output_gate`). Dimensions are those of
each model's Hugging Face `config.json` (its `text_config` for Qwen3.5 / 3.6, whose
checkpoints are vision-language: the vision tower, ~0.45B parameters, and the one-layer
MTP module are left out, as the text shape vLLM serves holds them apart). Torch-free.

Not here: nvidia/Qwen3.6-35B-A3B-NVFP4. Its ModelOpt config is MIXED_PRECISION: FP8
attention and Gated DeltaNet projections, NVFP4 routed and shared experts and LM head.
A shape holds one weight format over either every linear layer or the routed experts
only (`quantized_scope`), and keeps the LM head in the activation dtype, so neither
scope describes it (`load_hf_config` refuses its quant_algo).
"""

from __future__ import annotations

from optimizer.model_shape import ModelShape
from optimizer.moe_presets import Checkpoint
from optimizer.shape_parts import GatedDeltaNetSpec, MoESpec

_QWEN35_VOCAB = 248320


def _qwen_hybrid(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    *,
    value_heads: int,
    intermediate: int,
    vocab: int = _QWEN35_VOCAB,
    moe: MoESpec | None = None,
    ssm_dtype: str = "float32",
) -> ModelShape:
    # Shared by the family: full attention every 4th layer (full_attention_interval 4)
    # with heads of 256 and an output gate; Gated DeltaNet of 16 key heads, value heads
    # of 128 (keys 128 wide), conv kernel 4; untied; bf16.
    return ModelShape(
        name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=256,
        intermediate_size=intermediate,
        vocab_size=vocab,
        moe=moe,
        attn_output_gate=True,
        gdn=GatedDeltaNetSpec(
            num_layers=layers - layers // 4,
            num_key_heads=16,
            num_value_heads=value_heads,
            key_head_dim=128,
            value_head_dim=128,
            conv_kernel=4,
            ssm_dtype=ssm_dtype,
        ),
    )


def _qwen35_moe(name: str, layers: int, hidden: int, heads: int, value_heads: int, moe):
    # Qwen3.5-MoE text_config: 2 KV heads, no dense layer (mlp_only_layers [], no
    # intermediate_size: the expert width stands in), shared expert as wide as a routed
    # one; mamba_ssm_dtype float32.
    width = moe.expert_intermediate_size
    return _qwen_hybrid(
        name, layers, hidden, heads, 2, value_heads=value_heads, intermediate=width, moe=moe
    )


GDN_PRESETS: dict[str, ModelShape] = {
    s.name: s
    for s in (
        # Qwen/Qwen3.5-27B config.json text_config: 64 layers (16 full, 48 GDN), hidden
        # 5120, 24 heads, 4 KV heads, dense MLP 17408, 48 value heads, mamba_ssm_dtype
        # float32 (aic-core model_configs/Qwen--Qwen3.5-27B_config.json).
        _qwen_hybrid("qwen3.5-27b", 64, 5120, 24, 4, value_heads=48, intermediate=17408),
        # Qwen/Qwen3.5-35B-A3B text_config: 40 layers (10 full, 30 GDN), hidden 2048, 16
        # heads, 256 experts 512 wide, top-8, shared 512, 32 value heads. Qwen3.6-35B-A3B
        # has the same config (nvidia--Qwen3.6-35B-A3B-NVFP4_config.json's text_config).
        _qwen35_moe("qwen3.5-35b-a3b", 40, 2048, 16, 32, MoESpec(256, 8, 512, 512)),
        _qwen35_moe("qwen3.6-35b-a3b", 40, 2048, 16, 32, MoESpec(256, 8, 512, 512)),
        # Qwen/Qwen3.5-122B-A10B: 48 layers (12 full, 36 GDN), hidden 3072, 32 heads, 256
        # experts 1024 wide, top-8, shared 1024, 64 value heads.
        _qwen35_moe("qwen3.5-122b-a10b", 48, 3072, 32, 64, MoESpec(256, 8, 1024, 1024)),
        # Qwen/Qwen3.5-397B-A17B: 60 layers (15 full, 45 GDN), hidden 4096, 32 heads, 512
        # experts 1024 wide, top-10, shared 1024, 64 value heads.
        _qwen35_moe("qwen3.5-397b-a17b", 60, 4096, 32, 64, MoESpec(512, 10, 1024, 1024)),
        # Qwen/Qwen3-Next-80B-A3B-Instruct config.json: 48 layers (full_attention_interval
        # 4: 12 full, 36 GDN), hidden 2048, 16 heads of 256, 2 KV heads, 512 experts 512
        # wide, top-10, shared 512, dense width 5120 (unused: every layer MoE), 32 value
        # heads, vocab 151,936; no attn_output_gate key (vLLM gates by default) and no
        # mamba_ssm_dtype (vLLM keeps the state in bf16). A one-layer model print of the
        # same config counts 1,648,531,648 parameters in its GDN + MoE decoder layer, as
        # here plus the 2,048-wide shared-expert gate.
        _qwen_hybrid(
            "qwen3-next-80b-a3b",
            48,
            2048,
            16,
            2,
            value_heads=32,
            intermediate=5120,
            vocab=151936,
            moe=MoESpec(512, 10, 512, 512),
            ssm_dtype="bfloat16",
        ),
    )
}

GDN_HF_IDS: dict[str, str] = {
    "qwen3.5-27b": "Qwen/Qwen3.5-27B",
    "qwen3.5-35b-a3b": "Qwen/Qwen3.5-35B-A3B",
    "qwen3.6-35b-a3b": "Qwen/Qwen3.6-35B-A3B",
    "qwen3.5-122b-a10b": "Qwen/Qwen3.5-122B-A10B",
    "qwen3.5-397b-a17b": "Qwen/Qwen3.5-397B-A17B",
    "qwen3-next-80b-a3b": "Qwen/Qwen3-Next-80B-A3B-Instruct",
}

GDN_CHECKPOINTS: dict[str, Checkpoint] = {
    **{hf.lower(): Checkpoint(preset) for preset, hf in GDN_HF_IDS.items()},
    "qwen/qwen3-next-80b-a3b-thinking": Checkpoint("qwen3-next-80b-a3b"),
    # NVIDIA's ModelOpt NVFP4 releases: the routed experts in FP4 (groups of 16), an FP8
    # KV cache (hf_quant_config.json). (Qwen3.6-35B-A3B-NVFP4 is not here: docs/moe.md.)
    "nvidia/qwen3.5-122b-a10b-nvfp4": Checkpoint(
        "qwen3.5-122b-a10b", "fp4", "experts", kv_cache="fp8"
    ),
    "nvidia/qwen3.5-397b-a17b-nvfp4": Checkpoint(
        "qwen3.5-397b-a17b", "fp4", "experts", kv_cache="fp8"
    ),
}
