"""Model shapes: presets and look-up.

The vocabulary lives in `optimizer.shape_parts` (number formats, `Precision`, `MoESpec`,
`MLASpec`, `GatedDeltaNetSpec`) and `optimizer.model_shape` (`ModelShape` and its weight
and KV-cache bytes); `optimizer.hf_config` reads a Hugging Face `config.json` from a local
path (never the network), its `quantization_config` included. This module names the
models users ask about most, under their short names and their Hugging Face ids (FP8 and
4-bit checkpoints included), dense here, mixture-of-experts in `optimizer.moe_presets`
and Gated DeltaNet hybrids (Qwen3.5 / 3.6, Qwen3-Next) in `optimizer.gdn_presets`, and
re-exports the rest so `from optimizer.shapes import ...` keeps working.

This module imports neither torch nor anything else heavy, so the optimizer
and API may import it freely.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from optimizer.gdn_presets import GDN_CHECKPOINTS, GDN_HF_IDS, GDN_PRESETS
from optimizer.hf_config import load_hf_config
from optimizer.model_shape import ModelShape
from optimizer.moe_presets import MOE_CHECKPOINTS, MOE_HF_IDS, MOE_PRESETS, Checkpoint
from optimizer.shape_parts import (
    DEFAULT_PRECISION,
    DTYPE_BYTES,
    KV_CACHE_DTYPES,
    QUANTIZATIONS,
    QUANTIZED_SCOPES,
    DSASpec,
    GatedDeltaNetSpec,
    MLASpec,
    MoESpec,
    Precision,
    ShapeError,
)

__all__ = [
    "DEFAULT_PRECISION",
    "DTYPE_BYTES",
    "HF_IDS",
    "KV_CACHE_DTYPES",
    "PRESETS",
    "QUANTIZATIONS",
    "QUANTIZED_SCOPES",
    "DSASpec",
    "GatedDeltaNetSpec",
    "MLASpec",
    "MoESpec",
    "ModelShape",
    "Precision",
    "ShapeError",
    "get_shape",
    "known_checkpoints",
    "load_hf_config",
]


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, inter: int, vocab: int):
    return ModelShape(name, layers, hidden, heads, kv, hidden // heads, inter, vocab)


PRESETS: dict[str, ModelShape] = (
    {
        s.name: s
        for s in (
            _llama("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256),
            _llama("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256),
            replace(
                _llama("llama-3.2-1b", 16, 2048, 32, 8, 8192, 128256), tie_word_embeddings=True
            ),
            _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000),
            _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000),
            _llama("llama-2-13b", 40, 5120, 40, 40, 13824, 32000),
            _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32768),
            ModelShape("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936),
            ModelShape("qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151936),
            ModelShape("qwen3-0.6b", 28, 1024, 16, 8, 128, 3072, 151936, tie_word_embeddings=True),
            # Qwen/Qwen3-1.7B and meta-llama/Llama-3.1-405B config.json (as load_hf_config
            # reads them; AIConfigurator ships both in model_configs/).
            ModelShape("qwen3-1.7b", 28, 2048, 16, 8, 128, 6144, 151936, tie_word_embeddings=True),
            # Qwen3-4B: 36 layers of 2560, 32 heads and 8 KV heads of 128, 9728 wide, tied
            # (Qwen3-VL-4B's language model, whose config.json load_hf_config reads so).
            ModelShape("qwen3-4b", 36, 2560, 32, 8, 128, 9728, 151936, tie_word_embeddings=True),
            _llama("llama-3.1-405b", 126, 16384, 128, 8, 53248, 128256),
            # XiaomiMiMo/MiMo-7B-Base config.json: 36 layers of 4096, 32 heads and 8 KV heads
            # of 128, 11008 wide, vocab 151,680, untied (its MTP layer left out).
            ModelShape("mimo-7b", 36, 4096, 32, 8, 128, 11008, 151680),
            _llama("qwen2-7b", 28, 3584, 28, 4, 18944, 152064),
            _llama("qwen1.5-7b", 32, 4096, 32, 32, 11008, 151936),
            _llama("qwen2-72b", 80, 8192, 64, 8, 29568, 152064),
            # Tiny shapes sized for CPU profiling and the reference engine.
            ModelShape("tiny", 4, 256, 8, 2, 32, 768, 4096, dtype="float32"),
            ModelShape("tiny-draft", 1, 256, 8, 2, 32, 768, 4096, dtype="float32"),
            ModelShape("small", 8, 512, 8, 2, 64, 1536, 8192, dtype="float32"),
        )
    }
    | MOE_PRESETS
    | GDN_PRESETS
)


# Each preset's canonical Hugging Face checkpoint (what launch commands name).
HF_IDS: dict[str, str] = (
    {
        "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
        "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
        "llama-3.2-1b": "meta-llama/Llama-3.2-1B-Instruct",
        "llama-2-7b": "meta-llama/Llama-2-7b-chat-hf",
        "llama-2-13b": "meta-llama/Llama-2-13b-chat-hf",
        "llama-2-70b": "meta-llama/Llama-2-70b-chat-hf",
        "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.3",
        "qwen3-8b": "Qwen/Qwen3-8B",
        "qwen3-32b": "Qwen/Qwen3-32B",
        "qwen3-0.6b": "Qwen/Qwen3-0.6B",
        "qwen3-1.7b": "Qwen/Qwen3-1.7B",
        "qwen3-4b": "Qwen/Qwen3-4B",
        "llama-3.1-405b": "meta-llama/Llama-3.1-405B-Instruct",
        "mimo-7b": "XiaomiMiMo/MiMo-7B-Base",
        "qwen2-7b": "Qwen/Qwen2-7B-Instruct",
        "qwen1.5-7b": "Qwen/Qwen1.5-7B-Chat",
        "qwen2-72b": "Qwen/Qwen2-72B-Instruct",
    }
    | MOE_HF_IDS
    | GDN_HF_IDS
)

# Hugging Face checkpoints -> (preset of the same dimensions, weight quantisation of the
# checkpoint). FP8 checkpoints are pre-quantised: vLLM reads their quantization_config.
_DENSE_CHECKPOINTS: dict[str, tuple[str, str]] = {
    **{
        hf.lower(): (preset, "none")
        for preset, hf in HF_IDS.items()
        if preset not in MOE_PRESETS and preset not in GDN_PRESETS
    },
    **{
        f"meta-llama/{m}".lower(): (preset, "none")
        for preset, names in {
            "llama-3.1-8b": (
                "Llama-3.1-8B",
                "Meta-Llama-3.1-8B",
                "Meta-Llama-3.1-8B-Instruct",
                "Meta-Llama-3-8B",
                "Meta-Llama-3-8B-Instruct",
            ),
            "llama-3.1-70b": (
                "Llama-3.1-70B",
                "Meta-Llama-3.1-70B",
                "Meta-Llama-3.1-70B-Instruct",
                "Llama-3.3-70B-Instruct",
                "Meta-Llama-3-70B",
                "Meta-Llama-3-70B-Instruct",
            ),
            "llama-3.1-405b": (
                "Llama-3.1-405B",
                "Meta-Llama-3.1-405B",
                "Meta-Llama-3.1-405B-Instruct",
            ),
            "llama-3.2-1b": ("Llama-3.2-1B",),
            "llama-2-7b": ("Llama-2-7b-hf",),
            "llama-2-13b": ("Llama-2-13b-hf",),
            "llama-2-70b": ("Llama-2-70b-hf",),
        }.items()
        for m in names
    },
    "mistralai/mistral-7b-v0.1": ("mistral-7b", "none"),
    "mistralai/mistral-7b-instruct-v0.1": ("mistral-7b", "none"),
    "mistralai/mistral-7b-v0.3": ("mistral-7b", "none"),
    "qwen/qwen2-7b": ("qwen2-7b", "none"),
    "qwen/qwen1.5-7b": ("qwen1.5-7b", "none"),
    # LLaMA-1 has Llama-2's dimensions (only its context, 2,048, is shorter).
    "huggyllama/llama-7b": ("llama-2-7b", "none"),
    "huggyllama/llama-13b": ("llama-2-13b", "none"),
    "qwen/qwen2-72b": ("qwen2-72b", "none"),
    "qwen/qwen3-8b-fp8": ("qwen3-8b", "fp8"),
    "qwen/qwen3-32b-fp8": ("qwen3-32b", "fp8"),
    "nvidia/llama-3.1-8b-instruct-fp8": ("llama-3.1-8b", "fp8"),
    "nvidia/llama-3.1-70b-instruct-fp8": ("llama-3.1-70b", "fp8"),
    "nvidia/llama-3.3-70b-instruct-fp8": ("llama-3.1-70b", "fp8"),
    "neuralmagic/meta-llama-3.1-8b-instruct-fp8": ("llama-3.1-8b", "fp8"),
    "neuralmagic/meta-llama-3.1-70b-instruct-fp8": ("llama-3.1-70b", "fp8"),
    "redhatai/meta-llama-3.1-8b-instruct-fp8": ("llama-3.1-8b", "fp8"),
    "redhatai/meta-llama-3.1-70b-instruct-fp8": ("llama-3.1-70b", "fp8"),
    "redhatai/llama-3.3-70b-instruct-fp8-dynamic": ("llama-3.1-70b", "fp8"),
    "redhatai/qwen3-8b-fp8-dynamic": ("qwen3-8b", "fp8"),
    "redhatai/qwen3-32b-fp8-dynamic": ("qwen3-32b", "fp8"),
    # ModelOpt FP8 (per-tensor, static) with an FP8 KV cache (its hf_quant_config.json).
    "qwen/qwen3-32b-fp8-static-pertensor": ("qwen3-32b", "fp8"),
    "xiaomimimo/mimo-7b-rl": ("mimo-7b", "none"),
    "xiaomimimo/mimo-7b-sft": ("mimo-7b", "none"),
    # Qwen3-VL's language models are Qwen3's (equal config.json dimensions); the vision
    # tower is not counted: a text benchmark does not run it.
    "qwen/qwen3-vl-2b-instruct": ("qwen3-1.7b", "none"),
    "qwen/qwen3-vl-4b-instruct": ("qwen3-4b", "none"),
    "qwen/qwen3-vl-8b-instruct": ("qwen3-8b", "none"),
    "qwen/qwen3-vl-32b-instruct": ("qwen3-32b", "none"),
    "qwen/qwen3-vl-32b-thinking": ("qwen3-32b", "none"),
}


# ModelOpt's FP8 checkpoints also quantise the KV cache ("kv_cache_quant_algo": "FP8" in
# their hf_quant_config.json): vLLM's --kv-cache-dtype auto then runs it in FP8.
_FP8_KV_DENSE = frozenset(k for k in _DENSE_CHECKPOINTS if k.startswith("nvidia/")) | {
    "qwen/qwen3-32b-fp8-static-pertensor"
}

_CHECKPOINTS: dict[str, Checkpoint] = {
    **{
        k: Checkpoint(preset, quantization, kv_cache="fp8" if k in _FP8_KV_DENSE else "auto")
        for k, (preset, quantization) in _DENSE_CHECKPOINTS.items()
    },
    **MOE_CHECKPOINTS,
    **GDN_CHECKPOINTS,
}


def known_checkpoints() -> list[str]:
    """Hugging Face ids `get_shape` accepts (case-insensitive)."""
    return sorted(_CHECKPOINTS)


def get_shape(name: str) -> ModelShape:
    """A preset by short name, a known Hugging Face id (FP8 checkpoints carry their
    quantisation, of the weights and, where they declare one, of the KV cache), or a
    local HF `config.json` path (its `quantization_config` read); case-insensitive."""
    key = name.lower()
    if key in PRESETS:
        return PRESETS[key]
    checkpoint = _CHECKPOINTS.get(key)
    if checkpoint is not None:
        return replace(
            PRESETS[checkpoint.preset],
            quantization=checkpoint.quantization,
            kv_cache_dtype=checkpoint.kv_cache,
            quantized_scope=checkpoint.scope,
            int4_group_size=checkpoint.int4_group_size,
        )
    path = Path(name)
    if path.exists():
        return load_hf_config(path)
    raise ShapeError(
        f"unknown model shape {name!r}: expected one of {sorted(PRESETS)}, a Hugging Face id "
        "such as meta-llama/Llama-3.1-70B-Instruct or nvidia/Llama-3.1-8B-Instruct-FP8 (all: "
        "optimizer.shapes.known_checkpoints()), or a path to a Hugging Face config.json"
    )
