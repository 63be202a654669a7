"""Reading Gated DeltaNet hybrids (Qwen3.5 / 3.6, Qwen3-Next) from Hugging Face config.json
files, written with the keys and values of the published configs the presets cite, and
the configs that must still be refused."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from optimizer.config import ConfigError, InstanceConfig, ServingConfig
from optimizer.shapes import PRESETS, ShapeError, load_hf_config

# Qwen/Qwen3.6-35B-A3B: the ConditionalGeneration wrapper, the text model under
# text_config (no intermediate_size: every layer is MoE), a vision tower beside it.
QWEN36_35B = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_moe_text",
        "attn_output_gate": True,
        "dtype": "bfloat16",
        "full_attention_interval": 4,
        "head_dim": 256,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_value_head_dim": 128,
        "mamba_ssm_dtype": "float32",
        "mlp_only_layers": [],
        "moe_intermediate_size": 512,
        "mtp_num_hidden_layers": 1,
        "num_attention_heads": 16,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 40,
        "num_key_value_heads": 2,
        "shared_expert_intermediate_size": 512,
        "vocab_size": 248320,
    },
    "vision_config": {"depth": 27, "hidden_size": 1152, "out_hidden_size": 2048},
}
QWEN36_35B["text_config"]["layer_types"] *= 10

# Qwen/Qwen3-Next-80B-A3B-Instruct: flat, no layer_types (full_attention_interval), no
# attn_output_gate and no mamba_ssm_dtype key, a dense width no layer uses.
QWEN3_NEXT_80B = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "decoder_sparse_step": 1,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 5120,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "mlp_only_layers": [],
    "moe_intermediate_size": 512,
    "num_attention_heads": 16,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "num_hidden_layers": 48,
    "num_key_value_heads": 2,
    "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def _text(**change):
    """QWEN36_35B with its text_config changed (None deletes a key)."""
    text = {**QWEN36_35B["text_config"], **change}
    return {**QWEN36_35B, "text_config": {k: v for k, v in text.items() if v is not None}}


def _load(tmp_path, cfg, name="model"):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return load_hf_config(path, name=name)


def test_qwen3_6_reads_back_as_the_preset(tmp_path):
    shape = _load(tmp_path, QWEN36_35B, "qwen3.6-35b-a3b")
    assert shape == PRESETS["qwen3.6-35b-a3b"]
    # No dense layer: the expert width stands in for the missing intermediate_size.
    assert shape.intermediate_size == 512 and shape.num_dense_layers == 0


def test_qwen3_next_reads_back_as_the_preset(tmp_path):
    """48 layers, interval 4: layers 4, 8, ..., 48 (1-based) full attention, 36 GDN; the
    output gate on by vLLM's default, the state in the activation dtype (bf16)."""
    shape = _load(tmp_path, QWEN3_NEXT_80B, "qwen3-next-80b-a3b")
    assert shape == PRESETS["qwen3-next-80b-a3b"]
    assert (shape.gdn.num_layers, shape.attn_output_gate, shape.gdn.ssm_dtype) == (
        36,
        True,
        "bfloat16",
    )


@pytest.mark.parametrize(
    ("preset", "change"),
    [
        (
            "qwen3.5-27b",
            {"num_hidden_layers": 64, "hidden_size": 5120, "num_attention_heads": 24,
             "num_key_value_heads": 4, "linear_num_value_heads": 48, "intermediate_size": 17408,
             "num_experts": None, "num_experts_per_tok": None, "moe_intermediate_size": None,
             "shared_expert_intermediate_size": None, "model_type": "qwen3_5_text",
             "layer_types": None},
        ),
        (
            "qwen3.5-122b-a10b",
            {"num_hidden_layers": 48, "hidden_size": 3072, "num_attention_heads": 32,
             "linear_num_value_heads": 64, "moe_intermediate_size": 1024,
             "shared_expert_intermediate_size": 1024, "layer_types": None},
        ),
        (
            "qwen3.5-397b-a17b",
            {"num_hidden_layers": 60, "hidden_size": 4096, "num_attention_heads": 32,
             "linear_num_value_heads": 64, "num_experts": 512, "num_experts_per_tok": 10,
             "moe_intermediate_size": 1024, "shared_expert_intermediate_size": 1024,
             "layer_types": ["linear_attention", "linear_attention", "linear_attention",
                             "full_attention"] * 15},
        ),
    ],
)  # fmt: skip
def test_the_other_qwen3_5_sizes_read_back(tmp_path, preset, change):
    assert _load(tmp_path, _text(**change), preset) == PRESETS[preset]


def test_the_layer_mix_follows_layer_types_or_the_interval(tmp_path):
    types = ["linear_attention", "full_attention"] * 20  # every other layer
    assert _load(tmp_path, _text(layer_types=types)).gdn.num_layers == 20
    # Without layer_types: 40 layers, interval 3 -> layers 3, 6, ..., 39 full (13).
    shape = _load(tmp_path, _text(layer_types=None, full_attention_interval=3))
    assert (shape.num_full_attention_layers, shape.gdn.num_layers) == (13, 27)
    # transformers' default interval is 4.
    shape = _load(tmp_path, _text(layer_types=None, full_attention_interval=None))
    assert shape.gdn.num_layers == 30
    full = _load(tmp_path, _text(layer_types=["full_attention"] * 40))
    assert full.gdn is None and full.kv_bytes_per_token() == 4 * 20_480


def test_what_the_config_says_of_the_gate_and_the_state(tmp_path):
    shape = _load(tmp_path, _text(attn_output_gate=False, mamba_ssm_dtype="bfloat16"))
    assert not shape.attn_output_gate and shape.gdn.ssm_dtype == "bfloat16"
    assert shape.attention_params == 2048 * (16 + 4) * 256 + 16 * 256 * 2048
    # Other models default to no gate.
    dense = {k: v for k, v in QWEN3_NEXT_80B.items() if not k.startswith("linear_")}
    dense = {**dense, "model_type": "qwen3_moe", "full_attention_interval": None}
    shape = _load(tmp_path, dense)
    assert shape.gdn is None and not shape.attn_output_gate


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            _text(layer_types=["sliding_attention", "full_attention"] * 20),
            r"layer_types \['sliding_attention'\] are not modelled \(expected "
            r"\('full_attention', 'linear_attention'\)\)",
        ),
        (
            _text(layer_types=["linear_attention"] * 40),
            r"layer_types leaves no full_attention layer among 40",
        ),
        (
            _text(layer_types=None, full_attention_interval=41),
            r"full_attention_interval 41 leaves no full_attention layer among 40",
        ),
        (_text(layer_types=["full_attention"] * 4), r"one type per layer \(40\)"),
        (_text(linear_num_value_heads=None), r"linear_num_value_heads is missing"),
        (_text(linear_key_head_dim="128"), r"linear_key_head_dim must be an integer >= 0"),
        (_text(linear_num_value_heads=24), r"num_value_heads \(24\) must be a multiple"),
        (_text(linear_conv_kernel_dim=0), r"conv_kernel must be a positive integer, got 0"),
        (_text(mamba_ssm_dtype="float8_e4m3"), r"mamba_ssm_dtype 'float8_e4m3' is not one of"),
        (_text(attn_output_gate="yes"), r"attn_output_gate must be true or false, got 'yes'"),
        (
            _text(layer_types=None, full_attention_interval=0),
            r"full_attention_interval must be >= 1, got 0",
        ),
        (_text(mlp_only_layers=[0]), r"intermediate_size is missing \(the dense layers need it\)"),
        (
            # nvidia/Qwen3.6-35B-A3B-NVFP4: FP8 attention, NVFP4 experts and LM head.
            {**QWEN36_35B, "quantization_config": {"quant_method": "modelopt",
                                                   "quant_algo": "MIXED_PRECISION"}},
            r"quant_algo 'MIXED_PRECISION' is not supported",
        ),
        (
            {**QWEN3_NEXT_80B, "model_type": "minimax", "attn_type_list": [0, 1]},
            r"attn_type_list \[0, 1\]: only softmax attention",
        ),
        (
            {**QWEN3_NEXT_80B, "model_type": "qwen3_moe",
             "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 12},
            r"layer_types \['linear_attention'\] are not modelled",
        ),
    ],
)  # fmt: skip
def test_bad_hybrid_configs_name_the_file_and_key(tmp_path, cfg, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ShapeError, match=message) as err:
        load_hf_config(path)
    assert str(path) in str(err.value)


def test_a_nested_config_keeps_the_top_level_embedding_tie(tmp_path):
    tied = _load(tmp_path, {**QWEN36_35B, "tie_word_embeddings": True})
    assert tied == replace(PRESETS["qwen3.6-35b-a3b"], name="model", tie_word_embeddings=True)


def test_a_tp_that_splits_the_attention_but_not_the_deltanet_heads_is_refused(tmp_path):
    """vLLM divides the GDN key and value heads by tp: 4 key heads do not split over tp 8,
    though the 16 attention heads (2 KV heads, replicated) and the experts do."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_text(linear_num_key_heads=4, linear_num_value_heads=8)))
    fits = ServingConfig.colocated(str(path), InstanceConfig(tp=4, accelerator="h200"))
    assert fits.shape.gdn.num_key_heads == 4
    message = r"tp: 8 does not divide .*Gated DeltaNet 4 key heads / 8 value heads"
    with pytest.raises(ConfigError, match=message):
        ServingConfig.colocated(str(path), InstanceConfig(tp=8, accelerator="h200"))
