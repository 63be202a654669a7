"""Mixture-of-experts presets and the checkpoints people deploy them from.

Each preset is the model as its canonical checkpoint ships (gpt-oss: MXFP4 routed
experts, the rest bf16; DeepSeek, Kimi-K2-Instruct and MiniMax-M2: block-scaled FP8,
counted as "fp8"); `MOE_CHECKPOINTS` maps further Hugging Face ids (case-folded) to a
preset and that checkpoint's weight format. Dimensions are those of each model's
Hugging Face `config.json`, as cited beside each preset (read through the code search
of public repositories that quote or load them). Torch-free. The Gated DeltaNet hybrids
(Qwen3.5 / 3.6 MoE, Qwen3-Next) are in `optimizer.gdn_presets`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from optimizer.model_shape import ModelShape
from optimizer.shape_parts import DEFAULT_INT4_GROUP_SIZE, DSASpec, MLASpec, MoESpec


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A Hugging Face checkpoint: the preset of its dimensions, how its weights are stored
    (`quantization` over `scope`, with `int4_group_size` for INT4) and its KV cache."""

    preset: str
    quantization: str = "none"
    scope: str = "linear"
    int4_group_size: int = DEFAULT_INT4_GROUP_SIZE
    # The KV cache the checkpoint declares (ModelOpt's hf_quant_config.json
    # "kv_cache_quant_algo": "FP8"), which vLLM's --kv-cache-dtype auto runs.
    kv_cache: str = "auto"


def _gpt_oss(name: str, layers: int, experts: int) -> ModelShape:
    # openai/gpt-oss-{20b,120b} config.json (vLLM's GptOssConfig; EchoCog/gpt-oss-20b
    # docs/gpt-oss-20b-architecture.md): hidden 2880, 64 heads of 64, 8 KV heads, experts
    # 2880 wide (intermediate_size), top-4, vocab 201,088, untied; layer_types alternate
    # sliding (128 tokens) and full attention; quantization_config mxfp4 with
    # modules_to_not_convert self_attn, router, embed_tokens, lm_head.
    return ModelShape(
        name,
        num_layers=layers,
        hidden_size=2880,
        num_heads=64,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=2880,
        vocab_size=201088,
        quantization="mxfp4",
        quantized_scope="experts",
        moe=MoESpec(num_experts=experts, experts_per_token=4, expert_intermediate_size=2880),
        sliding_window=128,
        sliding_window_layers=layers // 2,
    )


def _qwen3_moe(
    name: str, layers: int, hidden: int, heads: int, dense: int, expert: int,
    experts: int = 128, kv_heads: int = 4,
) -> ModelShape:  # fmt: skip
    # Qwen3-MoE config.json: top-8 of `experts` (128 unless said), `kv_heads` KV heads of
    # 128 (4 unless said), vocab 151,936, no shared experts, every layer MoE
    # (decoder_sparse_step 1, mlp_only_layers []).
    return ModelShape(
        name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=128,
        intermediate_size=dense,
        vocab_size=151936,
        moe=MoESpec(num_experts=experts, experts_per_token=8, expert_intermediate_size=expert),
    )


def _mixtral(name: str, layers: int, hidden: int, heads: int, expert: int) -> ModelShape:
    # MixtralForCausalLM config.json: 8 experts (num_local_experts), top-2, 8 KV heads of
    # 128, vocab 32,000, untied, no sliding window (null), every layer MoE.
    return ModelShape(
        name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=expert,
        vocab_size=32000,
        moe=MoESpec(num_experts=8, experts_per_token=2, expert_intermediate_size=expert),
    )


# DeepSeek-V3 / R1 and Kimi-K2 latent attention (config.json: kv_lora_rank 512,
# q_lora_rank 1536, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128).
_DEEPSEEK_MLA = MLASpec(
    kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=1536
)


def _deepseek(name: str, heads: int, experts: int, first_dense: int, vocab: int) -> ModelShape:
    # 61 layers, hidden 7168, dense MLP 18432, experts 2048 wide, top-8, one shared
    # expert (n_shared_experts 1 x 2048), untied; FP8 with weight_block_size [128, 128].
    # The MTP layer (num_nextn_predict_layers 1) is left out.
    return ModelShape(
        name,
        num_layers=61,
        hidden_size=7168,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=_DEEPSEEK_MLA.qk_head_dim,
        intermediate_size=18432,
        vocab_size=vocab,
        quantization="fp8",
        mla=_DEEPSEEK_MLA,
        moe=MoESpec(
            num_experts=experts,
            experts_per_token=8,
            expert_intermediate_size=2048,
            shared_intermediate_size=2048,
            first_dense_layers=first_dense,
        ),
    )


# meta-llama/Llama-4-Scout-17B-16E-Instruct config.json text_config: 48 layers, hidden
# 5120, 40 heads of 128, 8 KV heads, 16 experts 8192 wide (intermediate_size) plus one
# shared expert of 8192, top-1, every layer MoE (interleave_moe_layer_step 1), dense width
# intermediate_size_mlp 16384 (unused: no dense layer), vocab 202,048, bf16. The vision
# encoder is left out.
_LLAMA_4_SCOUT = ModelShape(
    "llama-4-scout",
    num_layers=48,
    hidden_size=5120,
    num_heads=40,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=16384,
    vocab_size=202048,
    moe=MoESpec(
        num_experts=16,
        experts_per_token=1,
        expert_intermediate_size=8192,
        shared_intermediate_size=8192,
    ),
)


MOE_PRESETS: dict[str, ModelShape] = {
    s.name: s
    for s in (
        _gpt_oss("gpt-oss-120b", layers=36, experts=128),
        _gpt_oss("gpt-oss-20b", layers=24, experts=32),
        # Qwen/Qwen3-30B-A3B config.json: 48 layers, hidden 2048, 32 heads, intermediate
        # 6144, moe_intermediate_size 768 (Qwen3-30B-A3B reference in the code search).
        _qwen3_moe("qwen3-30b-a3b", 48, 2048, 32, 6144, 768),
        # Qwen/Qwen3-235B-A22B config.json: 94 layers, hidden 4096, 64 heads, intermediate
        # 12288, moe_intermediate_size 1536 (THUDM/slime scripts/models/qwen3-235B-A22B.sh).
        _qwen3_moe("qwen3-235b-a22b", 94, 4096, 64, 12288, 1536),
        # Qwen/Qwen3-Coder-480B-A35B-Instruct config.json: 62 layers, hidden 6144, 96
        # heads, 8 KV heads, intermediate 8192, 160 experts of moe_intermediate_size 2560.
        _qwen3_moe("qwen3-coder-480b-a35b", 62, 6144, 96, 8192, 2560, experts=160, kv_heads=8),
        # mistralai/Mixtral-8x7B-v0.1: 32 layers, hidden 4096, 32 heads, experts 14336;
        # Mixtral-8x22B-v0.1: 56 layers, hidden 6144, 48 heads, experts 16384.
        _mixtral("mixtral-8x7b", 32, 4096, 32, 14336),
        _mixtral("mixtral-8x22b", 56, 6144, 48, 16384),
        # deepseek-ai/DeepSeek-V3 config.json: 128 heads, 256 routed experts,
        # first_k_dense_replace 3, vocab 129,280 (Megatron-Bridge deepseek_v3 yaml and a
        # quoted config.json in the code search); R1 has V3's architecture.
        _deepseek("deepseek-v3", heads=128, experts=256, first_dense=3, vocab=129280),
        _deepseek("deepseek-r1", heads=128, experts=256, first_dense=3, vocab=129280),
        # deepseek-ai/DeepSeek-V3.2 config.json: V3's dimensions and FP8 format with
        # DeepSeek sparse attention (index_n_heads 64, index_head_dim 128, index_topk 2048).
        replace(
            _deepseek("deepseek-v3.2", heads=128, experts=256, first_dense=3, vocab=129280),
            dsa=DSASpec(index_n_heads=64, index_head_dim=128, index_topk=2048),
        ),
        # zai-org/GLM-5 config.json (GlmMoeDsaForCausalLM): 78 layers, hidden 6144, 64
        # heads of MLA (q_lora_rank 2048, kv_lora_rank 512, qk_nope 192, rope 64, v 256),
        # 256 experts of 2048 (top-8) plus one shared, the first 3 layers dense of 12288,
        # vocab 154,880, untied, bf16; sparse attention with a 32-head indexer of 128
        # choosing 2,048 keys. The MTP layer is left out.
        ModelShape(
            "glm-5",
            num_layers=78,
            hidden_size=6144,
            num_heads=64,
            num_kv_heads=64,
            head_dim=256,
            intermediate_size=12288,
            vocab_size=154880,
            mla=MLASpec(
                kv_lora_rank=512,
                qk_rope_head_dim=64,
                qk_nope_head_dim=192,
                v_head_dim=256,
                q_lora_rank=2048,
            ),
            moe=MoESpec(
                num_experts=256,
                experts_per_token=8,
                expert_intermediate_size=2048,
                shared_intermediate_size=2048,
                first_dense_layers=3,
            ),
            dsa=DSASpec(index_n_heads=32, index_head_dim=128, index_topk=2048),
        ),
        # moonshotai/Kimi-K2-Instruct config.json: DeepSeek-V3's architecture with 64
        # heads, 384 routed experts, first_k_dense_replace 1, vocab 163,840.
        _deepseek("kimi-k2", heads=64, experts=384, first_dense=1, vocab=163840),
        # MiniMaxAI/MiniMax-M2 config.json: 62 layers, hidden 3072, 48 heads of 128, 8 KV
        # heads, 256 experts 1536 wide (intermediate_size), top-8, no shared expert,
        # vocab 200,064, untied (ModelCloud/GPTQModel hf_minimax_m2 config); FP8 with
        # weight_block_size [128, 128] as shipped, attention and experts both FP8, router
        # fp32 (counted 16-bit here: 0.1 GB) (whn09/neuronx-distributed-inference
        # examples/minimax_m2_misc/SUMMARY.md).
        ModelShape(
            "minimax-m2",
            num_layers=62,
            hidden_size=3072,
            num_heads=48,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=1536,
            vocab_size=200064,
            quantization="fp8",
            moe=MoESpec(num_experts=256, experts_per_token=8, expert_intermediate_size=1536),
        ),
        _LLAMA_4_SCOUT,
        # meta-llama/Llama-4-Maverick-17B-128E-Instruct text_config: Scout's layers with
        # 128 routed experts, every other layer MoE (interleave_moe_layer_step 2) and the
        # others a dense MLP of intermediate_size_mlp 16384. The vision encoder and the
        # chunked attention of three layers in four (attention_chunk_size 8192) are left
        # out, as Scout's are.
        replace(
            _LLAMA_4_SCOUT,
            name="llama-4-maverick",
            moe=replace(_LLAMA_4_SCOUT.moe, num_experts=128, layer_step=2),
        ),
    )
}

MOE_HF_IDS: dict[str, str] = {
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "deepseek-r1": "deepseek-ai/DeepSeek-R1",
    "deepseek-v3.2": "deepseek-ai/DeepSeek-V3.2",
    "glm-5": "zai-org/GLM-5",
    "kimi-k2": "moonshotai/Kimi-K2-Instruct",
    "minimax-m2": "MiniMaxAI/MiniMax-M2",
    "llama-4-scout": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "llama-4-maverick": "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
    "qwen3-coder-480b-a35b": "Qwen/Qwen3-Coder-480B-A35B-Instruct",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "mixtral-8x22b": "mistralai/Mixtral-8x22B-v0.1",
}


def _as_shipped(preset: str) -> Checkpoint:
    shape = MOE_PRESETS[preset]
    return Checkpoint(preset, shape.quantization, shape.quantized_scope)


MOE_CHECKPOINTS: dict[str, Checkpoint] = {
    **{hf.lower(): _as_shipped(preset) for preset, hf in MOE_HF_IDS.items()},
    "qwen/qwen3-30b-a3b-instruct-2507": Checkpoint("qwen3-30b-a3b"),
    "qwen/qwen3-30b-a3b-thinking-2507": Checkpoint("qwen3-30b-a3b"),
    "qwen/qwen3-30b-a3b-fp8": Checkpoint("qwen3-30b-a3b", "fp8"),
    "qwen/qwen3-30b-a3b-instruct-2507-fp8": Checkpoint("qwen3-30b-a3b", "fp8"),
    "qwen/qwen3-235b-a22b-instruct-2507": Checkpoint("qwen3-235b-a22b"),
    "qwen/qwen3-235b-a22b-thinking-2507": Checkpoint("qwen3-235b-a22b"),
    # Block-scaled FP8 (weight_block_size [128, 128]) counts as "fp8".
    "qwen/qwen3-235b-a22b-fp8": Checkpoint("qwen3-235b-a22b", "fp8"),
    "qwen/qwen3-235b-a22b-instruct-2507-fp8": Checkpoint("qwen3-235b-a22b", "fp8"),
    "qwen/qwen3-235b-a22b-thinking-2507-fp8": Checkpoint("qwen3-235b-a22b", "fp8"),
    "deepseek-ai/deepseek-v3-0324": Checkpoint("deepseek-v3", "fp8"),
    "deepseek-ai/deepseek-r1-0528": Checkpoint("deepseek-r1", "fp8"),
    "meta-llama/llama-4-scout-17b-16e": Checkpoint("llama-4-scout"),
    "meta-llama/llama-4-maverick-17b-128e": Checkpoint("llama-4-maverick"),
    "qwen/qwen3-coder-480b-a35b-instruct-fp8": Checkpoint("qwen3-coder-480b-a35b", "fp8"),
    "mistralai/mixtral-8x7b-instruct-v0.1": Checkpoint("mixtral-8x7b"),
    # MiniMax-M2.5: M2's architecture and format (62 layers, 256 experts top-8, 230B/10B),
    # retrained; only its RoPE span changed, which no price depends on.
    "minimaxai/minimax-m2.5": _as_shipped("minimax-m2"),
    # Kimi-K2-Thinking: compressed-tensors pack-quantized INT4 (group 32) routed experts;
    # attention, the dense layer and the shared experts stay bf16 (its ignore list).
    "moonshotai/kimi-k2-thinking": Checkpoint("kimi-k2", "int4", "experts", 32),
    # Kimi-K2.5: K2's text backbone (continual pretraining atop Kimi-K2-Base, a vision
    # encoder beside it, config under text_config), native INT4 routed experts
    # (compressed-tensors, group 32), as K2-Thinking (ROCm/ATOM recipes/Kimi-K2.5.md).
    "moonshotai/kimi-k2.5": Checkpoint("kimi-k2", "int4", "experts", 32),
    "moonshotai/kimi-k2-instruct-0905": Checkpoint("kimi-k2", "fp8"),
    "moonshotai/kimi-k2-base": Checkpoint("kimi-k2", "fp8"),
    # NVIDIA ModelOpt NVFP4 (quant_algo NVFP4, groups of 16) of every linear layer of the
    # transformer blocks (the published weight listing of DeepSeek-R1-0528-FP4 shows layer
    # 0's dense MLP in FP4). Their KV-cache format is not asserted here: read the
    # checkpoint's hf_quant_config.json through a local path for it.
    "nvidia/deepseek-r1-fp4": Checkpoint("deepseek-r1", "fp4"),
    "nvidia/deepseek-r1-0528-fp4": Checkpoint("deepseek-r1", "fp4"),
    "nvidia/deepseek-v3-0324-fp4": Checkpoint("deepseek-v3", "fp4"),
    "nvidia/llama-4-scout-17b-16e-instruct-fp4": Checkpoint("llama-4-scout", "fp4"),
    # Later releases of the same architectures (each config.json's dimensions equal its
    # preset's; AIConfigurator ships the configs in aic-core's model_configs/).
    "deepseek-ai/deepseek-v3.1": Checkpoint("deepseek-v3", "fp8"),
    "deepseek-ai/deepseek-v3.1-terminus": Checkpoint("deepseek-v3", "fp8"),
    "minimaxai/minimax-m2.7": _as_shipped("minimax-m2"),
    # NVIDIA's ModelOpt NVFP4 releases, groups of 16, each declaring an FP8 KV cache in
    # its hf_quant_config.json. Qwen3-235B-A22B-NVFP4 quantises every linear layer but the
    # routers and lm_head (its attention o_proj included); DeepSeek-V3.1-NVFP4 keeps the
    # MLA projections in bf16 (about 2% of the weights, counted FP4 here, as R1-FP4 is).
    # The later ones quantise the routed experts only ("ignore": attention, the dense
    # layer and the shared experts).
    "nvidia/qwen3-235b-a22b-nvfp4": Checkpoint("qwen3-235b-a22b", "fp4", kv_cache="fp8"),
    "nvidia/deepseek-v3.1-nvfp4": Checkpoint("deepseek-v3", "fp4", kv_cache="fp8"),
    # V3.2's and GLM-5's NVFP4 releases keep the MLA projections, the indexer and lm_head
    # in bf16 (GLM-5's o_proj too): counted FP4 here, as V3.1's are.
    "nvidia/deepseek-v3.2-nvfp4": Checkpoint("deepseek-v3.2", "fp4", kv_cache="fp8"),
    "nvidia/glm-5-nvfp4": Checkpoint("glm-5", "fp4", kv_cache="fp8"),
    "deepseek-ai/deepseek-v3.2-exp": Checkpoint("deepseek-v3.2", "fp8"),
    "zai-org/glm-5-fp8": Checkpoint("glm-5", "fp8"),
    "zai-org/glm-5.1": Checkpoint("glm-5"),
    "zai-org/glm-5.1-fp8": Checkpoint("glm-5", "fp8"),
    "zai-org/glm-5.2": Checkpoint("glm-5"),
    "zai-org/glm-5.2-fp8": Checkpoint("glm-5", "fp8"),
    # GLM-5.1's and 5.2's NVFP4 releases, like Kimi-K2.7-Code's, quantise the routed
    # experts only (their exclusion lists: attention, the dense layers, shared experts).
    "nvidia/glm-5.1-nvfp4": Checkpoint("glm-5", "fp4", "experts", kv_cache="fp8"),
    "nvidia/glm-5.2-nvfp4": Checkpoint("glm-5", "fp4", "experts", kv_cache="fp8"),
    "nvidia/kimi-k2.7-code-nvfp4": Checkpoint("kimi-k2", "fp4", "experts", kv_cache="fp8"),
    "nvidia/kimi-k2.5-nvfp4": Checkpoint("kimi-k2", "fp4", "experts", kv_cache="fp8"),
    "nvidia/kimi-k2.6-nvfp4": Checkpoint("kimi-k2", "fp4", "experts", kv_cache="fp8"),
    "nvidia/minimax-m2.5-nvfp4": Checkpoint("minimax-m2", "fp4", "experts", kv_cache="fp8"),
    "nvidia/minimax-m2.7-nvfp4": Checkpoint("minimax-m2", "fp4", "experts", kv_cache="fp8"),
    # Qwen3-VL's language model is the Qwen3 MoE (the vision tower, ~0.5B parameters,
    # is not counted: a text benchmark does not run it).
    "qwen/qwen3-vl-235b-a22b-instruct": Checkpoint("qwen3-235b-a22b"),
    "qwen/qwen3-vl-235b-a22b-thinking": Checkpoint("qwen3-235b-a22b"),
    "qwen/qwen3-vl-30b-a3b-instruct": Checkpoint("qwen3-30b-a3b"),
    "qwen/qwen3-vl-30b-a3b-thinking": Checkpoint("qwen3-30b-a3b"),
}
