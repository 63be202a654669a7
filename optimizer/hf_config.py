"""Read a `ModelShape` from a Hugging Face `config.json` (a local path; never the network).

Dense and mixture-of-experts decoders are read: routed experts (`num_experts`,
`num_local_experts` or `n_routed_experts`), the experts a token runs
(`num_experts_per_tok`, gpt-oss's `experts_per_token`), the expert width
(`moe_intermediate_size`; gpt-oss, Mixtral, MiniMax and Llama-4 use `intermediate_size`,
Llama-4's dense layers `intermediate_size_mlp`), shared experts (Qwen2-MoE's
`shared_expert_intermediate_size`, DeepSeek's `n_shared_experts` x expert width,
Llama-4's one shared expert), dense layers before the first MoE layer
(`first_k_dense_replace`, Qwen's `mlp_only_layers` when they are the first layers) and
MoE every n-th layer (`decoder_sparse_step`, `interleave_moe_layer_step`); Llama-4's
nested `text_config`; latent attention (`kv_lora_rank`, `q_lora_rank`,
`qk_rope_head_dim`, `qk_nope_head_dim`, `v_head_dim`); sliding-window layers
(`sliding_window` with gpt-oss's `layer_types`, off under `use_sliding_window: false`);
Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5 / 3.6: `_GDN_MODEL_TYPES`): `layer_types`
of "linear_attention" and "full_attention", or without them every
`full_attention_interval`-th layer full attention (transformers' default 4), the
`linear_*` head counts and widths, `mamba_ssm_dtype` (the recurrent state's, default the
activation dtype as vLLM's --mamba-ssm-cache-dtype auto) and `attn_output_gate`
(default on: vLLM's Qwen3-Next attention gates unless told not to); their MTP module
(`mtp_num_hidden_layers`) and vision tower are left out. And the `quantization_config` (or
ModelOpt's `hf_quant_config.json` beside the file): see `hf_quant`. A field the shape
cannot honour (other linear attention, such as MiniMax's `attn_type_list` 0, MoE layers
not at the end, two keys that disagree) is a ShapeError naming the file and the key.
"""

from __future__ import annotations

import json
from pathlib import Path

from optimizer.hf_quant import read_kv_cache_dtype, read_quantization
from optimizer.model_shape import ModelShape
from optimizer.shape_parts import (
    DTYPE_BYTES,
    DSASpec,
    GatedDeltaNetSpec,
    MLASpec,
    MoESpec,
    ShapeError,
)

_NUM_EXPERTS_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
# Attention a config declares that servetune does not price (Kimi-Linear's KDA layers,
# MiniMax-M3's sparse attention): refused by key rather than read as softmax attention.
_UNMODELLED_ATTENTION = ("linear_attn_config", "sparse_attention_config")
_TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token")
_LAYER_TYPES = ("full_attention", "sliding_attention")
# Gated DeltaNet hybrids: Qwen3-Next and Qwen3.5 / 3.6 (Qwen3.6 ships Qwen3.5's types),
# the ConditionalGeneration wrappers' text_config included.
_GDN_MODEL_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
_GDN_LAYER_TYPES = ("full_attention", "linear_attention")
_GDN_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
             "linear_value_head_dim")  # fmt: skip


def _read_json(path: Path, what: str) -> dict:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShapeError(f"{path}: cannot read a JSON {what}: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ShapeError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    return cfg


def _int(cfg: dict, key: str, path: Path, default: int | None = None) -> int:
    """`cfg[key]` as an int >= 0 (`default` when absent or null)."""
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise ShapeError(f"{path}: {key} is missing (expected an integer)")
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ShapeError(f"{path}: {key} must be an integer >= 0, got {value!r}")
    return value


def _one_of(cfg: dict, keys: tuple[str, ...], path: Path) -> int | None:
    """The value the present `keys` agree on (None when none is set)."""
    found = {k: _int(cfg, k, path) for k in keys if cfg.get(k) is not None}
    if len(set(found.values())) > 1:
        raise ShapeError(f"{path}: {' and '.join(found)} disagree: {found}")
    return next(iter(found.values()), None)


def _moe_spec(cfg: dict, path: Path, num_layers: int) -> tuple[MoESpec | None, int]:
    """The MoE spec (None for a dense model) and the dense layers' MLP width."""
    num_experts = _one_of(cfg, _NUM_EXPERTS_KEYS, path)
    dense_width = _int(cfg, "intermediate_size", path, default=0)
    if not num_experts:
        return None, _int(cfg, "intermediate_size", path)
    top_k = _one_of(cfg, _TOP_K_KEYS, path)
    if top_k is None:
        raise ShapeError(f"{path}: num_experts_per_tok is missing for a MoE config")
    if cfg.get("moe_intermediate_size") is not None:
        expert_width = _int(cfg, "moe_intermediate_size", path)
    else:  # gpt-oss, Mixtral, MiniMax, Llama-4: intermediate_size is the expert's width
        expert_width = dense_width
        dense_width = _int(cfg, "intermediate_size_mlp", path, default=dense_width)
    shared = _int(cfg, "shared_expert_intermediate_size", path, default=0)
    n_shared = _int(cfg, "n_shared_experts", path, default=0)
    if shared and n_shared:
        raise ShapeError(
            f"{path}: shared_expert_intermediate_size and n_shared_experts are both set"
        )
    if n_shared:
        shared = n_shared * expert_width
    if str(cfg.get("model_type", "")).startswith("llama4"):
        shared = expert_width  # every Llama-4 MoE layer adds one shared expert
    first_dense = _int(cfg, "first_k_dense_replace", path, default=0)
    mlp_only = cfg.get("mlp_only_layers") or []
    if mlp_only:
        if first_dense or list(mlp_only) != list(range(len(mlp_only))):
            raise ShapeError(
                f"{path}: mlp_only_layers {mlp_only!r} is not modelled (only dense layers "
                "before the first MoE layer are)"
            )
        first_dense = len(mlp_only)
    step = _one_of(cfg, ("decoder_sparse_step", "interleave_moe_layer_step"), path)
    freq = _int(cfg, "moe_layer_freq", path, default=1)
    if freq != 1:
        raise ShapeError(f"{path}: moe_layer_freq {freq} is not modelled (1 is)")
    if step and first_dense and step != 1:
        raise ShapeError(
            f"{path}: first dense layers with a MoE layer step of {step} are not modelled"
        )
    spec = MoESpec(
        num_experts=num_experts,
        experts_per_token=top_k,
        expert_intermediate_size=expert_width,
        shared_intermediate_size=shared,
        first_dense_layers=first_dense,
        layer_step=step or 1,
    )
    spec.check(str(path))
    if spec.num_moe_layers(num_layers) == 0:
        raise ShapeError(f"{path}: first_k_dense_replace {first_dense} leaves no MoE layer")
    if not dense_width:  # Qwen3.5-MoE: no dense layer, no intermediate_size
        if spec.num_moe_layers(num_layers) < num_layers:
            raise ShapeError(f"{path}: intermediate_size is missing (the dense layers need it)")
        dense_width = expert_width
    return spec, dense_width


def _mla_spec(cfg: dict, path: Path) -> MLASpec | None:
    if cfg.get("kv_lora_rank") is None:
        return None
    spec = MLASpec(
        kv_lora_rank=_int(cfg, "kv_lora_rank", path),
        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", path),
        qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", path),
        v_head_dim=_int(cfg, "v_head_dim", path),
        q_lora_rank=_int(cfg, "q_lora_rank", path, default=0),
    )
    spec.check(str(path))
    return spec


def _dsa_spec(cfg: dict, path: Path, mla: MLASpec | None) -> DSASpec | None:
    """DeepSeek sparse attention (DeepSeek-V3.2's DeepseekV32ForCausalLM, GLM-5's
    GlmMoeDsa): `index_topk` keys per query picked by an indexer of `index_n_heads` x
    `index_head_dim` (None without index_topk)."""
    keys = ("index_topk", "index_n_heads", "index_head_dim")
    if all(cfg.get(k) is None for k in keys):
        return None
    if mla is None or not mla.q_lora_rank:
        raise ShapeError(
            f"{path}: index_topk (DeepSeek sparse attention) without MLA and a query latent "
            "(kv_lora_rank, q_lora_rank) is not modelled"
        )
    spec = DSASpec(*(_int(cfg, k, path) for k in ("index_n_heads", "index_head_dim", "index_topk")))
    spec.check(str(path))
    return spec


def _layer_types(cfg: dict, path: Path, num_layers: int) -> list[str] | None:
    """The config's `layer_types` (None when absent), one known type per layer: full and
    sliding attention, or for a Gated DeltaNet hybrid full and linear attention."""
    types = cfg.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != num_layers:
        raise ShapeError(
            f"{path}: layer_types must list one type per layer ({num_layers}), got {types!r}"
        )
    gdn = cfg.get("model_type") in _GDN_MODEL_TYPES
    known = _GDN_LAYER_TYPES if gdn else _LAYER_TYPES
    unknown = sorted({str(t) for t in types if t not in known})
    if unknown:
        note = "" if gdn else f" (linear_attention is read for {', '.join(_GDN_MODEL_TYPES)})"
        raise ShapeError(f"{path}: layer_types {unknown} are not modelled (expected {known}){note}")
    return types


def _gdn_spec(cfg: dict, path: Path, num_layers: int, dtype: str) -> GatedDeltaNetSpec | None:
    """The Gated DeltaNet layers of a Qwen3-Next / Qwen3.5 config (None for other models,
    or when every layer is full attention): how many, from `layer_types` or, without
    them, `full_attention_interval` (layers n, 2n, ... counted from 1 are full attention,
    the others linear; transformers' default n is 4)."""
    if cfg.get("model_type") not in _GDN_MODEL_TYPES:
        return None
    types = _layer_types(cfg, path, num_layers)
    if types is not None:
        linear, source = types.count("linear_attention"), "layer_types"
    else:
        interval = _int(cfg, "full_attention_interval", path, default=4)
        if interval < 1:
            raise ShapeError(f"{path}: full_attention_interval must be >= 1, got {interval}")
        linear = num_layers - num_layers // interval
        source = f"full_attention_interval {interval}"
    if linear == 0:
        return None
    if linear == num_layers:
        raise ShapeError(f"{path}: {source} leaves no full_attention layer among "
                         f"{num_layers} (at least one is modelled)")  # fmt: skip
    ssm = cfg.get("mamba_ssm_dtype") or dtype
    if ssm not in ("float32", "bfloat16", "float16"):
        raise ShapeError(
            f"{path}: mamba_ssm_dtype {ssm!r} is not one of float32, bfloat16, float16"
        )
    heads_k, heads_v, dim_k, dim_v = (_int(cfg, k, path) for k in _GDN_KEYS)
    spec = GatedDeltaNetSpec(
        num_layers=linear,
        num_key_heads=heads_k,
        num_value_heads=heads_v,
        key_head_dim=dim_k,
        value_head_dim=dim_v,
        conv_kernel=_int(cfg, "linear_conv_kernel_dim", path, default=4),
        ssm_dtype=ssm,
    )
    spec.check(str(path))
    return spec


def _attn_output_gate(cfg: dict, path: Path) -> bool:
    """`attn_output_gate`; absent, on for the Gated DeltaNet families (vLLM's
    Qwen3NextAttention: getattr(config, "attn_output_gate", True)), off otherwise."""
    value = cfg.get("attn_output_gate")
    if value is None:
        return cfg.get("model_type") in _GDN_MODEL_TYPES
    if not isinstance(value, bool):
        raise ShapeError(f"{path}: attn_output_gate must be true or false, got {value!r}")
    return value


def _sliding(cfg: dict, path: Path, num_layers: int) -> tuple[int, int]:
    """(window, layers with it): gpt-oss's `layer_types`; without them a set
    `sliding_window` covers every layer (Mistral-7B-v0.1); `use_sliding_window: false`
    (Qwen) turns it off."""
    types = _layer_types(cfg, path, num_layers)
    attn_types = cfg.get("attn_type_list")  # MiniMax: 1 softmax attention, 0 linear
    if attn_types is not None and (not isinstance(attn_types, list) or set(attn_types) - {1}):
        raise ShapeError(
            f"{path}: attn_type_list {attn_types!r}: only softmax attention layers (1) are "
            "modelled, not linear attention (0)"
        )
    if cfg.get("use_sliding_window") is False:
        return 0, 0
    window = _int(cfg, "sliding_window", path, default=0)
    count = num_layers if types is None else types.count("sliding_attention")
    if types is not None and count and not window:
        raise ShapeError(f"{path}: layer_types has sliding_attention but no sliding_window")
    return (window, count) if window and count else (0, 0)


def _quant_config(top: dict, cfg: dict, path: Path) -> object:
    """The top level's `quantization_config`, else the text config's (Kimi-K2.5 nests it
    there), else ModelOpt's sidecar."""
    qc = top.get("quantization_config", cfg.get("quantization_config"))
    sidecar = path.with_name("hf_quant_config.json")  # ModelOpt's export beside config.json
    if qc is None and sidecar.is_file():
        qc = _read_json(sidecar, "quantization config")
        if isinstance(qc.get("quantization"), dict):
            qc = {"quant_method": "modelopt", **qc["quantization"]}
    return qc


def load_hf_config(path: str | Path, name: str | None = None) -> ModelShape:
    """Build a shape from a local Hugging Face `config.json` (or a folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    top = _read_json(path, "model config")
    text = top.get("text_config")  # Llama-4 and other multimodal wrappers
    cfg = {**top, **text} if isinstance(text, dict) else top
    required = ["num_hidden_layers", "hidden_size", "num_attention_heads"]
    if cfg.get("moe_intermediate_size") is None:  # else a MoE may have no dense width
        required.append("intermediate_size")
    missing = [k for k in required if k not in cfg]
    if missing:
        raise ShapeError(f"{path}: missing keys {missing} (expected a decoder-only HF config)")
    for key in _UNMODELLED_ATTENTION:
        if cfg.get(key) is not None:
            raise ShapeError(
                f"{path}: {key} ({cfg.get('architectures')}): this attention is not modelled "
                "(softmax, MLA, DeepSeek sparse attention, sliding windows and Gated DeltaNet "
                "are)"
            )
    layers = _int(cfg, "num_hidden_layers", path)
    heads = _int(cfg, "num_attention_heads", path)
    hidden = _int(cfg, "hidden_size", path)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    dtype = dtype if dtype in DTYPE_BYTES else "bfloat16"
    act = str(cfg.get("hidden_act", "silu"))
    moe, dense_width = _moe_spec(cfg, path, layers)
    mla = _mla_spec(cfg, path)
    dsa = _dsa_spec(cfg, path, mla)
    window, window_layers = _sliding(cfg, path, layers)
    gdn = _gdn_spec(cfg, path, layers, dtype)
    qc = _quant_config(top, cfg, path)
    quant = read_quantization(qc, path, hidden)
    if quant.scope == "experts" and moe is None:
        raise ShapeError(
            f"{path}: quantization_config leaves attention unquantised (its exclusion "
            "list) but the model has no experts to quantise"
        )
    if mla is not None:
        num_kv_heads, head_dim = heads, mla.qk_head_dim
    else:
        num_kv_heads = _int(cfg, "num_key_value_heads", path, default=heads) or heads
        head_dim = _int(cfg, "head_dim", path, default=0) or hidden // heads
    return ModelShape(
        name=name or str(cfg.get("_name_or_path") or path.parent.name or "custom"),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=dense_width,
        vocab_size=_int(cfg, "vocab_size", path, default=32000),
        gated_mlp=act in ("silu", "swiglu", "gelu_pytorch_tanh") or "gate" in act,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        dtype=dtype,
        quantization=quant.quantization,
        kv_cache_dtype=read_kv_cache_dtype(qc, path),
        moe=moe,
        mla=mla,
        sliding_window=window,
        sliding_window_layers=window_layers,
        quantized_scope=quant.scope,
        int4_group_size=quant.int4_group_size,
        gdn=gdn,
        attn_output_gate=_attn_output_gate(cfg, path),
        dsa=dsa,
    )
