"""The work of vLLM's whole DeepSeek-sparse-attention block decoding (`OpKind.DSA_*`), as
AIConfigurator measured it.

AIConfigurator's vLLM 0.24 collector (collector/vllm/collect_mla_module.py, its "dsa"
cases) builds one `DeepseekV2MLAAttention` of deepseek-ai/DeepSeek-V3.2 or zai-org/GLM-5
with `num_heads` heads at TP 1 and times its forward in a CUDA graph: the MLA block of
`optimizer.latency.mla_module` (q_a + kv_a, their norms, q_b, RoPE, o_proj) with the
lightning indexer (wq_b from the query latent, wk and weights_proj from the hidden
state, the key's FP8 quantise-and-cache, the FP8 MQA logits over every cached key and
the top-k) and the sparse attention over the `index_topk` keys it picked (FlashMLA's or
FlashInfer's sparse MLA over the latent cache, with the absorbed W_UK / W_UV). Not in it:
the layer's input norm and residual add and the TP all-reduce. Generation rows run
`batch_size` sequences of one token over `step` keys. (Its context rows are timed
eagerly, host launches included, and hold cached prefixes of 0 and 128 only: not used,
see `profiler.importers.aiconfigurator_dsa`.)

`MEASURED` holds the two measured layers' dims, told apart by their hidden size (the
sample's `k`); `module_work` gives the (FLOPs, bytes) of one instance on one GPU, the
roofline axes the fitted model's base is linear in; `measured_grid` the (hidden, heads)
measured and, at each, the range of sequences and of keys its rows span: pricing uses
the fitted model only inside it (`optimizer.latency.dsa`). Torch-free; imports only the
records.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from optimizer.records import OpKind

DSA_OPS = frozenset({OpKind.DSA_DECODE, OpKind.DSA_DECODE_FP8KV})
DSA_FP8KV_OPS = frozenset({OpKind.DSA_DECODE_FP8KV})

# The measured layers' config.json dims, by hidden size
MEASURED = {
    7168: {  # deepseek-ai/DeepSeek-V3.2
        "model": "deepseek-ai/DeepSeek-V3.2",
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "index_n_heads": 64,
        "index_head_dim": 128,
        "index_topk": 2048,
    },
    6144: {  # zai-org/GLM-5
        "model": "zai-org/GLM-5",
        "q_lora_rank": 2048,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 192,
        "qk_rope_head_dim": 64,
        "v_head_dim": 256,
        "index_n_heads": 32,
        "index_head_dim": 128,
        "index_topk": 2048,
    },
}
_BMM_BYTES = 2.0  # W_UK / W_UV run as 16-bit batched matmuls
_SCORE_BYTES = 8.0  # the indexer's fp32 score, written then read by the top-k
_INDEX_KEY_BYTES = 132.0  # an FP8 indexer key of 128 and its 4-byte scale


class _Batch(Protocol):  # the OpBatch fields used here (features imports this module)
    op: OpKind
    num_tokens: np.ndarray
    k: np.ndarray
    batch_size: np.ndarray
    q_len: np.ndarray
    kv_len: np.ndarray
    num_heads: np.ndarray
    dtype_bytes: float
    weight_dtype_bytes: float | None
    kv_dtype_bytes: float | None


def dsa_op(fp8_kv: bool) -> OpKind:
    """The DSA decode block op of a KV-cache format."""
    return OpKind.DSA_DECODE_FP8KV if fp8_kv else OpKind.DSA_DECODE


def _dims(hidden: np.ndarray) -> dict[str, np.ndarray]:
    """Each instance's measured dims (by its hidden size; DeepSeek-V3.2's for any other)."""
    glm = np.asarray(hidden) == 6144
    out = {}
    for name in MEASURED[7168]:
        if name != "model":
            out[name] = np.where(glm, MEASURED[6144][name], MEASURED[7168][name]).astype(float)
    return out


def module_work(batch: _Batch) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, bytes moved) of one DSA block instance on one GPU: the MLA block's
    projections and the indexer's (GEMM FLOPs 2 x tokens x weights), the indexer's FP8
    logits over every (query, key) pair and its fp32 scores, the sparse latent attention
    over min(keys, index_topk) keys a query; bytes = the weights at their width
    (the absorbed BMMs' at 16 bits), the latent cache at the KV width, the indexer's FP8
    key cache, and the activations at 16 bits."""
    d = _dims(batch.k)
    h, heads, t = batch.k, batch.num_heads, batch.num_tokens
    b, q, kv = batch.batch_size, batch.q_len, batch.kv_len
    a = batch.dtype_bytes
    w = a if batch.weight_dtype_bytes is None else batch.weight_dtype_bytes
    c = a if batch.kv_dtype_bytes is None else batch.kv_dtype_bytes
    ql, kvl, v = d["q_lora_rank"], d["kv_lora_rank"], d["v_head_dim"]
    nope, rope = d["qk_nope_head_dim"], d["qk_rope_head_dim"]
    ih, idim = d["index_n_heads"], d["index_head_dim"]
    cache = kvl + rope  # latent cache elements per token
    qk = nope + rope
    token_weights = h * (ql + cache) + heads * (ql * qk + v * h)  # q_a + kv_a, q_b, o_proj
    token_weights = token_weights + ql * ih * idim + h * (idim + ih)  # wq_b, wk, weights
    absorbed = heads * (nope * kvl + kvl * v)  # W_UK, W_UV per token
    pairs = b * q * np.maximum(kv - (q - 1.0) / 2.0, 1.0)  # causal (query, key) pairs
    read = b * q * np.minimum(np.maximum(kv - (q - 1.0) / 2.0, 1.0), d["index_topk"])
    flops = 2.0 * t * (token_weights + absorbed) + 2.0 * pairs * ih * idim
    flops = flops + 2.0 * read * heads * (cache + kvl)
    acts = a * t * (2.0 * h + ql + cache + heads * (qk + v))
    moved = w * token_weights + _BMM_BYTES * absorbed + acts
    moved = moved + c * np.minimum(read, b * kv) * cache + b * kv * _INDEX_KEY_BYTES
    return flops, moved + pairs * _SCORE_BYTES


def measured_grid(batch: _Batch) -> tuple[tuple[float, ...], ...]:
    """Per measured (hidden, heads): the fewest and most sequences and the fewest and most
    keys, as (hidden, heads, sequences lo, hi, keys lo, hi), sorted."""
    pairs = np.column_stack([batch.k, batch.num_heads])
    rows = []
    for key in np.unique(pairs, axis=0):
        of = np.all(pairs == key, axis=1)
        b, kv = batch.batch_size[of], batch.kv_len[of]
        spans = (b.min(), b.max(), kv.min(), kv.max())
        rows.append((float(key[0]), float(key[1]), *(float(x) for x in spans)))
    return tuple(rows)


def grid_span(
    grid: tuple[tuple[float, ...], ...], hidden: float, heads: float
) -> tuple[float, float, float, float] | None:
    """(sequences lo, hi, keys lo, hi) measured at (hidden, heads), or None."""
    for row in grid:
        if row[:2] == (float(hidden), float(heads)):
            return row[2], row[3], row[4], row[5]
    return None
