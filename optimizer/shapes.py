"""Model shapes: the dimensions that decide what a transformer step costs.

A `ModelShape` is the single description of a dense decoder-only transformer
used by the profiler (to build kernels), the latency model (to compute
features) and the simulator (to size the KV cache). Presets cover the models
users ask about most; `load_hf_config` reads a Hugging Face `config.json`
from a local path (never the network).

This module imports neither torch nor anything else heavy, so the optimizer
and API may import it freely.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
}


QUANTIZATIONS = ("none", "fp8")


class ShapeError(ValueError):
    """A model shape or its config file is invalid."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Dimensions of a dense transformer (GQA when `num_kv_heads < num_heads`)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool = True
    dtype: str = "bfloat16"  # activations (and weights unless quantised)
    quantization: str = "none"  # "fp8": projection weights (and their GEMMs) in FP8

    def __post_init__(self) -> None:
        for field in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ShapeError(f"{self.name}: {field} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ShapeError(
                f"{self.name}: num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.dtype not in DTYPE_BYTES:
            raise ShapeError(
                f"{self.name}: dtype {self.dtype!r} is not one of {sorted(DTYPE_BYTES)}"
            )
        if self.quantization not in QUANTIZATIONS:
            raise ShapeError(
                f"{self.name}: quantization {self.quantization!r} is not one of {QUANTIZATIONS}"
            )

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def params_per_layer(self) -> int:
        h, d = self.hidden_size, self.head_dim
        qkv = h * (self.num_heads + 2 * self.num_kv_heads) * d
        out = self.num_heads * d * h
        mlp = (3 if self.gated_mlp else 2) * h * self.intermediate_size
        norms = 2 * h
        return qkv + out + mlp + norms

    @property
    def num_params(self) -> int:
        # Embedding and LM head are counted separately (untied), plus the final norm.
        return (
            self.num_layers * self.params_per_layer
            + 2 * self.vocab_size * self.hidden_size
            + self.hidden_size
        )

    def weight_bytes(self, tp: int = 1) -> int:
        """Bytes of weights one GPU holds at tensor-parallel degree `tp`."""
        return self.num_params * self.dtype_bytes // tp

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV-cache bytes per token on one GPU: 2 x layers x kv_heads x head_dim x dtype / tp."""
        kv_heads_per_gpu = max(1, self.num_kv_heads // tp)
        return 2 * self.num_layers * kv_heads_per_gpu * self.head_dim * self.dtype_bytes

    def with_dtype(self, dtype: str) -> ModelShape:
        return replace(self, dtype=dtype)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, inter: int, vocab: int):
    return ModelShape(name, layers, hidden, heads, kv, hidden // heads, inter, vocab)


PRESETS: dict[str, ModelShape] = {
    s.name: s
    for s in (
        _llama("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256),
        _llama("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256),
        _llama("llama-3.2-1b", 16, 2048, 32, 8, 8192, 128256),  # a draft for Llama-3.1
        _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000),
        _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000),
        _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32768),
        ModelShape("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936),
        ModelShape("qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151936),
        # Tiny shapes sized for CPU profiling and the reference engine.
        ModelShape("tiny", 4, 256, 8, 2, 32, 768, 4096, dtype="float32"),
        ModelShape("tiny-draft", 1, 256, 8, 2, 32, 768, 4096, dtype="float32"),
        ModelShape("small", 8, 512, 8, 2, 64, 1536, 8192, dtype="float32"),
    )
}


def get_shape(name: str) -> ModelShape:
    """Return a preset by name (case-insensitive), or load a local HF `config.json` path."""
    key = name.lower()
    if key in PRESETS:
        return PRESETS[key]
    path = Path(name)
    if path.exists():
        return load_hf_config(path)
    raise ShapeError(
        f"unknown model shape {name!r}: expected one of {sorted(PRESETS)} "
        "or a path to a Hugging Face config.json"
    )


def load_hf_config(path: str | Path, name: str | None = None) -> ModelShape:
    """Build a shape from a local Hugging Face `config.json` (or a folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShapeError(f"{path}: cannot read a JSON model config: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ShapeError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    required = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
    missing = [k for k in required if k not in cfg]
    if missing:
        raise ShapeError(f"{path}: missing keys {missing} (expected a decoder-only HF config)")
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    dtype = str(cfg.get("torch_dtype") or "bfloat16")
    act = str(cfg.get("hidden_act", "silu"))
    return ModelShape(
        name=name or str(cfg.get("_name_or_path") or path.parent.name or "custom"),
        num_layers=int(cfg["num_hidden_layers"]),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(cfg["intermediate_size"]),
        vocab_size=int(cfg.get("vocab_size", 32000)),
        gated_mlp=act in ("silu", "swiglu", "gelu_pytorch_tanh") or "gate" in act,
        dtype=dtype if dtype in DTYPE_BYTES else "bfloat16",
    )
