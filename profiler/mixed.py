"""Whole mixed iterations: ground truth for composed per-operator predictions.

`measure_mixed_iteration(shape, chunk_len, num_decodes, decode_kv_len, ...)`
runs one full forward of the model (random weights, tensor-parallel degree 1)
over a batch holding

- one prefill chunk of `chunk_len` tokens of a fresh prompt (no cached context,
  so its attention is causal over `chunk_len` keys), absent when 0;
- `num_decodes` decoding sequences, one new token each, each attending over
  `decode_kv_len` keys in total (`decode_kv_len - 1` cached plus its own).

It is stored as KernelSample(op=MIXED_ITERATION, q_len=chunk_len,
kv_len=decode_kv_len, batch_size=num_decodes, num_tokens=chunk_len +
num_decodes, tp=1; kv_len = 0 when there are no decodes) and is composed
from per-op samples as

    embedding(T) + norm(T) + lm_head(m)
    + num_layers x [2 norm(T) + qkv_proj(T) + rope(T)
                    + prefill_attn(batch 1, q=chunk_len, kv=chunk_len)
                    + decode_attn(batch num_decodes, kv=decode_kv_len)
                    + attn_out_proj(T) + 2 add(T) + mlp_up(T) + activation(T) + mlp_down(T)]

with T = chunk_len + num_decodes and m = num_decodes + (1 if chunk_len else 0)
rows sampled (the chunk is taken to be the prompt's last, so it samples once).
The forward runs exactly these `profiler.kernels` functions plus the glue
between them (splits, views, copies of the chunk's keys, the concatenation of
prefill and decode outputs, the gather of sampled rows), under the same thread
count as the per-op cases, so how the measured times relate to the composed
ones is what a latency model has to learn on top of its operators: a
per-iteration overhead plus a scale, as operators in a forward run slower than
alone (`optimizer.latency.mixed_fit.fit_composition`; for the tiny shape on this
project's CPU about 0.1-0.3 ms and 1.15x).

Two biases once made composed sums miss measured iterations by ~40% on CPU:
per-op cases timed with hot caches (their weights reused by every repeat,
while a forward streams each layer's weights once: up to 5x at a few tokens),
fixed by the cold-cache rotation of `profiler.cases`; and bursts of other work
on a shared machine, which hit long calls more often than short ones, damped
by measuring the grid in several passes and keeping each case's least
disturbed one (`ProfileGrid.passes`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from optimizer.records import KernelSample, OpKind
from optimizer.shapes import ModelShape
from profiler import kernels
from profiler.timing import Timing, TimingConfig, time_call
from profiler.weights import LayerWeights, random_weights


@dataclass(frozen=True, slots=True)
class _Layer:
    w: LayerWeights
    k_cache: torch.Tensor  # (N, g, kv, d) decode caches
    v_cache: torch.Tensor
    k_chunk: torch.Tensor  # (1, g, chunk, d) the chunk's own keys
    v_chunk: torch.Tensor


def _check(shape: ModelShape, chunk_len: int, num_decodes: int, decode_kv_len: int) -> None:
    if chunk_len < 0 or num_decodes < 0:
        raise ValueError(
            f"mixed iteration: chunk_len ({chunk_len}) and num_decodes ({num_decodes}) must be >= 0"
        )
    if chunk_len == 0 and num_decodes == 0:
        raise ValueError("mixed iteration: need a prefill chunk or at least one decode")
    if num_decodes and decode_kv_len < 1:
        raise ValueError(f"mixed iteration: decode_kv_len must be >= 1, got {decode_kv_len}")


def build_forward(
    shape: ModelShape,
    chunk_len: int,
    num_decodes: int,
    decode_kv_len: int,
    device: torch.device,
) -> Callable[[], torch.Tensor]:
    """Allocate weights, caches and inputs; return a closure running one forward -> logits."""
    _check(shape, chunk_len, num_decodes, decode_kv_len)
    dtype = kernels.torch_dtype(shape.dtype)
    kw = {"device": device, "dtype": dtype}
    a, g, d = shape.num_heads, shape.num_kv_heads, shape.head_dim
    vocab = shape.vocab_size
    n_dec, kv = num_decodes, max(decode_kv_len, 1)

    def rand(*size: int) -> torch.Tensor:
        return torch.randn(*size, **kw) * 0.05

    weights = random_weights(shape, device)
    layers = [
        _Layer(
            w,
            k_cache=rand(n_dec, g, kv, d),
            v_cache=rand(n_dec, g, kv, d),
            k_chunk=torch.empty(1, g, chunk_len, d, **kw),
            v_chunk=torch.empty(1, g, chunk_len, d, **kw),
        )
        for w in weights.layers
    ]
    num_tokens = chunk_len + n_dec
    ids = torch.randint(0, vocab, (num_tokens,), device=device)  # (T,)
    positions = torch.cat(
        (
            torch.arange(chunk_len, device=device),
            torch.full((n_dec,), kv - 1, device=device, dtype=torch.long),
        )
    )
    cos, sin = kernels.rope_tables(positions, d)  # (T, 1, d/2)
    # Rows that sample: the chunk's last token (if any) and every decode.
    sample_rows = torch.arange(chunk_len - 1 if chunk_len else 0, num_tokens, device=device)
    activation = kernels.silu_and_mul if shape.gated_mlp else kernels.gelu

    def attention(qkv: torch.Tensor, layer: _Layer) -> torch.Tensor:
        q, k, v = qkv.split((a * d, g * d, g * d), dim=-1)
        q = kernels.rope(q.view(num_tokens, a, d), cos, sin)  # (T, a, d)
        k = kernels.rope(k.view(num_tokens, g, d), cos, sin)  # (T, g, d)
        v = v.view(num_tokens, g, d)
        parts = []
        if chunk_len:
            layer.k_chunk.copy_(k[:chunk_len].transpose(0, 1).unsqueeze(0))
            layer.v_chunk.copy_(v[:chunk_len].transpose(0, 1).unsqueeze(0))
            qp = q[:chunk_len].transpose(0, 1).unsqueeze(0)  # (1, a, chunk, d)
            o = kernels.prefill_attention(qp, layer.k_chunk, layer.v_chunk)
            parts.append(o[0].transpose(0, 1).reshape(chunk_len, a * d))
        if n_dec:
            kernels.write_kv(layer.k_cache, k[chunk_len:].unsqueeze(2))  # (N, g, 1, d)
            kernels.write_kv(layer.v_cache, v[chunk_len:].unsqueeze(2))
            qd = q[chunk_len:].unsqueeze(2)  # (N, a, 1, d)
            o = kernels.decode_attention(qd, layer.k_cache, layer.v_cache)
            parts.append(o.reshape(n_dec, a * d))
        return parts[0] if len(parts) == 1 else torch.cat(parts)  # (T, a·d)

    def forward() -> torch.Tensor:
        x = kernels.embedding(ids, weights.table)  # (T, h)
        for layer in layers:
            y = kernels.rms_norm(x, layer.w.norm1)
            y = attention(kernels.gemm(y, layer.w.qkv), layer)
            x = kernels.residual_add(kernels.gemm(y, layer.w.out), x)
            y = kernels.rms_norm(x, layer.w.norm2)
            y = kernels.gemm(activation(kernels.gemm(y, layer.w.up)), layer.w.down)
            x = kernels.residual_add(y, x)
        x = kernels.rms_norm(x, weights.final_norm)
        return kernels.lm_head(x[sample_rows], weights.head)  # (m, V)

    return forward


def measure_mixed_iteration(
    shape: ModelShape,
    chunk_len: int,
    num_decodes: int,
    decode_kv_len: int,
    device: torch.device,
    timing: TimingConfig | None = None,
) -> KernelSample:
    """Time one mixed forward (see the module docstring for the parameters' meaning)."""
    forward = build_forward(shape, chunk_len, num_decodes, decode_kv_len, device)
    result = time_call(forward, device, timing or TimingConfig())
    return mixed_sample(shape, chunk_len, num_decodes, decode_kv_len, result)


def mixed_sample(
    shape: ModelShape, chunk_len: int, num_decodes: int, decode_kv_len: int, result: Timing
) -> KernelSample:
    """The stored record of a timed mixed iteration."""
    return KernelSample(
        op=OpKind.MIXED_ITERATION,
        median_ms=result.median_ms,
        p10_ms=result.p10_ms,
        p90_ms=result.p90_ms,
        num_repeats=result.num_repeats,
        model=shape.name,
        dtype=shape.dtype,
        tp=1,
        num_tokens=chunk_len + num_decodes,
        batch_size=num_decodes,
        q_len=chunk_len,
        kv_len=decode_kv_len if num_decodes else 0,
        num_heads=shape.num_heads,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
    )
