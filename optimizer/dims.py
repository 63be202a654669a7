"""One tensor-parallel rank's share of a model, and each operator's (n, k) on it.

The one definition of the per-rank operator shapes: the profiler records its
samples with it (`profiler.cases`), the Vidur importer derives its rows' n and k
with it, and the latency model prices a step's operators with it
(`optimizer.latency.compose`), so all three agree. Torch-free.

KernelSample fields per operator (per rank, at tensor-parallel degree `tp`;
see `profiler.kernels` for the tensor shapes):

| op | num_tokens | n | k | others |
|---|---|---|---|---|
| qkv_proj | T | (a/t + 2·max(1, g/t))·d; (2a/t + 2·max(1, g/t))·d with an output gate | h | |
| attn_out_proj | T | h | a·d/t | |
| mlp_up | T | 2f/t (f/t if not gated) | h | |
| mlp_down | T | h | f/t | |
| norm, add | T | h | 0 | tp = 1 (cost does not depend on tp) |
| activation | T | f/t (output width) | 0 | |
| rope | T | (a/t + max(1, g/t))·d | 0 | heads, head_dim |
| embedding | T | h | ceil(V/t) | |
| lm_head | m sampled rows | ceil(V/t) | h | |
| prefill/decode/verify_attn | batch·q_len | 0 | 0 | batch_size, q_len, kv_len, heads |
| moe | dp·T (expert group) | expert width I | h | top-k, E, MoE TP, EP (below) |
| moe_dispatch, moe_combine | T per rank | 0 | h | top-k, E, EP (below) |
| mla_prefill(_fp8kv) | batch·q_len | kv_lora_rank | h | batch, q_len = kv_len, heads, d (below) |
| mla_decode(_fp8kv) | batch | kv_lora_rank | h | batch, q_len = 1, kv_len, heads, d (below) |

With `ModelShape.attn_output_gate` (Qwen3-Next, Qwen3.5) the query projection also yields
the per-head output gate: a/t·d more columns. Gated DeltaNet layers (`ModelShape.gdn`)
have no row here; `check_tp` only checks that tp splits their heads.

MoE rows reuse the columns: batch_size = experts per token (top-k), num_heads = routed
experts E, tp = the MoE's tensor-split degree, num_gpus = its expert-parallel degree
(the all-to-alls: tp = num_gpus = EP); I is the unsplit expert intermediate size.

Attention `kv_len` counts all keys attended, cached context plus new tokens. A fused MoE
rank runs E/EP experts, each I/(MoE TP) wide, over its num_tokens·top-k/EP (token,
expert) pairs (AIConfigurator's convention; `optimizer.latency.moe`); its dtype names the
expert weights' format (bfloat16, fp8, fp4, mxfp4, int4).

The MLA ops are vLLM's whole multi-head latent attention block of one rank (q/kv
projections, RoPE, latent attention, o_proj; `optimizer.latency.mla_module`) at
heads = a/t per GPU: n, k and head_dim (qk_nope + qk_rope) record the measured layer's
dims (DeepSeek-V3: 512, 7168, 192), dtype the projections' weight format (bfloat16, fp8 =
block-scaled FP8, fp4) and the _fp8kv ops an FP8 KV cache; prefill rows have no cached
prefix (kv_len = q_len); decode kv_len counts the cached keys plus the new token's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.records import OpKind
from optimizer.shapes import ModelShape

GEMM_OPS = (OpKind.QKV_PROJ, OpKind.ATTN_OUT_PROJ, OpKind.MLP_UP, OpKind.MLP_DOWN)


@dataclass(frozen=True, slots=True)
class RankDims:
    """One tensor-parallel rank's share of a model."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    gated: bool
    dtype_bytes: int
    attn_output_gate: bool = False  # the query projection also yields a gate of a/t·d

    @classmethod
    def of(cls, shape: ModelShape, tp: int) -> RankDims:
        check_tp(shape, tp)
        return cls(
            hidden=shape.hidden_size,
            heads=shape.num_heads // tp,
            kv_heads=max(1, shape.num_kv_heads // tp),
            head_dim=shape.head_dim,
            intermediate=shape.intermediate_size // tp,
            vocab=math.ceil(shape.vocab_size / tp),
            gated=shape.gated_mlp,
            dtype_bytes=shape.dtype_bytes,
            attn_output_gate=shape.attn_output_gate,
        )


def check_tp(shape: ModelShape, tp: int) -> None:
    """TP degree `tp` must split heads and the dense MLP evenly (KV heads split or
    replicate), and Gated DeltaNet's key and value heads (vLLM divides them); a MoE's
    experts are checked against its layout (`latency.moe`)."""
    problems = []
    if tp < 1:
        problems.append("it must be >= 1")
    else:
        if shape.num_heads % tp:
            problems.append(f"num_heads {shape.num_heads} is not a multiple")
        if shape.num_kv_heads % tp and tp % shape.num_kv_heads:
            problems.append(f"num_kv_heads {shape.num_kv_heads} neither divides nor is divided")
        moe = shape.moe
        all_moe = moe is not None and moe.num_moe_layers(shape.num_layers) == shape.num_layers
        if shape.intermediate_size % tp and not all_moe:  # a dense MLP somewhere
            problems.append(f"intermediate_size {shape.intermediate_size} is not a multiple")
        gdn = shape.gdn
        if gdn is not None and (gdn.num_key_heads % tp or gdn.num_value_heads % tp):
            problems.append(
                f"gdn num_key_heads {gdn.num_key_heads} / num_value_heads "
                f"{gdn.num_value_heads} are not multiples"
            )
    if problems:
        raise ValueError(f"tp degree {tp} does not fit shape {shape.name}: {'; '.join(problems)}")


def gemm_nk(op: OpKind, dims: RankDims) -> tuple[int, int]:
    """The (n, k) GEMM shape of a projection op on one rank."""
    h, d = dims.hidden, dims.head_dim
    if op is OpKind.QKV_PROJ:
        queries = (2 if dims.attn_output_gate else 1) * dims.heads
        return (queries + 2 * dims.kv_heads) * d, h
    if op is OpKind.ATTN_OUT_PROJ:
        return h, dims.heads * d
    if op is OpKind.MLP_UP:
        return (2 if dims.gated else 1) * dims.intermediate, h
    if op is OpKind.MLP_DOWN:
        return h, dims.intermediate
    if op is OpKind.LM_HEAD:
        return dims.vocab, h
    raise ValueError(f"{op} is not a GEMM op")


def sample_nk(op: OpKind, dims: RankDims) -> tuple[int, int]:
    """(n, k) as stored in KernelSample for any op (see the module table)."""
    if op in GEMM_OPS or op is OpKind.LM_HEAD:
        return gemm_nk(op, dims)
    if op in (OpKind.NORM, OpKind.ADD):
        return dims.hidden, 0
    if op is OpKind.ACTIVATION:
        return dims.intermediate, 0
    if op is OpKind.ROPE:
        return (dims.heads + dims.kv_heads) * dims.head_dim, 0
    if op is OpKind.EMBEDDING:
        return dims.hidden, dims.vocab
    return 0, 0
