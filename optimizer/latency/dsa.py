"""DeepSeek sparse attention (DeepSeek-V3.2, GLM-5; `ModelShape.dsa`) in `Pricing`.

A DSA layer is an MLA layer whose attention reads, per query, only the `index_topk`
keys a lightning indexer picked. No AIConfigurator table measures either kernel (its MLA
tables are of dense MLA), so both are the roofline's, listed by `Pricing.estimated_ops`
("prefill_attn:mla", "decode_attn:mla", "dsa_indexer"):

- sparse attention: the dense MLA attention's price scaled by the share of its keys a
  query still reads (`sparse_share`: query j of a chunk after p cached tokens reads
  min(p + j, index_topk) keys instead of p + j); a decoding sequence reads
  min(its KV, index_topk) keys;
- the indexer scores every cached key of every query, index_n_heads x index_head_dim
  multiply-adds in FP8, reading its FP8 key cache (`DSASpec.cache_bytes` a token) and
  writing and reading one fp32 score per (query, key) for the top-k selection;
- its projections (wq_b from the query latent, wk and weights_proj from the hidden
  state) are GEMMs in `Pricing.layer_ms`.

vLLM replicates the indexer on every TP rank (ReplicatedLinear projections, one key
head), so none of it shrinks with TP. Torch-free.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from optimizer.latency.roofline import RooflinePricer
from optimizer.shapes import ModelShape

INDEXER_KERNELS = 2  # the scoring GEMM and the top-k selection
SCORE_BYTES = 8.0  # one fp32 score written, then read by the top-k


class Pricing(Protocol):
    """What the DSA pricing needs of `compose.Pricing`."""

    shape: ModelShape
    roofline: RooflinePricer

    @property
    def scale(self) -> float: ...


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
