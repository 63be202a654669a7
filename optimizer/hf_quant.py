"""Read the weight and KV-cache formats a Hugging Face `quantization_config` declares.

Weights (`read_quantization`):

- "fp8": `quant_method: fp8` (vLLM's own, block-scaled with `weight_block_size` as
  DeepSeek-V3 and Qwen3-FP8 ship), ModelOpt `quant_algo: FP8`, compressed-tensors with
  8-bit float weights;
- "fp4" (NVFP4): ModelOpt `quant_algo: NVFP4`, compressed-tensors 4-bit float weights in
  groups of 16;
- "mxfp4": `quant_method: mxfp4` (gpt-oss);
- "int4": compressed-tensors 4-bit int weights (pack-quantized, Kimi-K2-Thinking), AWQ,
  GPTQ with `bits: 4`, each with its group size (one 16-bit scale per group).

Which weights are quantised: an exclusion list (`modules_to_not_convert`, `ignore`,
`exclude_modules`) keeping attention out whole means only the experts are ("experts":
attention, dense MLPs and shared experts stay 16-bit, as gpt-oss's MXFP4 and
Kimi-K2-Thinking's INT4 ship); otherwise every linear layer is ("linear"). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from optimizer.shape_parts import DEFAULT_INT4_GROUP_SIZE, ShapeError

_EXCLUSION_KEYS = ("modules_to_not_convert", "ignore", "exclude_modules")
_NVFP4_GROUP = 16


@dataclass(frozen=True, slots=True)
class WeightQuantization:
    """What a checkpoint's weights are stored as: `quantization` (QUANTIZATIONS), over
    `scope` (QUANTIZED_SCOPES), with `int4_group_size` weights per 16-bit scale (int4)."""

    quantization: str = "none"
    scope: str = "linear"
    int4_group_size: int = DEFAULT_INT4_GROUP_SIZE


def _covers_attention(entry: str) -> bool:
    """Whether an exclusion entry keeps attention unquantised: it names an attention module
    whole ("model.layers.*.self_attn", "re:.*self_attn.*") or its output projection (as
    lists spelt out layer by layer do). Excluding only the small latent down-projections
    (DeepSeek's q_a_proj, kv_a_proj_with_mqa) leaves attention quantised."""
    low = entry.lower()
    at = low.rfind("attn")
    if at < 0:
        return False
    rest = low[at + len("attn") :]
    return rest.strip(".*$\\") == "" or "o_proj" in rest


def _scope(qc: dict, path: Path) -> str:
    """The quantised scope: "experts" when the exclusion lists keep attention unquantised
    (`_covers_attention`), else "linear"."""
    excluded: list[str] = []
    for key in _EXCLUSION_KEYS:
        value = qc.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
            raise ShapeError(f"{path}: quantization_config.{key} must be a list of module names")
        excluded += value
    return "experts" if any(_covers_attention(m) for m in excluded) else "linear"


def _group_size(value: object, path: Path, key: str, channel: int) -> int:
    """A 4-bit group size: a positive int, or -1 / None for one scale per output channel
    (a group of `channel` = hidden-size weights, about)."""
    if value is None or value == -1:
        return channel
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ShapeError(f"{path}: quantization_config {key} must be a positive integer or -1")
    return value


def _compressed_tensors(qc: dict, path: Path, hidden: int) -> WeightQuantization:
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict) or not groups:
        raise ShapeError(f"{path}: quantization_config.config_groups: expected an object")
    found = set()
    for name, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            raise ShapeError(f"{path}: quantization_config.config_groups.{name}.weights missing")
        kind, bits = weights.get("type"), weights.get("num_bits")
        where = f"config_groups.{name}.weights.group_size"
        if kind == "float" and bits == 8:
            found.add(("fp8", DEFAULT_INT4_GROUP_SIZE))
        elif kind == "float" and bits == 4:
            size = weights.get("group_size")
            if size != _NVFP4_GROUP:
                raise ShapeError(
                    f"{path}: {where} {size!r}: 4-bit float weights are modelled as NVFP4 "
                    f"(groups of {_NVFP4_GROUP})"
                )
            found.add(("fp4", DEFAULT_INT4_GROUP_SIZE))
        elif kind == "int" and bits == 4:
            found.add(("int4", _group_size(weights.get("group_size"), path, where, hidden)))
        else:
            raise ShapeError(
                f"{path}: quantization_config.config_groups.{name}.weights {kind!r} "
                f"{bits!r}-bit is not supported (8-bit float, 4-bit float or 4-bit int are)"
            )
    if len(found) > 1:
        raise ShapeError(
            f"{path}: quantization_config.config_groups mix weight formats {sorted(found)}"
        )
    quantization, group = found.pop()
    return WeightQuantization(quantization, _scope(qc, path), group)


def read_quantization(qc: object, path: Path, hidden: int) -> WeightQuantization:
    """The weight format a `quantization_config` describes (none without one); `hidden`
    sizes a per-channel INT4 scale's group."""
    if qc is None:
        return WeightQuantization()
    if not isinstance(qc, dict):
        raise ShapeError(f"{path}: quantization_config: expected an object")
    method = str(qc.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return _compressed_tensors(qc, path, hidden)
    scope = _scope(qc, path)
    if method == "fp8":
        return WeightQuantization("fp8", scope)
    if method == "mxfp4":
        return WeightQuantization("mxfp4", scope)
    if method == "modelopt":
        algo = str(qc.get("quant_algo", "")).upper()
        if algo == "FP8":
            return WeightQuantization("fp8", scope)
        if algo == "NVFP4":
            size = qc.get("group_size", _NVFP4_GROUP)
            if size != _NVFP4_GROUP:
                raise ShapeError(
                    f"{path}: quantization_config.group_size {size!r}: NVFP4 is modelled "
                    f"with groups of {_NVFP4_GROUP}"
                )
            return WeightQuantization("fp4", scope)
        raise ShapeError(
            f"{path}: quantization_config.quant_algo {algo!r} is not supported (FP8, NVFP4 are)"
        )
    if method in ("awq", "gptq"):
        bits = qc.get("bits", qc.get("w_bit"))
        if bits != 4:
            raise ShapeError(f"{path}: quantization_config.bits {bits!r}: {method} 4-bit is")
        key = "group_size" if "group_size" in qc else "q_group_size"
        group = _group_size(qc.get(key, 128), path, key, hidden)
        return WeightQuantization("int4", scope, group)
    raise ShapeError(
        f"{path}: quantization_config.quant_method {method or qc!r} is not supported (fp8, "
        "modelopt FP8/NVFP4, compressed-tensors float8/nvfp4/int4, mxfp4, awq, gptq are)"
    )


def read_kv_cache_dtype(qc: object, path: Path) -> str:
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
