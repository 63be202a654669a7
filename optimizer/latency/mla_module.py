"""The work of vLLM's whole MLA block (`OpKind.MLA_*`), as AIConfigurator measured it.

AIConfigurator's vLLM 0.24 collector (collector/vllm/collect_mla_module.py) builds one
`DeepseekV2MLAAttention` of deepseek-ai/DeepSeek-V3 with `num_heads` heads at TP 1 and
times its forward in a CUDA graph: the fused q_a + kv_a projection (hidden -> q_lora +
kv_lora + rope, replicated on every TP rank in serving), the q_a / kv_a RMSNorms, q_b
(q_lora -> heads x qk_head_dim), RoPE, the attention with its latent up-projection
(prefill: kv_b up-projects the latent to per-head keys and values; decode: the absorbed
W_UK / W_UV batched matmuls around the latent attention) and o_proj (heads x v_head_dim
-> hidden). Not in it: the layer's input norm and residual add and the TP all-reduce
after o_proj. With num_heads = the model's heads / TP a row is one TP rank's MLA block
(AIConfigurator's deepseek model queries it so, in place of its q_b / kv_b / attention
/ o_proj ops). Only DeepSeek-V3's dims were measured (`MEASURED`); Kimi-K2 has the same
dims with 64 heads.

`module_work` gives the (FLOPs, bytes) of one instance on one GPU, the roofline axes the
fitted model's base is linear in: GEMM FLOPs 2 x tokens x weights, attention FLOPs over
the causal (query, key) pairs, bytes = the weights at their width (the absorbed BMMs'
at 16 bits, as vLLM dequantises them), the latent cache at the KV width and the
activations at 16 bits. Torch-free; imports only the records.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from optimizer.records import OpKind

MLA_PREFILL_OPS = frozenset({OpKind.MLA_PREFILL, OpKind.MLA_PREFILL_FP8KV})
MLA_DECODE_OPS = frozenset({OpKind.MLA_DECODE, OpKind.MLA_DECODE_FP8KV})
MLA_OPS = MLA_PREFILL_OPS | MLA_DECODE_OPS
MLA_FP8KV_OPS = frozenset({OpKind.MLA_PREFILL_FP8KV, OpKind.MLA_DECODE_FP8KV})


class _Batch(Protocol):  # the OpBatch fields used here (features imports this module)
    op: OpKind
    num_tokens: np.ndarray
    batch_size: np.ndarray
    q_len: np.ndarray
    kv_len: np.ndarray
    num_heads: np.ndarray
    dtype_bytes: float
    weight_dtype_bytes: float | None
    kv_dtype_bytes: float | None


# deepseek-ai/DeepSeek-V3 config.json, the one layer AIConfigurator measured
MEASURED = {
    "hidden_size": 7168,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}
_H = MEASURED["hidden_size"]
_QL, _KVL = MEASURED["q_lora_rank"], MEASURED["kv_lora_rank"]
_NOPE, _ROPE, _V = (MEASURED[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
_QK, _CACHE = _NOPE + _ROPE, _KVL + _ROPE  # query/key head width; cache elements per token
_BMM_BYTES = 2.0  # W_UK / W_UV run as 16-bit batched matmuls


def mla_op(decode: bool, fp8_kv: bool) -> OpKind:
    """The MLA block op of a phase and KV-cache format."""
    if decode:
        return OpKind.MLA_DECODE_FP8KV if fp8_kv else OpKind.MLA_DECODE
    return OpKind.MLA_PREFILL_FP8KV if fp8_kv else OpKind.MLA_PREFILL


def module_work(batch: _Batch) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, bytes moved) of one MLA block instance on one GPU (see the module doc)."""
    heads, t = batch.num_heads, batch.num_tokens
    b, q, kv = batch.batch_size, batch.q_len, batch.kv_len
    a = batch.dtype_bytes
    w = a if batch.weight_dtype_bytes is None else batch.weight_dtype_bytes
    c = a if batch.kv_dtype_bytes is None else batch.kv_dtype_bytes
    # q_a + kv_a (replicated), q_b, o_proj: weights every token multiplies
    token_weights = _H * (_QL + _CACHE) + heads * (_QL * _QK + _V * _H)
    pairs = b * q * np.maximum(kv - (q - 1.0) / 2.0, 1.0)  # causal (query, key) pairs
    acts = a * t * (2.0 * _H + _QL + _CACHE + heads * (_QK + _V))
    if batch.op in MLA_DECODE_OPS:
        absorbed = heads * (_NOPE * _KVL + _KVL * _V)  # W_UK, W_UV per token
        flops = 2.0 * t * (token_weights + absorbed) + 2.0 * pairs * heads * (_CACHE + _KVL)
        moved = w * token_weights + _BMM_BYTES * absorbed + c * b * kv * _CACHE + acts
        return flops, moved
    up = heads * _KVL * (_NOPE + _V)  # kv_b: the latent of every key up-projected
    flops = 2.0 * t * token_weights + 2.0 * b * kv * up + 2.0 * pairs * heads * (_QK + _V)
    moved = w * (token_weights + up) + c * b * kv * _CACHE + a * b * kv * heads * (_NOPE + _V)
    return flops, moved + acts
