"""DeepSeek sparse attention (DeepSeek-V3.2, GLM-5; `ModelShape.dsa`) in `Pricing`.

A DSA layer is an MLA layer whose attention reads, per query, only the `index_topk`
keys a lightning indexer picked. Estimated (the roofline's), listed by
`Pricing.estimated_ops` ("prefill_attn:mla", "decode_attn:mla", "dsa_indexer"):

- sparse attention: the dense MLA attention's price scaled by the share of its keys a
  query still reads (`sparse_share`: query j of a chunk after p cached tokens reads
  min(p + j, index_topk) keys instead of p + j); a decoding sequence reads
  min(its KV, index_topk) keys;
- the indexer scores every cached key of every query, index_n_heads x index_head_dim
  multiply-adds in FP8, reading its FP8 key cache (`DSASpec.cache_bytes` a token) and
  writing and reading one fp32 score per (query, key) for the top-k selection;
- its projections (wq_b from the query latent, wk and weights_proj from the hidden
  state) are GEMMs in `Pricing.layer_ms`.

Measured decodes: when the shape's layer has the dims of a layer AIConfigurator measured
(`dsa_module.MEASURED`: DeepSeek-V3.2, GLM-5), its per-rank heads were measured and the
learned model holds vLLM's whole DSA decode block in the projections' weight format and
the KV cache's (`dsa_decode` / `dsa_decode_fp8kv`; `decode_block`), a step's decodes of b
sequences at mean KV kv inside the measured ranges (1 to 1,024 sequences, 2 to 131,072
keys in aiconfigurator-core 0.12) are priced by it as one block (`block_decode_ms`;
verification's K+1 queries as K+1 sequences each, as `mla` does); outside them by the
estimate above plus the block's projections over the decode tokens. The block holds the
layer's q/kv and indexer projections, RoPE and o_proj, so `Pricing.layer_ms` then prices
none of those, and each prefill chunk pays them over its own tokens
(`Pricing.dsa_projections_ms`): nothing twice. `estimated_ops` then lists the decode as
"dsa_decode:beyond_<b>x<kv>" (or its _fp8kv twin) in place of "decode_attn:mla". The
prefill stays the estimate's: AIConfigurator's DSA prefill rows are timed eagerly, host
launches included, with cached prefixes of 0 and 128 only
(`profiler.importers.aiconfigurator_dsa`).

vLLM replicates the indexer on every TP rank (ReplicatedLinear projections, one key
head), so none of it shrinks with TP. Torch-free.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from optimizer.latency.dsa_module import MEASURED, dsa_op, grid_span
from optimizer.latency.features import FP8_DTYPE, LOW_BIT_BYTES, OpBatch
from optimizer.latency.model import LatencyModel, OpModel
from optimizer.latency.roofline import RooflinePricer
from optimizer.records import OpKind
from optimizer.shapes import ModelShape

INDEXER_KERNELS = 2  # the scoring GEMM and the top-k selection
SCORE_BYTES = 8.0  # one fp32 score written, then read by the top-k


class Pricing(Protocol):
    """What the DSA pricing needs of `compose.Pricing`."""

    shape: ModelShape
    tp: int
    roofline: RooflinePricer
    learned: LatencyModel | None

    @property
    def scale(self) -> float: ...

    def weight_format(self, op: OpKind) -> str: ...


def causal_keys(q: np.ndarray, kv: np.ndarray) -> np.ndarray:
    """Keys a causal chunk of `q` queries over `kv` keys (its prefix included) reads."""
    q = np.asarray(q, dtype=np.float64)
    prefix = np.asarray(kv, dtype=np.float64) - q
    return q * prefix + q * (q + 1.0) / 2.0


def sparse_keys(q: np.ndarray, kv: np.ndarray, topk: int) -> np.ndarray:
    """The same chunk's keys when each query reads at most `topk` of them."""
    q = np.asarray(q, dtype=np.float64)
    p = np.maximum(np.asarray(kv, dtype=np.float64) - q, 0.0)
    t = float(topk)
    free = np.clip(t - p, 0.0, q)  # queries that still see fewer than topk keys
    return free * p + free * (free + 1.0) / 2.0 + (q - free) * t


def sparse_share(q: np.ndarray, kv: np.ndarray, topk: int) -> np.ndarray:
    """sparse_keys / causal_keys (1 where a chunk's queries all see under topk keys)."""
    dense = np.maximum(causal_keys(q, kv), 1.0)
    return np.minimum(sparse_keys(q, kv, topk) / dense, 1.0)


def _indexer_ms(pricing: Pricing, scored: np.ndarray, keys_read: np.ndarray) -> np.ndarray:
    """One layer's indexer over `scored` (query, key) pairs reading `keys_read` cached
    keys: FP8 multiply-adds or the bytes moved, whichever binds, plus its launches."""
    spec = pricing.shape.dsa
    assert spec is not None
    roofline = pricing.roofline
    acc, opts = roofline.accelerator, roofline.options
    flops = 2.0 * scored * spec.index_n_heads * spec.index_head_dim
    peak = (acc.fp8_tflops or acc.bf16_tflops) * 1e12 * opts.compute_efficiency
    moved = keys_read * spec.cache_bytes + scored * SCORE_BYTES
    rate = acc.hbm_bytes_per_s * opts.memory_efficiency
    seconds = np.maximum(flops / peak, moved / rate)
    return (INDEXER_KERNELS * opts.launch_ms + 1e3 * seconds) * pricing.scale


def indexer_prefill_ms(pricing: Pricing, q: np.ndarray, kv: np.ndarray) -> np.ndarray:
    """One layer's indexer over a prefill chunk of `q` queries and `kv` keys."""
    return _indexer_ms(pricing, causal_keys(q, kv), np.asarray(kv, dtype=np.float64))


def indexer_decode_ms(
    pricing: Pricing, num_seqs: np.ndarray, kv_mean: np.ndarray, decode_q: int = 1
) -> np.ndarray:
    """One layer's indexer for `num_seqs` decoding sequences of mean KV `kv_mean`, each
    with `decode_q` query positions."""
    b = np.asarray(num_seqs, dtype=np.float64)
    kv = np.asarray(kv_mean, dtype=np.float64)
    return _indexer_ms(pricing, b * kv * decode_q, b * kv)


def measured_hidden(shape: ModelShape) -> int | None:
    """The hidden size naming the measured DSA layer with this shape's dims, or None."""
    mla, spec = shape.mla, shape.dsa
    dims = MEASURED.get(shape.hidden_size)
    if mla is None or spec is None or dims is None:
        return None
    have = {
        "q_lora_rank": mla.q_lora_rank,
        "kv_lora_rank": mla.kv_lora_rank,
        "qk_nope_head_dim": mla.qk_nope_head_dim,
        "qk_rope_head_dim": mla.qk_rope_head_dim,
        "v_head_dim": mla.v_head_dim,
        "index_n_heads": spec.index_n_heads,
        "index_head_dim": spec.index_head_dim,
        "index_topk": spec.index_topk,
    }
    return shape.hidden_size if all(dims[k] == v for k, v in have.items()) else None


def decode_block(pricing: Pricing) -> tuple[OpModel, tuple[float, float, float, float]] | None:
    """The learned DSA decode block for this shape and its measured (sequences lo, hi,
    keys lo, hi) at the shape's per-rank heads, or None (other dims, heads not measured,
    or the op not fitted in the shape's formats)."""
    shape, learned = pricing.shape, pricing.learned
    hidden = measured_hidden(shape)
    if learned is None or hidden is None or shape.dtype_bytes != 2:
        return None
    model = learned.op_model(
        dsa_op(shape.kv_cache_dtype == "fp8"), pricing.weight_format(OpKind.QKV_PROJ)
    )
    if model is None:
        return None
    span = grid_span(model.grid, hidden, shape.num_heads / pricing.tp)
    return None if span is None else (model, span)


def block_decode_ms(
    pricing: Pricing, model: OpModel, num_seqs: np.ndarray, kv: np.ndarray
) -> np.ndarray:
    """One layer's DSA decode block for `num_seqs` sequences at KV length `kv`, ms."""
    shape = pricing.shape
    fmt = pricing.weight_format(OpKind.QKV_PROJ)
    weights = LOW_BIT_BYTES.get(fmt) or (1.0 if fmt == FP8_DTYPE else float(shape.dtype_bytes))
    mla = shape.mla
    assert mla is not None
    b = np.asarray(num_seqs, dtype=np.float64)
    batch = OpBatch.make(
        model.op,
        float(shape.dtype_bytes),
        weight_dtype_bytes=weights,
        kv_dtype_bytes=float(shape.kv_dtype_bytes),
        weight_format=fmt if fmt in LOW_BIT_BYTES else "",
        num_heads=shape.num_heads / pricing.tp,
        n=mla.kv_lora_rank,
        k=shape.hidden_size,
        head_dim=mla.qk_head_dim,
        batch_size=b,
        q_len=1,
        kv_len=kv,
        num_tokens=b,
    )
    return np.maximum(model.predict_ms(batch), 1e-6) * pricing.scale


def decode_inside(
    span: tuple[float, float, float, float], num_seqs: np.ndarray, kv: np.ndarray
) -> np.ndarray:
    """Where (sequences, keys) lie inside the measured ranges."""
    lo, hi, kv_lo, kv_hi = span
    return (num_seqs >= lo) & (num_seqs <= hi) & (kv >= kv_lo) & (kv <= kv_hi)


def decode_label(pricing: Pricing) -> str | None:
    """How `estimated_ops` names the measured decode's estimated part, or None."""
    block = decode_block(pricing)
    if block is None:
        return None
    _, hi, _, kv_hi = block[1]
    return f"{block[0].op.value}:beyond_{hi:.0f}x{kv_hi:.0f}"
