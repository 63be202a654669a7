"""The core of a Gated DeltaNet layer (`OpKind.GDN_*`), as AIConfigurator measured it.

AIConfigurator's vLLM 0.24 and SGLang 0.5.14 collectors (`linear_attention/<engine>/
gdn_perf.parquet`) time the kernels of one GDN layer's core on one GPU for the Qwen3.5
family's per-GPU head counts (key and value heads of 128, a conv of 4), one row per
kernel; `profiler.importers.aiconfigurator_gdn` sums each row key's kernels into one
sample:

- `gdn_prefill`: `batch_size` sequences of `q_len` new tokens: the causal conv1d
  (`causal_conv1d_fn`) and the chunked delta rule (vLLM: FlashInfer's
  `chunk_gated_delta_rule`; SGLang: FLA's);
- `gdn_decode`: `batch_size` sequences of one token: the conv update
  (`causal_conv1d_update`) and the packed recurrent step
  (`fused_recurrent_gated_delta_rule_packed_decode`).

How (AIConfigurator's collector/vllm/collect_gdn.py; SGLang's collector not checked):
bf16 activations and a bf16 recurrent state (`STATE_DTYPE`; Qwen3.5 serves it in
float32, whose extra bytes `gdn` adds), fresh prompts (a zero initial state, passed
whole), q and k L2-normalised before the delta rule (vLLM's fused_post_conv_prep does
that in serving), the prefill conv1d timed eagerly (vLLM 0.24's packed conv refuses
CUDA-graph capture), the rest in graphs. Not in them: the projections and the gated norm
(GEMMs and an elementwise op, priced as such by `optimizer.latency.gdn`), the copies and
preparation of q/k/v after the conv and the state's gather and scatter around the
prefill kernels.

`module_work` gives the (FLOPs, bytes) of one instance on one GPU, the roofline axes the
fitted model's base is linear in; `measured_grid` the head counts measured and, for
each, the range of the size axis (a prefill's `q_len`, a decode's `batch_size`) its rows
span: pricing uses the fitted model only inside it (`optimizer.latency.gdn`). Torch-free;
imports only the records.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from optimizer.records import OpKind

GDN_OPS = frozenset({OpKind.GDN_PREFILL, OpKind.GDN_DECODE})
# The measured layers' fixed dims: a conv of 4, the recurrent state in bf16 (the
# collector's activation dtype, not the Qwen3.5 configs' float32 mamba_ssm_dtype)
CONV_KERNEL = 4
STATE_DTYPE = "bfloat16"
STATE_BYTES = 2.0
CHUNK = 64  # the chunked delta rule's chunk of tokens


class _Batch(Protocol):  # the OpBatch fields used here (features imports this module)
    op: OpKind
    num_tokens: np.ndarray
    n: np.ndarray
    batch_size: np.ndarray
    q_len: np.ndarray
    num_heads: np.ndarray
    num_kv_heads: np.ndarray
    head_dim: np.ndarray
    dtype_bytes: float


# A measured_grid row: (key heads, value heads, key head dim, value head dim, the size
# axis' smallest and largest measured value)
GridRow = tuple[float, ...]


def module_work(batch: _Batch) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, bytes moved) of one GDN core instance on one GPU: the conv over the conv
    channels (2 x key dim + value dim), the delta rule's state products per token and value
    head (chunked: also its in-chunk products), q/k/v in and the output out at the
    activation width, the state (`STATE_BYTES`) read and written once per sequence."""
    hk, hv, dk, dv = batch.num_kv_heads, batch.num_heads, batch.head_dim, batch.n
    t, b, a = batch.num_tokens, batch.batch_size, batch.dtype_bytes
    conv = 2.0 * hk * dk + hv * dv
    state = hv * dk * dv * STATE_BYTES
    acts = a * t * (2.0 * conv + hv * dv)  # conv in and out, the output
    if batch.op is OpKind.GDN_DECODE:
        flops = 2.0 * t * (CONV_KERNEL * conv + 4.0 * hv * dk * dv)
        window = 2.0 * a * b * conv * (CONV_KERNEL - 1)  # the conv state, read and written
        return flops, acts + window + 2.0 * b * state
    in_chunk = np.minimum(batch.q_len, float(CHUNK))
    flops = 2.0 * t * (CONV_KERNEL * conv + hv * (3.0 * dk * dv + in_chunk * (2.0 * dk + dv)))
    return flops, acts + a * t * conv + 2.0 * b * state  # + the delta rule's q/k/v reads


def size_axis(batch: _Batch) -> np.ndarray:
    """The axis a measured grid spans per head count: a prefill's q_len, a decode's
    batch_size."""
    return batch.batch_size if batch.op is OpKind.GDN_DECODE else batch.q_len


def measured_grid(batch: _Batch) -> tuple[GridRow, ...]:
    """Per measured (key heads, value heads, key dim, value dim), the smallest and largest
    value of the size axis among its rows (sorted)."""
    keys = np.column_stack([batch.num_kv_heads, batch.num_heads, batch.head_dim, batch.n])
    size = size_axis(batch)
    rows = []
    for key in np.unique(keys, axis=0):
        of = np.all(keys == key, axis=1)
        lo, hi = float(size[of].min()), float(size[of].max())
        rows.append((*(float(x) for x in key), lo, hi))
    return tuple(rows)


def grid_range(
    grid: tuple[GridRow, ...], key: tuple[float, float, float, float]
) -> tuple[float, float] | None:
    """The measured range of the size axis at head counts `key`, or None (not measured)."""
    for row in grid:
        if row[:4] == tuple(float(x) for x in key):
            return row[4], row[5]
    return None
