"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2; `ModelShape.mla`) priced by the
roofline at its latent dimensions: an estimate, listed by `Pricing.estimated_ops` as
"prefill_attn:mla" / "decode_attn:mla" (AIConfigurator's mla/ tables are not imported).

The roofline's attention work (`features.work`) is written for H heads of width d over
G KV heads; MLA maps onto it as vLLM runs it:

- decode (weights absorbed, FlashMLA / FlashInfer MLA): every head scores the query
  against the cached latent plus rotary key (kv_lora_rank + qk_rope_head_dim wide) and
  sums the latent (kv_lora_rank wide): d = (cache_width + kv_lora_rank) / 2 gives its
  FLOPs, G = cache_width / (2d) its one shared cache row per token (bytes of the latent
  cache, read once for all heads);
- prefill (the latent up-projected to per-head keys and values, as MHA): d =
  (qk_head_dim + v_head_dim) / 2 and G = H (the up-projection GEMM itself is not priced).

The projections around it (q_a/q_b, kv_a, kv_b, o) are priced as the shape's dense
projections of its heads x head_dim, an approximation of the same order. Torch-free.
"""

from __future__ import annotations

from optimizer.shapes import ModelShape


def mla_heads(shape: ModelShape, tp: int, decode: bool) -> dict[str, object]:
    """The attention parameters (per GPU) that give an MLA layer's work, see above."""
    spec = shape.mla
    if spec is None:
        raise ValueError(f"{shape.name} has no MLA attention")
    heads = shape.num_heads / tp
    if decode:
        d = (spec.cache_width + spec.kv_lora_rank) / 2.0
        return {"num_heads": heads, "num_kv_heads": spec.cache_width / (2.0 * d), "head_dim": d}
    d = (spec.qk_head_dim + spec.v_head_dim) / 2.0
    return {"num_heads": heads, "num_kv_heads": heads, "head_dim": d}
