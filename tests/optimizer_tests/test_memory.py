"""KV capacity as vLLM computes it, checked against vLLM's own start-up logs.

Each case quotes the log of a public vLLM run; the model, GPU and settings are the
run's, and the device total is the `total_gpu_memory` it logged (or, where it only
logged the KV figure, the preset's)."""

from __future__ import annotations

import pytest

from optimizer.config import InstanceConfig, SpecMethod, SpeculationConfig
from optimizer.memory import kv_cache_bytes
from optimizer.shapes import get_shape

GIB = 1024**3


def _kv_gib(model, total_gib, util, tokens, seqs, tp=1, draft=None):
    inst = InstanceConfig(tp=tp, max_num_batched_tokens=tokens, max_num_seqs=seqs,
                          gpu_memory_utilization=util)  # fmt: skip
    return kv_cache_bytes(get_shape(model), inst, draft, total_gib * GIB) / GIB


def test_llama_3_8b_on_h100_vllm_log():
    """github.com/vllm-project/vllm/pull/10511 (2024-12, H100 80 GB, util 0.90):
    "total_gpu_memory 79.22GiB ... model weights take 14.96GiB; non_torch_memory 1.79GiB;
    PyTorch activation peak memory 1.26GiB; available_kv_cache_memory 53.29GiB".
    Defaults of that engine for an 8,192-token model: 8,192 batched tokens, 256 seqs."""
    assert get_shape("meta-llama/Meta-Llama-3-8B").weight_bytes() / GIB == pytest.approx(
        14.96, abs=0.01
    )
    got = _kv_gib("meta-llama/Meta-Llama-3-8B", 79.22, 0.90, 8192, 256)
    # Its non-torch memory (1.79 GiB, a v0 engine's, NCCL's buffers included) is the
    # difference: v1 logs 0.16-0.35 GiB.
    assert got == pytest.approx(53.29, rel=0.04)


def test_qwen3_0_6b_on_a100_vllm_v1_log():
    """github.com/vllm-project/vllm/pull/24577 (2025-09, v1, A100 80 GB, util 0.9,
    lm_eval through the LLM class: 16,384 batched tokens, 1,024 seqs):
    "Model loading took 1.1201 GiB ... Available KV cache memory: 69.66 GiB ... GPU KV
    cache size: 652,144 tokens". The A100's total is the preset's."""
    from optimizer.hardware import get_accelerator

    total = get_accelerator("a100").hbm_bytes / GIB
    got = _kv_gib("Qwen/Qwen3-0.6B", total, 0.9, 16384, 1024)
    assert got == pytest.approx(69.66, rel=0.02)
    # 112 KiB of KV per token: the logged token count is the KV bytes in 16-token blocks.
    per_token = get_shape("qwen3-0.6b").kv_bytes_per_token()
    assert per_token == 112 * 1024
    assert int(69.66 * GIB // (per_token * 16)) * 16 == pytest.approx(652_144, abs=32)


def test_qwen3_0_6b_on_h100_at_utilisation_0_8():
    """github.com/generative-computing/mellea/pull/416: "total_gpu_memory (79.19GiB) x
    gpu_memory_utilization (0.80) = 63.35GiB; model weights take 1.12GiB; non_torch_memory
    takes 0.16GiB; PyTorch activation peak memory takes 0.23GiB; the rest of the memory
    reserved for KV Cache is 61.84GiB ... # cuda blocks: 36184" (max_model_len 8,192)."""
    got = _kv_gib("qwen3-0.6b", 79.19, 0.80, 8192, 256)
    assert got == pytest.approx(61.84, rel=0.02)


def test_eagle_heads_keep_their_kv_in_the_same_blocks():
    """github.com/vllm-project/vllm/issues/19996 (v1 0.9.1, Llama-3.1-8B + EAGLE on an
    H100): "Available KV cache memory: 51.63 GiB / GPU KV cache size: 410,128 tokens": 132
    KiB per token, the target's 128 KiB and one EAGLE layer's 4 KiB."""
    shape = get_shape("meta-llama/Llama-3.1-8B-Instruct")
    spec = SpeculationConfig(method=SpecMethod.EAGLE, num_speculative_tokens=3)
    head = spec.footprint(shape, 1)
    per_token = shape.kv_bytes_per_token() + head.kv_bytes_per_token
    assert per_token == 132 * 1024
    assert int(51.63 * GIB // (per_token * 16)) * 16 == pytest.approx(410_128, abs=32)


def test_fp8_weights_and_kv_are_one_byte():
    fp8 = get_shape("nvidia/Llama-3.1-8B-Instruct-FP8")
    bf16 = get_shape("llama-3.1-8b")
    # Linear layers in FP8, the embedding and LM head (2 x 128,256 x 4,096) in bf16.
    assert fp8.weight_bytes() == bf16.num_linear_params + 2 * (
        bf16.num_params - bf16.num_linear_params
    )
    # NVIDIA's ModelOpt checkpoint declares an FP8 KV cache too; RedHat's FP8-dynamic does not.
    assert fp8.kv_bytes_per_token() * 2 == bf16.kv_bytes_per_token()
    weights_only = get_shape("RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8")
    assert weights_only.kv_bytes_per_token() == bf16.kv_bytes_per_token()
    kv8 = bf16.with_precision(type(bf16.precision)("none", "fp8"))
    assert kv8.kv_bytes_per_token() * 2 == bf16.kv_bytes_per_token()
