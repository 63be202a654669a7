"""Precision as deployed: on-the-fly FP8 fits by its FP8 weights, and a checkpoint's own
KV-cache quantisation is read and used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optimizer.config import ConfigError, InstanceConfig, ServingConfig
from optimizer.search.flags import Engine, launch_commands
from optimizer.shapes import ShapeError, get_shape, load_hf_config

H200_TP1 = InstanceConfig(accelerator="h200", tp=1)


def test_on_the_fly_fp8_fits_where_its_fp8_weights_fit() -> None:
    """Llama-3.1-70B on one H200: 141 GB of bf16 weights do not fit, 72.7 GB of FP8 do
    (vLLM's --quantization fp8 runs it)."""
    with pytest.raises(ConfigError, match=r"w-none\.kv-auto\) does not fit .* 141\.1 GB"):
        ServingConfig.colocated("llama-3.1-70b", H200_TP1)
    fp8 = ServingConfig.colocated("llama-3.1-70b", H200_TP1, quantization="fp8")
    plan = fp8.roles()[0]
    assert plan.kv_blocks > 0
    assert fp8.shape.weight_bytes(1) / 1e9 == pytest.approx(72.7, abs=0.1)


def _write_config(folder: Path, qc: dict | None, sidecar: dict | None = None) -> Path:
    cfg = {
        "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
        "torch_dtype": "bfloat16",
    }  # fmt: skip
    if qc is not None:
        cfg["quantization_config"] = qc
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    if sidecar is not None:
        (folder / "hf_quant_config.json").write_text(json.dumps(sidecar), encoding="utf-8")
    return folder


def test_a_checkpoints_kv_cache_quantisation_is_read(tmp_path: Path) -> None:
    modelopt = {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
    shape = load_hf_config(_write_config(tmp_path / "a", modelopt))
    assert (shape.quantization, shape.kv_cache_dtype) == ("fp8", "fp8")
    ct = {
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"weights": {"type": "float", "num_bits": 8}}},
        "kv_cache_scheme": {"type": "float", "num_bits": 8},
    }
    assert load_hf_config(_write_config(tmp_path / "b", ct)).kv_cache_dtype == "fp8"
    # ModelOpt's export beside config.json, when config.json carries none
    side = {"producer": {"name": "modelopt"},
            "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}  # fmt: skip
    shape = load_hf_config(_write_config(tmp_path / "c", None, side))
    assert (shape.quantization, shape.kv_cache_dtype) == ("fp8", "fp8")
    plain = {"quant_method": "fp8"}
    assert load_hf_config(_write_config(tmp_path / "d", plain)).kv_cache_dtype == "auto"
    with pytest.raises(ShapeError, match="kv_cache_quant_algo 'INT8' is not supported"):
        load_hf_config(_write_config(tmp_path / "e", {**modelopt, "kv_cache_quant_algo": "INT8"}))


def test_the_deployed_kv_format_is_the_checkpoints_unless_the_config_sets_one() -> None:
    """NVIDIA's ModelOpt FP8 checkpoints quantise the KV cache too: with kv_cache_dtype auto
    (vLLM's default) the deployment holds twice the tokens, and no flag is needed."""
    assert get_shape("nvidia/Llama-3.1-8B-Instruct-FP8").kv_cache_dtype == "fp8"
    assert get_shape("RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8").kv_cache_dtype == "auto"
    inst = InstanceConfig(accelerator="h100")
    nvidia = ServingConfig.colocated("nvidia/Llama-3.1-8B-Instruct-FP8", inst)
    redhat = ServingConfig.colocated("RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8", inst)
    assert nvidia.shape.kv_dtype_bytes == 1 and redhat.shape.kv_dtype_bytes == 2
    assert nvidia.roles()[0].kv_blocks > 1.9 * redhat.roles()[0].kv_blocks
    launch = " ".join(c.command for c in launch_commands(nvidia) if c.engine is Engine.VLLM)
    assert "--kv-cache-dtype" not in launch and "--quantization" not in launch
