"""Reading MoE, MLA, sliding-window and 4-bit shapes from Hugging Face config.json files.

The configs are written the way each family spells them (the keys and values of the
published config.json files the presets cite), and must read back as the preset."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from optimizer.shapes import PRESETS, ShapeError, get_shape, load_hf_config

GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "num_hidden_layers": 36,
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_local_experts": 128,
    "num_experts_per_tok": 4,
    "experts_per_token": 4,
    "vocab_size": 201088,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "quantization_config": {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    },
}

DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "num_hidden_layers": 61,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": [128, 128],
    },
}

QWEN3_30B_A3B = {
    "model_type": "qwen3_moe",
    "num_hidden_layers": 48,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "sliding_window": None,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

LLAMA_4_SCOUT = {
    "architectures": ["Llama4ForConditionalGeneration"],
    "model_type": "llama4",
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "llama4_text",
        "num_hidden_layers": 48,
        "hidden_size": 5120,
        "intermediate_size": 8192,
        "intermediate_size_mlp": 16384,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_local_experts": 16,
        "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 1,
        "vocab_size": 202048,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    },
    "vision_config": {"hidden_size": 1408, "num_hidden_layers": 34},
}


def _load(tmp_path, cfg, name="model"):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return load_hf_config(path, name=name)


@pytest.mark.parametrize(
    ("cfg", "preset"),
    [
        (GPT_OSS_120B, "gpt-oss-120b"),
        (DEEPSEEK_V3, "deepseek-v3"),
        (QWEN3_30B_A3B, "qwen3-30b-a3b"),
        (LLAMA_4_SCOUT, "llama-4-scout"),
    ],
)
def test_published_configs_read_back_as_the_presets(tmp_path, cfg, preset):
    assert _load(tmp_path, cfg, preset) == PRESETS[preset]


def test_shared_experts_and_dense_prefixes(tmp_path):
    qwen2_moe = {
        **QWEN3_30B_A3B,
        "shared_expert_intermediate_size": 5632,
        "mlp_only_layers": [0, 1],
    }
    shape = _load(tmp_path, qwen2_moe)
    assert (shape.moe.shared_intermediate_size, shape.moe.first_dense_layers) == (5632, 2)
    assert (shape.num_moe_layers, shape.num_dense_layers) == (46, 2)
    kimi = {
        **DEEPSEEK_V3,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "n_routed_experts": 384,
    }
    shape = _load(tmp_path, {**kimi, "first_k_dense_replace": 1, "vocab_size": 163840})
    assert shape == replace(PRESETS["kimi-k2"], name="model")
    maverick = {
        **LLAMA_4_SCOUT,
        "text_config": {
            **LLAMA_4_SCOUT["text_config"],
            "num_local_experts": 128,
            "interleave_moe_layer_step": 2,
        },
    }
    shape = _load(tmp_path, maverick)
    assert (shape.moe.layer_step, shape.num_moe_layers, shape.num_dense_layers) == (2, 24, 24)
    assert shape.intermediate_size == 16384 and shape.moe.shared_intermediate_size == 8192


def test_sliding_windows_where_declared(tmp_path):
    mistral = {**QWEN3_30B_A3B, "sliding_window": 4096, "use_sliding_window": None}
    assert _load(tmp_path, mistral).sliding_window_layers == 48  # no layer_types: all
    assert _load(tmp_path, {**mistral, "use_sliding_window": False}).sliding_window == 0
    gpt = _load(tmp_path, GPT_OSS_120B)
    assert (gpt.sliding_window, gpt.sliding_window_layers) == (128, 18)


def test_four_bit_quantization_configs(tmp_path):
    modelopt = {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": 16,
        "exclude_modules": ["lm_head"],
    }
    shape = _load(tmp_path, {**DEEPSEEK_V3, "quantization_config": modelopt})
    assert (shape.quantization, shape.quantized_scope) == ("fp4", "linear")
    nvfp4_ct = {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "group_0": {"weights": {"type": "float", "num_bits": 4, "group_size": 16}}
        },
    }
    assert _load(tmp_path, {**QWEN3_30B_A3B, "quantization_config": nvfp4_ct}).quantization == "fp4"
    # Kimi-K2-Thinking: pack-quantized INT4 in groups of 32, attention and shared experts ignored.
    int4 = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"type": "int", "num_bits": 4, "group_size": 32, "strategy": "group"},
            }
        },
        "ignore": [
            "lm_head",
            "re:.*self_attn.*",
            "re:.*shared_experts.*",
            "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
        ],
    }
    shape = _load(tmp_path, {**DEEPSEEK_V3, "quantization_config": int4})
    assert (shape.quantization, shape.quantized_scope, shape.int4_group_size) == (
        "int4",
        "experts",
        32,
    )
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": -1}
    shape = _load(tmp_path, {**QWEN3_30B_A3B, "quantization_config": gptq})
    assert (shape.quantization, shape.int4_group_size) == ("int4", 2048)  # one scale a row
    awq = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": 128,
        "modules_to_not_convert": ["mlp.gate"],
    }
    shape = _load(tmp_path, {**QWEN3_30B_A3B, "quantization_config": awq})
    assert (shape.quantized_scope, shape.weight_dtype_bytes) == ("linear", 0.515625)


@pytest.mark.parametrize(
    ("excluded", "scope"),
    [
        (["lm_head", "model.layers.*.self_attn"], "experts"),
        (["re:.*self_attn.*"], "experts"),
        (["re:.*self_attn\\..*"], "experts"),
        (
            [f"model.layers.{i}.self_attn.{m}" for i in range(61) for m in ("q_b_proj", "o_proj")],
            "experts",
        ),
        (["re:.*kv_a_proj_with_mqa$", "re:.*q_a_proj$", "lm_head"], "linear"),
        (["model.layers.0.self_attn.kv_a_proj_with_mqa"], "linear"),
        (["re:.*mlp.gate$", "lm_head"], "linear"),
    ],
)
def test_attention_is_unquantised_only_when_excluded_whole(tmp_path, excluded, scope):
    qc = {
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": excluded,
    }
    assert _load(tmp_path, {**DEEPSEEK_V3, "quantization_config": qc}).quantized_scope == scope


def test_a_nested_text_config_may_hold_the_quantization_config(tmp_path):
    int4 = {"quant_method": "compressed-tensors", "ignore": ["re:.*self_attn.*"], "config_groups": {
        "group_0": {"weights": {"type": "int", "num_bits": 4, "group_size": 32}}}}  # fmt: skip
    text = {k: v for k, v in DEEPSEEK_V3.items() if k != "quantization_config"}
    shape = _load(
        tmp_path, {"model_type": "kimi_k25", "text_config": {**text, "quantization_config": int4}}
    )
    assert (shape.quantization, shape.quantized_scope) == ("int4", "experts")


def test_modelopt_sidecar_declares_nvfp4(tmp_path):
    (tmp_path / "hf_quant_config.json").write_text(
        json.dumps(
            {
                "quantization": {
                    "quant_algo": "NVFP4",
                    "kv_cache_quant_algo": "FP8",
                    "group_size": 16,
                }
            }
        )
    )
    shape = _load(tmp_path, LLAMA_4_SCOUT)
    assert (shape.quantization, shape.kv_cache_dtype) == ("fp4", "fp8")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_experts": 64}, r"num_experts and num_local_experts disagree"),
        ({"experts_per_token": 2}, r"num_experts_per_tok and experts_per_token disagree"),
        (
            {"layer_types": ["linear_attention", "full_attention"] * 18},
            r"layer_types \['linear_attention'\] are not modelled",
        ),
        (
            {"layer_types": ["full_attention"] * 3},
            r"layer_types must list one type per layer \(36\)",
        ),
        ({"sliding_window": None}, r"sliding_attention but no sliding_window"),
        (
            {"num_experts_per_tok": None, "experts_per_token": None},
            r"num_experts_per_tok is missing",
        ),
        ({"mlp_only_layers": [3, 7]}, r"mlp_only_layers \[3, 7\] is not modelled"),
        ({"num_local_experts": "128"}, r"num_local_experts must be an integer >= 0, got '128'"),
        ({"attn_type_list": [0, 1]}, r"attn_type_list \[0, 1\]: only softmax attention"),
        ({"linear_attn_config": {"kda_layers": [1, 2]}}, r"linear_attn_config .*not modelled"),
        ({"sparse_attention_config": {"topk": 64}}, r"sparse_attention_config .*not modelled"),
        (
            {
                "quantization_config": {
                    "quant_method": "mxfp4",
                    "modules_to_not_convert": "self_attn",
                }
            },
            r"modules_to_not_convert must be a list",
        ),
        (
            {"quantization_config": {"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}},
            r"quant_algo 'W4A8_AWQ' is not supported",
        ),
        ({"quantization_config": {"quant_method": "gptq", "bits": 8}}, r"bits 8: gptq 4-bit is"),
    ],
)
def test_bad_configs_name_the_file_and_key(tmp_path, change, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**GPT_OSS_120B, **change}))
    with pytest.raises(ShapeError, match=message) as err:
        load_hf_config(path)
    assert str(path) in str(err.value)


def test_contradictions_between_fields(tmp_path):
    both = {**QWEN3_30B_A3B, "shared_expert_intermediate_size": 512, "n_shared_experts": 1}
    with pytest.raises(ShapeError, match="shared_expert_intermediate_size and n_shared_experts"):
        _load(tmp_path, both)
    with pytest.raises(ShapeError, match="leaves no MoE layer"):
        _load(tmp_path, {**DEEPSEEK_V3, "first_k_dense_replace": 61})
    mixed = {"quant_method": "compressed-tensors", "config_groups": {
        "a": {"weights": {"type": "int", "num_bits": 4, "group_size": 32}},
        "b": {"weights": {"type": "float", "num_bits": 8}}}}  # fmt: skip
    with pytest.raises(ShapeError, match="config_groups mix weight formats"):
        _load(tmp_path, {**DEEPSEEK_V3, "quantization_config": mixed})
    dense = {
        k: v for k, v in QWEN3_30B_A3B.items() if k not in ("num_experts", "moe_intermediate_size")
    }
    experts_only = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    with pytest.raises(ShapeError, match="no experts to quantise"):
        _load(tmp_path, {**dense, "quantization_config": experts_only})


def test_deepseek_sparse_attention_reads_as_mla_with_its_indexer(tmp_path):
    """DeepSeek-V3.2 adds a lightning indexer that picks index_topk keys per query (GLM-5
    too); it needs MLA with a query latent, from which the indexer projects its queries."""
    v32 = {**DEEPSEEK_V3, "architectures": ["DeepseekV32ForCausalLM"], "index_topk": 2048,
           "index_n_heads": 64, "index_head_dim": 128}  # fmt: skip
    assert _load(tmp_path, v32, "deepseek-v3.2") == PRESETS["deepseek-v3.2"]
    gqa = {**QWEN3_30B_A3B, "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}
    with pytest.raises(ShapeError, match=r"index_topk .*without MLA and a query latent"):
        _load(tmp_path, gqa)


def test_a_local_config_path_goes_through_get_shape(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT_OSS_120B))
    shape = get_shape(str(path))
    assert shape.weight_bytes(1) == PRESETS["gpt-oss-120b"].weight_bytes(1)
