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

Measured where the tables cover the shape: AIConfigurator's GDN tables
(`optimizer.latency.gdn_module`, imported as `gdn_prefill` / `gdn_decode`) time the conv1d
and the chunked delta rule of a prefill, and the conv update and recurrent step of a
decode, at the Qwen3.5 family's per-GPU head counts. When the learned model holds an op
whose measured grid has the shape's per-rank (key heads, value heads, key dim, value
dim) and a conv of 4 (`covering`), a chunk of q tokens inside the grid's range of q (1 to
32,768 in aiconfigurator-core 0.12) is priced by it, plus the copies to contiguous q/k/v
and the state's gather and scatter by their bytes with their kernels' launches
(`UNMEASURED_KERNELS`: the table holds neither), and a decode of b sequences inside the
grid's range of b (1 to 1,024) by it alone. The tables hold a bf16 state; a wider one
(Qwen3.5's float32) adds its extra bytes, read and written once per sequence, at the
roofline's rate (`state_excess_ms`, listed as `gdn_state:float32`). Outside the range,
or with no such op, the estimate above prices it, and `estimated` lists the op:
`gdn_prefill` / `gdn_decode` when the table prices none of it, `gdn_prefill:beyond_<q>` /
`gdn_decode:beyond_<b>` when it prices up to its grid's largest chunk or batch and the
estimate the rest. docs/moe.md compares the two.

What the host spends launching the core's kernels outside CUDA graphs is
`optimizer.latency.launches`' (20 kernels a layer), and in a prefill step that, not the
GPU, is most of a GDN layer's time.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from optimizer.latency import gdn_module, moe
from optimizer.latency.features import OpBatch
from optimizer.latency.launches import GDN_CORE
from optimizer.latency.model import LatencyModel, OpModel
from optimizer.records import OpKind
from optimizer.shape_parts import DTYPE_BYTES


class Pricing(moe.Pricing, Protocol):
    """What the GDN pricing needs of `compose.Pricing` (which calls it): the MoE's needs,
    and a layer's block ends."""

    learned: LatencyModel | None

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
FLA_KERNELS = 8  # the chunked delta rule's kernels in `launches`' count of the core
# The core's kernels a measured prefill does not hold: all but the conv1d and the delta rule
UNMEASURED_KERNELS = CORE_KERNELS - 1 - FLA_KERNELS
ESTIMATED = ("gdn_prefill", "gdn_decode")  # both ops, when no table covers the shape


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


def covering(pricing: Pricing, op: OpKind) -> tuple[OpModel, float, float] | None:
    """The learned model of GDN core `op` and the range of its size axis (a prefill's q, a
    decode's sequences) measured at this shape's per-rank heads, or None: no such op, the
    shape's heads not measured, or a conv or activation width other than the measured
    layers'."""
    spec, learned = pricing.shape.gdn, pricing.learned
    if spec is None or learned is None or pricing.shape.dtype_bytes != 2:
        return None
    if spec.conv_kernel != gdn_module.CONV_KERNEL:
        return None
    model = learned.op_model(op)
    if model is None:
        return None
    key = rank_heads(pricing)
    found = gdn_module.grid_range(model.grid, (key[0], key[1], key[2], key[3]))
    return None if found is None else (model, found[0], found[1])


def estimated(pricing: Pricing) -> tuple[str, ...]:
    """The GDN ops the estimate prices for this shape (see the module docstring), and
    "gdn_state:<ssm dtype>" when measured cores add a wider state's bytes."""
    names = []
    measured = False
    for op in (OpKind.GDN_PREFILL, OpKind.GDN_DECODE):
        cover = covering(pricing, op)
        measured = measured or cover is not None
        names.append(op.value if cover is None else f"{op.value}:beyond_{cover[2]:.0f}")
    spec = pricing.shape.gdn
    if measured and spec is not None and DTYPE_BYTES[spec.ssm_dtype] > gdn_module.STATE_BYTES:
        names.append(f"gdn_state:{spec.ssm_dtype}")
    return tuple(names)


def rank_heads(pricing: Pricing) -> tuple[float, float, float, float]:
    """(key heads, value heads, key dim, value dim) on one rank."""
    spec, tp = pricing.shape.gdn, pricing.tp
    assert spec is not None
    hk, hv = spec.num_key_heads / tp, spec.num_value_heads / tp
    return hk, hv, float(spec.key_head_dim), float(spec.value_head_dim)


def state_excess_ms(pricing: Pricing, num_seqs: np.ndarray) -> np.ndarray:
    """What a state wider than the tables' bf16 one adds to `num_seqs` sequences' measured
    core: the extra bytes of each recurrent state read and written once, at the roofline's
    rate (no launch: the same kernels run)."""
    spec = pricing.shape.gdn
    assert spec is not None
    _, hv, dk, dv = rank_heads(pricing)
    extra = max(DTYPE_BYTES[spec.ssm_dtype] - gdn_module.STATE_BYTES, 0.0)
    moved = 2.0 * np.asarray(num_seqs, dtype=np.float64) * hv * dk * dv * extra
    return _memory_ms(pricing, moved, 0)


def measured_core_ms(pricing: Pricing, model: OpModel, b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The learned core model over `b` sequences of `q` tokens each at this shape's heads."""
    hk, hv, dk, dv = rank_heads(pricing)
    batch = OpBatch.make(
        model.op,
        float(pricing.shape.dtype_bytes),
        batch_size=b,
        q_len=q,
        num_tokens=b * q,
        num_heads=hv,
        num_kv_heads=hk,
        head_dim=dk,
        n=dv,
        k=pricing.shape.hidden_size,
    )
    return np.maximum(model.predict_ms(batch), 1e-6) * pricing.scale


def chunk_ms(pricing: Pricing, q: np.ndarray) -> np.ndarray:
    """One layer's conv1d and chunked delta rule over a prefill chunk of `q` tokens (the
    module docstring); its cached prefix is in the state, not read. Measured inside the
    table's range of q, the estimate outside it."""
    _, _, conv, state = _rank(pricing)
    q = np.asarray(q, dtype=np.float64)
    act = pricing.shape.dtype_bytes
    copies = q * conv * act * 2.0  # q, k, v made contiguous after the conv
    moved = q * conv * act * 2.0 + 2.0 * state + copies
    estimate = _memory_ms(pricing, moved, CORE_KERNELS) + delta_rule_ms(pricing, q)
    cover = covering(pricing, OpKind.GDN_PREFILL)
    if cover is None:
        return estimate
    model, lo, hi = cover
    inside = (q >= lo) & (q <= hi)
    measured = measured_core_ms(pricing, model, np.ones_like(q), np.clip(q, lo, hi))
    measured = measured + state_excess_ms(pricing, np.ones_like(q))
    measured = measured + _memory_ms(pricing, copies + 2.0 * state, UNMEASURED_KERNELS)
    return np.where(inside, measured, estimate)


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
    """One layer's recurrent update for `num_seqs` decoding sequences: measured inside the
    table's range of sequences, the estimate outside it."""
    _, value, conv, state = _rank(pricing)
    b = np.asarray(num_seqs, dtype=np.float64)
    act = pricing.shape.dtype_bytes
    moved = b * (2.0 * state + conv * act + value * act)
    estimate = _memory_ms(pricing, moved, DECODE_KERNELS)
    cover = covering(pricing, OpKind.GDN_DECODE)
    if cover is None:
        return estimate
    model, lo, hi = cover
    inside = (b >= lo) & (b <= hi)
    clipped = np.clip(b, lo, hi)
    measured = measured_core_ms(pricing, model, clipped, np.ones_like(b))
    measured = measured + state_excess_ms(pricing, clipped)
    return np.where(inside, measured, estimate)


def _memory_ms(pricing: Pricing, moved: np.ndarray, kernels: int) -> np.ndarray:
    """`moved` bytes at the roofline's rate, and each of `kernels` kernels' launch."""
    roofline = pricing.roofline
    rate = roofline.accelerator.hbm_bytes_per_s * roofline.options.memory_efficiency
    return (kernels * roofline.options.launch_ms + 1e3 * moved / rate) * pricing.scale
