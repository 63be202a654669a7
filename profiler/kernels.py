"""One torch function per operator of a dense decoder layer (DOMAIN.md §9).

Shapes use: T tokens in the step, h hidden size, a attention heads, g KV heads,
d head dim, f intermediate size, V vocabulary, t tensor-parallel degree. Weights
follow `torch.nn.functional.linear`'s (out_features, in_features) layout, so a
GEMM "n x k" means weight (n, k) and input (T, k). Under tensor parallelism each
function receives one rank's shard (heads a/t, KV heads max(1, g/t), f/t, V/t);
the all-reduce is profiled separately.

Attention convention, used by every attention op and stored in KernelSample:
`q_len` query tokens per sequence, `kv_len` keys each sequence attends over in
total, i.e. the cached context plus the new tokens (so `kv_len >= q_len`). The
new tokens' keys are written into the tail of a preallocated cache, as paged
KV caches do, and causality is bottom-right aligned (query i sees keys up to
kv_len - q_len + i).

This module imports torch at import time; only `profiler` internals import it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

RMS_EPS = 1e-6
FP8 = torch.float8_e4m3fn  # the FP8 format of vLLM's fp8 checkpoints and --quantization fp8


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a ModelShape dtype name; fp8 GEMMs are not profiled here."""
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(
            f"dtype {name!r} cannot be profiled with torch kernels; "
            f"expected one of {sorted(TORCH_DTYPES)}"
        ) from None


def gemm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Any projection: x (T, k) @ weight (n, k)^T -> (T, n).

    QKV projection: n = (a + 2g)·d / t, k = h.  Output projection: n = h, k = a·d / t.
    MLP gate+up: n = 2f / t, k = h.  MLP down: n = h, k = f / t.  LM head: n = V / t, k = h.
    """
    return F.linear(x, weight)


def gemm_fp8(
    x: torch.Tensor, weight: torch.Tensor, scale_x: torch.Tensor, scale_w: torch.Tensor
) -> torch.Tensor:
    """An FP8 projection (W8A8, as vLLM's fp8 linear layers): x (T, k) fp8 @ weight (n, k)^T
    fp8 -> (T, n) bf16, with per-tensor float32 scales `scale_x`, `scale_w` (0-d).

    The activation comes already quantised: this is the GEMM kernel alone; vLLM
    quantises the activation in a fused kernel of its own (one pass over x).
    """
    return torch._scaled_mm(
        x, weight.t(), scale_a=scale_x, scale_b=scale_w, out_dtype=torch.bfloat16
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x (T, h), weight (h,) -> (T, h)."""
    return F.rms_norm(x, (x.shape[-1],), weight, RMS_EPS)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Gated activation: x (T, 2f/t) = [gate | up] -> silu(gate) * up, (T, f/t)."""
    half = x.shape[-1] // 2
    return F.silu(x[..., :half]) * x[..., half:]


def gelu(x: torch.Tensor) -> torch.Tensor:
    """Non-gated activation: x (T, f/t) -> (T, f/t)."""
    return F.gelu(x, approximate="tanh")


def rope_tables(
    positions: torch.Tensor, head_dim: int, base: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions (T,) -> cos, sin each (T, 1, d/2) in float32."""
    inv_freq = 1.0 / (
        base
        ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    )
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (T, d/2)
    return angles.cos()[:, None, :], angles.sin()[:, None, :]


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, rotate-half form: x (T, heads, d), cos/sin (T, 1, d/2) -> (T, heads, d)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def residual_add(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """x (T, h) + residual (T, h) -> (T, h)."""
    return x + residual


def embedding(token_ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """token_ids (T,) int64 in [0, V/t), table (V/t, h) -> (T, h)."""
    return F.embedding(token_ids, table)


def lm_head(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Logits of the sampling positions: x (m, h) @ weight (V/t, h)^T -> (m, V/t)."""
    return F.linear(x, weight)


def write_kv(cache: torch.Tensor, new: torch.Tensor) -> None:
    """Store new keys (or values) in the cache tail: cache (B, g, kv, d), new (B, g, q, d)."""
    cache[:, :, cache.shape[2] - new.shape[2] :, :].copy_(new)


def prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
) -> torch.Tensor:
    """Chunked-prefill attention over cached context plus the chunk.

    q (B, a, q_len, d); k_cache, v_cache (B, g, kv_len, d) already holding the
    chunk's keys in their last q_len slots -> (B, a, q_len, d). Causal within the
    chunk, full over the context before it.
    """
    q_len, kv_len = q.shape[2], k_cache.shape[2]
    if q_len == kv_len:
        return F.scaled_dot_product_attention(q, k_cache, v_cache, is_causal=True, enable_gqa=True)
    mask = causal_lower_right(q_len, kv_len)
    return F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, enable_gqa=True)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """One new token per sequence: q (B, a, 1, d), caches (B, g, kv_len, d) -> (B, a, 1, d)."""
    return F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)


def verify_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """Speculative verification: K+1 query tokens per sequence, causal among themselves.

    q (B, a, K+1, d), caches (B, g, kv_len, d) -> (B, a, K+1, d). The same kernel as
    chunked prefill with a short chunk; profiled separately because its (batch, q)
    regime differs.
    """
    return prefill_attention(q, k_cache, v_cache)
