"""Model shapes: the dimensions that decide what a transformer step costs.

A `ModelShape` is the single description of a dense decoder-only transformer
used by the profiler (to build kernels), the latency model (to compute
features) and the simulator (to size the KV cache), with its number formats:
activations (`dtype`), linear-layer weights (`quantization`) and KV cache
(`kv_cache_dtype`). Presets cover the models users ask about most, under their
short names and their Hugging Face ids (FP8 checkpoints included);
`load_hf_config` reads a Hugging Face `config.json` from a local path (never the
network), its `quantization_config` included.

This module imports neither torch nor anything else heavy, so the optimizer
and API may import it freely.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from optimizer.shape_parts import MLASpec, MoESpec, ShapeError

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
}


# Linear-layer weights (and their GEMMs): "fp4" is NVFP4 (W4A4, Blackwell), "mxfp4" the
# OCP MX FP4 gpt-oss ships, "int4" weight-only INT4 (16-bit activations, e.g. Kimi-K2).
QUANTIZATIONS = ("none", "fp8", "fp4", "mxfp4", "int4")
KV_CACHE_DTYPES = ("auto", "fp8")  # "auto": the activation dtype, as vLLM's --kv-cache-dtype


@dataclass(frozen=True, slots=True)
class Precision:
    """The number formats of a deployment beyond the activations: linear-layer weights
    (`none`: the activation dtype; `fp8`) and the KV cache (`auto` | `fp8`)."""

    weights: str = "none"
    kv_cache: str = "auto"

    def __post_init__(self) -> None:
        if self.weights not in QUANTIZATIONS:
            raise ShapeError(f"quantization {self.weights!r} is not one of {QUANTIZATIONS}")
        if self.kv_cache not in KV_CACHE_DTYPES:
            raise ShapeError(f"kv_cache_dtype {self.kv_cache!r} is not one of {KV_CACHE_DTYPES}")

    @property
    def label(self) -> str:
        return f"w-{self.weights}.kv-{self.kv_cache}"


DEFAULT_PRECISION = Precision()


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
    tie_word_embeddings: bool = False  # the LM head reuses the embedding table
    dtype: str = "bfloat16"  # activations (and weights unless quantised)
    quantization: str = "none"  # "fp8": linear-layer weights and their GEMMs in FP8
    kv_cache_dtype: str = "auto"  # "fp8": the KV cache in FP8 ("auto": `dtype`)
    moe: MoESpec | None = None  # None: every layer has a dense MLP of intermediate_size
    mla: MLASpec | None = None  # None: standard (GQA) attention of num_kv_heads x head_dim
    # Sliding-window attention: `sliding_window_layers` of the layers attend to the last
    # `sliding_window` tokens only (gpt-oss: every other layer, 128 tokens); 0: none.
    sliding_window: int = 0
    sliding_window_layers: int = 0

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
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ShapeError(
                f"{self.name}: kv_cache_dtype {self.kv_cache_dtype!r} is not one of "
                f"{KV_CACHE_DTYPES}"
            )
        if self.moe is not None:
            if not isinstance(self.moe, MoESpec):
                raise ShapeError(f"{self.name}: moe must be a MoESpec, got {self.moe!r}")
            self.moe.check(f"{self.name}.moe")
        if self.mla is not None:
            if not isinstance(self.mla, MLASpec):
                raise ShapeError(f"{self.name}: mla must be an MLASpec, got {self.mla!r}")
            self.mla.check(f"{self.name}.mla")
        for field in ("sliding_window", "sliding_window_layers"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ShapeError(f"{self.name}: {field} must be an integer >= 0, got {value!r}")
        if self.sliding_window_layers > self.num_layers or (
            bool(self.sliding_window) != bool(self.sliding_window_layers)
        ):
            raise ShapeError(
                f"{self.name}: sliding_window ({self.sliding_window}) and sliding_window_layers "
                f"({self.sliding_window_layers}) must both be 0 or both set, with at most "
                f"num_layers ({self.num_layers}) layers"
            )

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def dtype_bytes(self) -> int:
        """Bytes per activation element (and per weight unless quantised)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def weight_dtype_bytes(self) -> int:
        """Bytes per linear-layer weight (QKV, output, MLP projections)."""
        return 1 if self.quantization == "fp8" else self.dtype_bytes

    @property
    def kv_dtype_bytes(self) -> int:
        """Bytes per KV-cache element."""
        return 1 if self.kv_cache_dtype == "fp8" else self.dtype_bytes

    @property
    def precision(self) -> Precision:
        return Precision(self.quantization, self.kv_cache_dtype)

    def with_precision(self, precision: Precision) -> ModelShape:
        return replace(self, quantization=precision.weights, kv_cache_dtype=precision.kv_cache)

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
        # Embedding and LM head (one table when tied), plus the final norm.
        tables = 1 if self.tie_word_embeddings else 2
        return (
            self.num_layers * self.params_per_layer
            + tables * self.vocab_size * self.hidden_size
            + self.hidden_size
        )

    @property
    def num_linear_params(self) -> int:
        """Parameters of the linear layers (what FP8 quantises); the rest (embedding, LM
        head, norms) stays in `dtype`, as in vLLM's FP8 checkpoints."""
        h, d = self.hidden_size, self.head_dim
        qkv = h * (self.num_heads + 2 * self.num_kv_heads) * d
        mlp = (3 if self.gated_mlp else 2) * h * self.intermediate_size
        return self.num_layers * (qkv + self.num_heads * d * h + mlp)

    def weight_bytes(self, tp: int = 1) -> int:
        """Bytes of weights one GPU holds at tensor-parallel degree `tp` (linear layers at
        their quantised width)."""
        linear = self.num_linear_params
        rest = self.num_params - linear
        return (linear * self.weight_dtype_bytes + rest * self.dtype_bytes) // tp

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV-cache bytes per token on one GPU: 2 x layers x kv_heads x head_dim x KV dtype / tp
        (KV heads are replicated when tp exceeds them)."""
        kv_heads_per_gpu = max(1, self.num_kv_heads // tp)
        return 2 * self.num_layers * kv_heads_per_gpu * self.head_dim * self.kv_dtype_bytes

    def with_dtype(self, dtype: str) -> ModelShape:
        return replace(self, dtype=dtype)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, inter: int, vocab: int):
    return ModelShape(name, layers, hidden, heads, kv, hidden // heads, inter, vocab)


PRESETS: dict[str, ModelShape] = {
    s.name: s
    for s in (
        _llama("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256),
        _llama("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256),
        replace(_llama("llama-3.2-1b", 16, 2048, 32, 8, 8192, 128256), tie_word_embeddings=True),
        _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000),
        _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000),
        _llama("llama-2-13b", 40, 5120, 40, 40, 13824, 32000),
        _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32768),
        ModelShape("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936),
        ModelShape("qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151936),
        ModelShape("qwen3-0.6b", 28, 1024, 16, 8, 128, 3072, 151936, tie_word_embeddings=True),
        _llama("qwen2-7b", 28, 3584, 28, 4, 18944, 152064),
        _llama("qwen1.5-7b", 32, 4096, 32, 32, 11008, 151936),
        _llama("qwen2-72b", 80, 8192, 64, 8, 29568, 152064),
        # Tiny shapes sized for CPU profiling and the reference engine.
        ModelShape("tiny", 4, 256, 8, 2, 32, 768, 4096, dtype="float32"),
        ModelShape("tiny-draft", 1, 256, 8, 2, 32, 768, 4096, dtype="float32"),
        ModelShape("small", 8, 512, 8, 2, 64, 1536, 8192, dtype="float32"),
    )
}


# Each preset's canonical Hugging Face checkpoint (what launch commands name).
HF_IDS: dict[str, str] = {
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
    "qwen2-7b": "Qwen/Qwen2-7B-Instruct",
    "qwen1.5-7b": "Qwen/Qwen1.5-7B-Chat",
    "qwen2-72b": "Qwen/Qwen2-72B-Instruct",
}

# Hugging Face checkpoints -> (preset of the same dimensions, weight quantisation of the
# checkpoint). FP8 checkpoints are pre-quantised: vLLM reads their quantization_config.
_CHECKPOINTS: dict[str, tuple[str, str]] = {
    **{hf.lower(): (preset, "none") for preset, hf in HF_IDS.items()},
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
}


def known_checkpoints() -> list[str]:
    """Hugging Face ids `get_shape` accepts (case-insensitive)."""
    return sorted(_CHECKPOINTS)


# NVIDIA's ModelOpt FP8 checkpoints also quantise the KV cache ("kv_cache_quant_algo":
# "FP8" in their hf_quant_config.json): vLLM's --kv-cache-dtype auto then runs it in FP8.
_FP8_KV_CHECKPOINTS = frozenset(k for k in _CHECKPOINTS if k.startswith("nvidia/"))


def get_shape(name: str) -> ModelShape:
    """A preset by short name, a known Hugging Face id (FP8 checkpoints carry their
    quantisation, of the weights and, where they declare one, of the KV cache), or a
    local HF `config.json` path (its `quantization_config` read); case-insensitive."""
    key = name.lower()
    if key in PRESETS:
        return PRESETS[key]
    checkpoint = _CHECKPOINTS.get(key)
    if checkpoint is not None:
        preset, quantization = checkpoint
        kv = "fp8" if key in _FP8_KV_CHECKPOINTS else "auto"
        return replace(PRESETS[preset], quantization=quantization, kv_cache_dtype=kv)
    path = Path(name)
    if path.exists():
        return load_hf_config(path)
    raise ShapeError(
        f"unknown model shape {name!r}: expected one of {sorted(PRESETS)}, a Hugging Face id "
        "such as meta-llama/Llama-3.1-70B-Instruct or nvidia/Llama-3.1-8B-Instruct-FP8 (all: "
        "servetune.shapes.known_checkpoints), or a path to a Hugging Face config.json"
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
    qc = cfg.get("quantization_config")
    sidecar = path.with_name("hf_quant_config.json")  # ModelOpt's export beside config.json
    if qc is None and sidecar.is_file():
        try:
            qc = json.loads(sidecar.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ShapeError(f"{sidecar}: cannot read a JSON quantization config: {exc}") from exc
        if isinstance(qc, dict) and isinstance(qc.get("quantization"), dict):
            qc = {"quant_method": "modelopt", **qc["quantization"]}
    quantization = _quantization(qc, path)
    kv_cache = _kv_cache_quantization(qc, path)
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
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        dtype=dtype if dtype in DTYPE_BYTES else "bfloat16",
        quantization=quantization,
        kv_cache_dtype=kv_cache,
    )


def _kv_cache_quantization(qc: object, path: Path) -> str:
    """The KV-cache format a `quantization_config` declares ("auto" without one): ModelOpt's
    `kv_cache_quant_algo: FP8`, or compressed-tensors' `kv_cache_scheme` of 8-bit floats
    (vLLM's --kv-cache-dtype auto then runs the KV cache in FP8)."""
    if not isinstance(qc, dict):
        return "auto"
    algo = qc.get("kv_cache_quant_algo")
    if algo is not None:
        if str(algo).upper() != "FP8":
            raise ShapeError(
                f"{path}: kv_cache_quant_algo {algo!r} is not supported (FP8 KV caches are)"
            )
        return "fp8"
    scheme = qc.get("kv_cache_scheme")
    if isinstance(scheme, dict):
        if scheme.get("type") == "float" and scheme.get("num_bits") == 8:
            return "fp8"
        raise ShapeError(
            f"{path}: kv_cache_scheme {scheme!r} is not supported (8-bit float KV caches are)"
        )
    return "auto"


def _quantization(qc: object, path: Path) -> str:
    """The weight quantisation a `quantization_config` describes ("none" without one):
    FP8 checkpoints say `quant_method: fp8` (vLLM's own), `modelopt` with
    `quant_algo: FP8`, or `compressed-tensors` with 8-bit float weights."""
    if qc is None:
        return "none"
    if not isinstance(qc, dict):
        raise ShapeError(f"{path}: quantization_config: expected an object")
    method = str(qc.get("quant_method", "")).lower()
    if method == "fp8":
        return "fp8"
    if method == "modelopt" and str(qc.get("quant_algo", "")).upper() == "FP8":
        return "fp8"
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        weights = [g.get("weights") or {} for g in groups.values() if isinstance(g, dict)]
        if weights and all(w.get("type") == "float" and w.get("num_bits") == 8 for w in weights):
            return "fp8"
    raise ShapeError(
        f"{path}: quantization_config {method or qc!r} is not supported (FP8 checkpoints are: "
        "quant_method fp8, modelopt FP8, compressed-tensors float8); int4 is not modelled yet"
    )
