"""Gated DeltaNet layers (Qwen3.5 / 3.6, Qwen3-Next) as vLLM runs them
(`vllm/model_executor/layers/mamba/gdn_linear_attn.py`), priced on one TP rank.

A GDN layer replaces attention by a linear-attention recurrence with a fixed state per
sequence (`GatedDeltaNetSpec`); its MLP (dense or MoE) and block ends are a transformer
layer's. On one rank of tp:

- token-parallel (`block_ms`): in_proj_qkvz (h -> (2 key_dim + 2 value_dim) / tp) and
  in_proj_ba (h -> 2 value heads / tp) as GEMMs, out_proj (value_dim / tp -> h) as the
  output GEMM, all from the measured GEMM tables; the gated RMSNorm (reads the output and
  the gate, writes one) as an elementwise kernel; the block ends (add + RMSNorm,
  all-reduces) as any layer's;
- a prefill chunk of q tokens (`chunk_ms`): the causal conv1d and the copies of q/k/v to
  contiguous tensors by the bytes they move (q/k/v read and written in the activation
  dtype), the state (`ssm_dtype`: fp32 for Qwen3.5) gathered and scattered once, and
  FLA's chunked delta rule (the Triton kernels vLLM runs) at the rates its published
  timings show (`delta_rule_ms`);
- a decoding sequence (`decode_ms`): the recurrent update reads and writes its state
  and conv window once per step.

No table of ours measures the conv1d or the recurrence: both are estimates, listed by
`estimated_ops` as `gdn_prefill` and `gdn_decode`. What the host spends launching them
outside CUDA graphs is `optimizer.latency.launches`' (20 kernels a layer), and in a
prefill step that, not the GPU, is most of a GDN layer's time.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from optimizer.latency import moe
from optimizer.latency.launches import GDN_CORE
from optimizer.records import OpKind


class Pricing(moe.Pricing, Protocol):
    """What the GDN pricing needs of `compose.Pricing` (which calls it): the MoE's needs,
    and a layer's block ends."""

    def layer_ms(
        self, m: np.ndarray, mlp: bool = True, tp_reduces: int = 2, attention: bool = True
    ) -> np.ndarray: ...


CHUNK = 64  # FLA's chunk of the delta rule
# FLA's chunked delta rule (fla/ops/gated_delta_rule, vendored by vLLM) in one layer: a
# serial pass over each sequence's CHUNK-token chunks (the state recurrence) plus work
# per token and value head, at the rates of FLA/Triton's published timings on H100
# (FlashInfer PR #3866, head dim 128, 8 value heads, 2,048-8,192 tokens in one or two
# sequences: with a fixed 29 us a call, here the core's launches, and the longest
# sequence's chunks, all six within 2%; at 64 heads FLA runs up to 22% above). FLA on
# B300 times within 5% of H100 (FlashInfer PR #4078), so these hold on Hopper and
# Blackwell.
DELTA_RULE_CHUNK_MS = 1.17e-3
DELTA_RULE_TOKEN_HEAD_MS = 1.22e-6
DELTA_RULE_REFERENCE_HBM = 3.35e12  # H100 SXM: a slower memory system runs it slower
CORE_KERNELS = GDN_CORE  # a prefill chunk's kernels (`launches`), each at least a launch
DECODE_KERNELS = 2  # causal_conv1d_update and the packed recurrent decode
ESTIMATED = ("gdn_prefill", "gdn_decode")


def _rank(pricing: Pricing) -> tuple[int, int, int, float]:
    """(key dim, value dim, conv dim) on one rank, and its state's bytes per sequence."""
    spec, tp = pricing.shape.gdn, pricing.tp
    assert spec is not None
    key, value = spec.key_dim // tp, spec.value_dim // tp
    return key, value, 2 * key + value, float(spec.state_bytes(tp, pricing.shape.dtype_bytes))


def layers_ms(pricing: Pricing, m: np.ndarray) -> np.ndarray:
    """All layers of a hybrid over `m` (padded) tokens: its full-attention layers' and GDN
    layers' token-parallel work, and each layer's MLP (dense or MoE)."""
    shape = pricing.shape
    num_moe = 0 if shape.moe is None else shape.moe.num_moe_layers(shape.num_layers)
    attention = pricing.layer_ms(m, mlp=False)
    total = shape.num_full_attention_layers * attention
    total = total + (shape.num_layers - shape.num_full_attention_layers) * block_ms(pricing, m)
    if num_moe:
        total = total + num_moe * moe.moe_block_ms(pricing, m)
    if shape.num_layers > num_moe:  # the dense MLPs: a layer's work beyond its attention
        total = total + (shape.num_layers - num_moe) * (pricing.layer_ms(m) - attention)
    return total


def block_ms(pricing: Pricing, m: np.ndarray) -> np.ndarray:
    """One GDN layer's token-parallel work over `m` (padded) tokens without its MLP: the
    projections, the copies and the gated norm, and the layer's block ends."""
    spec, tp, h = pricing.shape.gdn, pricing.tp, pricing.shape.hidden_size
    assert spec is not None
    key, value, _, _ = _rank(pricing)
    total = pricing.layer_ms(m, mlp=False, attention=False)
    total = total + pricing.price_ms(OpKind.QKV_PROJ, num_tokens=m, n=2 * key + 2 * value, k=h)
    ba = max(1, 2 * spec.num_value_heads // tp)
    total = total + pricing.price_ms(OpKind.QKV_PROJ, num_tokens=m, n=ba, k=h)
    total = total + pricing.price_ms(OpKind.ATTN_OUT_PROJ, num_tokens=m, n=h, k=value)
    return total + pricing.price_ms(OpKind.NORM, num_tokens=m, n=1.5 * value, k=0)


def chunk_ms(pricing: Pricing, q: np.ndarray) -> np.ndarray:
    """One layer's conv1d and chunked delta rule over a prefill chunk of `q` tokens (the
    module docstring); its cached prefix is in the state, not read."""
    _, _, conv, state = _rank(pricing)
    q = np.asarray(q, dtype=np.float64)
    act = pricing.shape.dtype_bytes
    copies = q * conv * act * 2.0  # q, k, v made contiguous after the conv
    moved = q * conv * act * 2.0 + 2.0 * state + copies
    return _memory_ms(pricing, moved, CORE_KERNELS) + delta_rule_ms(pricing, q)


def delta_rule_ms(pricing: Pricing, q: np.ndarray) -> np.ndarray:
    """FLA's chunked delta rule over a chunk of `q` tokens in one layer (`DELTA_RULE_*`).
    A step's chunks are priced one by one and summed; vLLM runs them in one call, where
    their serial passes overlap, so a step of several prompts is priced up to
    DELTA_RULE_CHUNK_MS a chunk and layer high for all but its longest."""
    spec, tp = pricing.shape.gdn, pricing.tp
    assert spec is not None
    heads = max(1, spec.num_value_heads // tp)
    q = np.asarray(q, dtype=np.float64)
    ms = np.ceil(q / CHUNK) * DELTA_RULE_CHUNK_MS + q * heads * DELTA_RULE_TOKEN_HEAD_MS
    slower = max(1.0, DELTA_RULE_REFERENCE_HBM / pricing.roofline.accelerator.hbm_bytes_per_s)
    return ms * slower * pricing.scale


def decode_ms(pricing: Pricing, num_seqs: np.ndarray) -> np.ndarray:
    """One layer's recurrent update for `num_seqs` decoding sequences."""
    _, value, conv, state = _rank(pricing)
    b = np.asarray(num_seqs, dtype=np.float64)
    act = pricing.shape.dtype_bytes
    return _memory_ms(pricing, b * (2.0 * state + conv * act + value * act), DECODE_KERNELS)


def _memory_ms(pricing: Pricing, moved: np.ndarray, kernels: int) -> np.ndarray:
    """`moved` bytes at the roofline's rate, and each of `kernels` kernels' launch."""
    roofline = pricing.roofline
    rate = roofline.accelerator.hbm_bytes_per_s * roofline.options.memory_efficiency
    return (kernels * roofline.options.launch_ms + 1e3 * moved / rate) * pricing.scale
