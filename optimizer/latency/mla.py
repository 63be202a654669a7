"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2; `ModelShape.mla`) in `Pricing`.

Measured: when the shape's MLA layer has the dims AIConfigurator measured
(`mla_module.MEASURED`: DeepSeek-V3/R1, Kimi-K2) and the learned model holds vLLM's
whole-block ops in the projections' weight format and the KV cache's (`mla_prefill` /
`mla_decode`, or their `_fp8kv` twins; `profiler.importers.aiconfigurator_mla`), each
MLA layer is priced by them: a prefill chunk as one block of its q tokens over its kv
keys, the decodes of a step as one block of their sequences (`module_prefill_ms`,
`module_decode_ms`). The block holds the layer's q/kv projections, RoPE and o_proj, so
`Pricing.layer_ms` then prices none of those as GEMMs (`BLOCK_OPS`): nothing twice.
Approximations: the prefill rows have no cached prefix (a chunk after one is priced at
its own q and kv, the work features counting the prefix's keys); a step's prefill chunks
and its decodes each pay the block's projections over their own tokens (the measured
block is launched once per group); verification (K+1 queries per sequence) is priced as
K+1 decoding sequences per sequence (every query position reads its sequence's cache).

Otherwise (other MLA dims, or no such ops fitted) the roofline prices the attention at
its latent dimensions, listed by `Pricing.estimated_ops` as "prefill_attn:mla" /
"decode_attn:mla". The roofline's attention work (`features.work`) is written for H
heads of width d over G KV heads; MLA maps onto it as vLLM runs it:

- decode (weights absorbed, FlashMLA / FlashInfer MLA): every head scores the query
  against the cached latent plus rotary key (kv_lora_rank + qk_rope_head_dim wide) and
  sums the latent (kv_lora_rank wide): d = (cache_width + kv_lora_rank) / 2 gives its
  FLOPs, G = cache_width / (2d) its one shared cache row per token (bytes of the latent
  cache, read once for all heads);
- prefill (the latent up-projected to per-head keys and values, as MHA): d =
  (qk_head_dim + v_head_dim) / 2 and G = H (the up-projection GEMM itself is not priced).

There the projections around it (q_a/q_b, kv_a, kv_b, o) are priced as the shape's dense
projections of its heads x head_dim, an approximation of the same order. Torch-free.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from optimizer.latency.features import FP8_DTYPE, LOW_BIT_BYTES, OpBatch
from optimizer.latency.mla_module import MEASURED, mla_op
from optimizer.latency.model import LatencyModel, OpModel
from optimizer.records import OpKind
from optimizer.shapes import ModelShape


class Pricing(Protocol):
    """What this module reads of `compose.Pricing` (which imports it)."""

    shape: ModelShape
    tp: int
    learned: LatencyModel | None

    @property
    def scale(self) -> float: ...

    def weight_format(self, op: OpKind) -> str: ...


# The per-layer ops the measured block holds (priced by it, not as separate operators)
BLOCK_OPS = frozenset({OpKind.QKV_PROJ, OpKind.ATTN_OUT_PROJ, OpKind.ROPE})
BLOCK_ATTENTION = frozenset({OpKind.PREFILL_ATTN, OpKind.DECODE_ATTN})


def mla_heads(shape: ModelShape, tp: int, decode: bool) -> dict[str, object]:
    """The attention parameters (per GPU) that give an MLA layer's roofline work, see
    above."""
    spec = shape.mla
    if spec is None:
        raise ValueError(f"{shape.name} has no MLA attention")
    heads = shape.num_heads / tp
    if decode:
        d = (spec.cache_width + spec.kv_lora_rank) / 2.0
        return {"num_heads": heads, "num_kv_heads": spec.cache_width / (2.0 * d), "head_dim": d}
    d = (spec.qk_head_dim + spec.v_head_dim) / 2.0
    return {"num_heads": heads, "num_kv_heads": heads, "head_dim": d}


def measured_dims(shape: ModelShape) -> bool:
    """Whether the shape's MLA layer has the dims of the measured block (any head count)."""
    spec = shape.mla
    if spec is None:
        return False
    have = {
        "hidden_size": shape.hidden_size,
        "q_lora_rank": spec.q_lora_rank,
        "kv_lora_rank": spec.kv_lora_rank,
        "qk_nope_head_dim": spec.qk_nope_head_dim,
        "qk_rope_head_dim": spec.qk_rope_head_dim,
        "v_head_dim": spec.v_head_dim,
    }
    return have == MEASURED


def block_models(pricing: Pricing) -> tuple[OpModel, OpModel] | None:
    """(prefill, decode) block models for this shape's MLA layers, or None when they
    cannot price it (no MLA, other dims, or either op not fitted in the shape's formats)."""
    shape, learned = pricing.shape, pricing.learned
    if learned is None or not measured_dims(shape) or shape.dsa is not None:
        return None  # (the measured block is dense MLA: a DSA layer reads fewer keys)
    fmt = pricing.weight_format(OpKind.QKV_PROJ)  # the projections' weight format
    fp8_kv = shape.kv_cache_dtype == "fp8"
    prefill = learned.op_model(mla_op(False, fp8_kv), fmt)
    decode = learned.op_model(mla_op(True, fp8_kv), fmt)
    if prefill is None or decode is None:
        return None
    return prefill, decode


def _block_ms(pricing: Pricing, model: OpModel, **params: object) -> np.ndarray:
    shape = pricing.shape
    fmt = pricing.weight_format(OpKind.QKV_PROJ)
    weights = LOW_BIT_BYTES.get(fmt) or (1.0 if fmt == FP8_DTYPE else float(shape.dtype_bytes))
    batch = OpBatch.make(
        model.op,
        float(shape.dtype_bytes),
        weight_dtype_bytes=weights,
        kv_dtype_bytes=float(shape.kv_dtype_bytes),
        weight_format=fmt if fmt in LOW_BIT_BYTES else "",
        num_heads=shape.num_heads / pricing.tp,
        n=MEASURED["kv_lora_rank"],
        k=MEASURED["hidden_size"],
        head_dim=MEASURED["qk_nope_head_dim"] + MEASURED["qk_rope_head_dim"],
        **params,
    )
    alone = np.maximum(model.predict_ms(batch), 1e-6)
    return alone * pricing.scale if pricing.scale != 1.0 else alone


def module_prefill_ms(
    pricing: Pricing, model: OpModel, q: np.ndarray, kv: np.ndarray
) -> np.ndarray:
    """One layer's MLA block for a prefill chunk of q tokens over kv keys, ms."""
    return _block_ms(pricing, model, batch_size=1, q_len=q, kv_len=kv, num_tokens=q)


def module_decode_ms(
    pricing: Pricing, model: OpModel, num_seqs: np.ndarray, kv: np.ndarray, decode_q: int
) -> np.ndarray:
    """One layer's MLA block for num_seqs decoding sequences at KV length kv, ms (with
    decode_q > 1, as decode_q x num_seqs sequences: see the module docstring)."""
    b = num_seqs * float(decode_q)
    return _block_ms(pricing, model, batch_size=b, q_len=1, kv_len=kv, num_tokens=b)
