"""Core records that cross the storage boundary.

Every query in `storage/` returns these frozen dataclasses, never ORM rows.
This module imports nothing of the project and no SQLAlchemy, so any layer may
use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import numpy as np

STATS_SCHEMA_VERSION = 1
PLAUSIBILITY_SCHEMA_VERSION = 1  # the stored list of a trace's TraceWarnings
SYNTHETIC_SCHEMA_VERSION = 1  # a synthetic trace's stored SyntheticOrigin


class TraceFormat(StrEnum):
    AZURE = "azure"
    SPLITWISE = "splitwise"
    MOONCAKE = "mooncake"
    BURSTGPT = "burstgpt"
    QWEN = "qwen"
    SERVETUNE = "servetune"  # our own export: arrival_s, input_tokens, output_tokens, ...
    GENERIC = "generic"


@dataclass(frozen=True, slots=True)
class TokenStats:
    mean: float
    p50: int
    p90: int
    p99: int
    max: int
    total: int


@dataclass(frozen=True, slots=True)
class TraceStats:
    """Figures computed once at ingest (DOMAIN.md §2, §7); percentiles by nearest rank."""

    num_requests: int
    duration_s: float
    mean_rate: float  # requests/s over the span
    interarrival_cv: float  # burstiness: CV of inter-arrival times
    peak_rate_1s: float
    peak_rate_10s: float
    peak_rate_60s: float
    input_tokens: TokenStats
    output_tokens: TokenStats
    prefix_hit_ratio: float | None = None  # ideal prefix-cache hit, when hash_ids exist
    num_dropped: int = 0  # rows dropped by a documented repair (e.g. BurstGPT failures)
    warnings: tuple[str, ...] = ()


class TraceWarningCode(StrEnum):
    """What a plausibility check on an ingested trace found (`optimizer.traces.plausibility`);
    each code's `TraceWarning.figure` and `limit` are in the unit named here."""

    RATE_HIGH = "rate_high"  # mean request rate (req/s) above the plausible ceiling
    BURST_HIGH = "burst_high"  # busiest 1 s (req/s) above it while the mean is not
    SPAN_ZERO = "span_zero"  # requests (count) that all arrive at one instant
    RATE_LOW = "rate_low"  # mean request rate (req/s) below the floor, over days
    LENGTH_OVER_CONTEXT = "length_over_context"  # prompt + output tokens of the longest


@dataclass(frozen=True, slots=True)
class TraceWarning:
    """A figure of an ingested trace that real traffic hardly shows: stored with the trace,
    it never blocks the import. `figure` is what the trace has, `limit` the plausible bound
    it crossed (units by `code`); `message` says what, where and what was expected."""

    code: TraceWarningCode
    figure: float
    limit: float
    message: str


@dataclass(frozen=True, slots=True)
class TraceColumns:
    """A trace as columnar arrays, sorted by arrival (stable), arrival_s >= 0: an ingested
    file's from its first request (at 0), a synthetic trace's from its rate curve's
    midnight (`optimizer.traces.synthesize`)."""

    arrival_s: np.ndarray  # float64
    input_tokens: np.ndarray  # int64, > 0
    output_tokens: np.ndarray  # int64, > 0
    prefix_hashes: list[np.ndarray] | None = None  # per request, int64 block hashes
    session_ids: list[str | None] | None = None
    acceptance_length: np.ndarray | None = None  # float64, tokens per spec step; nan = unknown

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])


class RateCurveAxis(StrEnum):
    """What a rate curve's points are placed on (the first column of a curve file)."""

    HOUR_OF_DAY = "hour_of_day"  # 0 <= h < 24, repeated every day; 0 = midnight
    HOUR_OF_WEEK = "hour_of_week"  # 0 <= h < 168, repeated every week; 0 = Monday 00:00
    HOUR = "hour"  # hours from the trace's start, not repeated: must cover its span


@dataclass(frozen=True, slots=True)
class RateCurve:
    """A request rate's shape over time: relative rates at points in hours, linearly
    interpolated between them (and, on a periodic axis, from the last point round to the
    first). Only the shape counts: a synthesized trace scales it to its mean rate
    (`optimizer.traces.synthesize`)."""

    name: str  # "diurnal", or the curve file's name
    axis: RateCurveAxis
    hours: tuple[float, ...]  # strictly increasing
    relative_rates: tuple[float, ...]  # >= 0, one per point


@dataclass(frozen=True, slots=True)
class SyntheticOrigin:
    """How a synthetic trace was made (`servetune traces synthesize`): its request lengths
    resampled as (prompt, output) pairs from a stored sample trace, its arrivals a seeded
    non-homogeneous Poisson process under `rate_curve` scaled to `mean_rate`."""

    from_trace_id: int
    from_trace_name: str
    from_content_hash: str
    rate_curve: RateCurve
    days: float
    mean_rate: float  # requests/s asked for, over the whole span
    seed: int


@dataclass(frozen=True, slots=True)
class TraceInfo:
    id: int
    name: str
    source_format: TraceFormat
    content_hash: str
    created_at: datetime
    stats: TraceStats
    project: str = "default"  # traces are project-scoped (API keys see one project)
    stream: str | None = None  # a named series of uploads (rolling-window re-tuning)
    # What the plausibility checks found when the file was ingested (none for a trace
    # the service built, or one stored before the checks existed)
    plausibility_warnings: tuple[TraceWarning, ...] = ()
    # Set for a trace `servetune traces synthesize` made (None: an upload or a workload)
    synthetic: SyntheticOrigin | None = None


class OpKind(StrEnum):
    """Operators the profiler measures and importers bring in (DOMAIN.md §9)."""

    GEMM = "gemm"  # generic GEMM by (m=num_tokens, n, k)
    QKV_PROJ = "qkv_proj"
    ATTN_OUT_PROJ = "attn_out_proj"
    MLP_UP = "mlp_up"  # gate+up when gated
    MLP_DOWN = "mlp_down"
    NORM = "norm"
    ACTIVATION = "activation"
    ROPE = "rope"
    ADD = "add"
    EMBEDDING = "embedding"
    LM_HEAD = "lm_head"
    PREFILL_ATTN = "prefill_attn"  # batch, q_len, kv_len
    DECODE_ATTN = "decode_attn"  # batch, kv_len (q_len = 1)
    VERIFY_ATTN = "verify_attn"  # batch, q_len = K+1, kv_len
    ALL_REDUCE = "all_reduce"  # num_gpus, message_bytes (NCCL)
    # NCCL's all-gather / reduce-scatter; message_bytes is the whole gathered tensor (the
    # all-gather's output, the reduce-scatter's input), as nccl-tests and AIConfigurator
    # size them
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    # vLLM's own TP all-reduce (custom all-reduce, symmetric memory or NCCL, as its
    # communicator picks by size), captured in a CUDA graph / run eagerly
    VLLM_ALL_REDUCE = "vllm_all_reduce"
    VLLM_ALL_REDUCE_EAGER = "vllm_all_reduce_eager"
    # A fused MoE layer's routed experts (router top-k, gated expert GEMMs, weighted sum)
    # as vLLM's FusedMoE runs them, by the tokens of its whole expert group (see dims.py)
    MOE = "moe"
    # Expert-parallel all-to-all: tokens sent to their experts' GPUs / results sent back
    MOE_DISPATCH = "moe_dispatch"
    MOE_COMBINE = "moe_combine"
    # vLLM's whole multi-head latent attention block (DeepseekV2MLAAttention: q/kv
    # projections, RoPE, attention, output projection) at a 16-bit or an FP8 KV cache,
    # prefill (no cached prefix) and decode; fields in `optimizer.dims`
    MLA_PREFILL = "mla_prefill"
    MLA_DECODE = "mla_decode"
    MLA_PREFILL_FP8KV = "mla_prefill_fp8kv"
    MLA_DECODE_FP8KV = "mla_decode_fp8kv"
    # A Gated DeltaNet layer's core as vLLM runs it (`optimizer.latency.gdn_module`): a
    # prefill's causal conv1d and chunked delta rule, a decode's conv update and
    # recurrent step; fields in `optimizer.latency.gdn_module`
    GDN_PREFILL = "gdn_prefill"
    GDN_DECODE = "gdn_decode"
    # vLLM's whole DeepSeek-sparse-attention block decoding (the MLA block with its
    # lightning indexer and sparse attention; `optimizer.latency.dsa_module`) at a 16-bit
    # or an FP8 KV cache; fields as the MLA block's
    DSA_DECODE = "dsa_decode"
    DSA_DECODE_FP8KV = "dsa_decode_fp8kv"
    MIXED_ITERATION = "mixed_iteration"  # ground truth: one prefill chunk + batch_size decodes


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """Where a profile was measured."""

    kind: str  # "cuda" | "cpu" | "imported"
    name: str  # GPU name or CPU model
    memory_gb: float | None = None
    compute_capability: str | None = None
    driver: str | None = None
    cuda_version: str | None = None
    torch_version: str | None = None
    num_threads: int | None = None


@dataclass(frozen=True, slots=True)
class KernelSample:
    """One measured operator timing. Unused parameters stay 0.

    For per-model ops (QKV_PROJ ...), num_tokens is the token count and n/k the
    GEMM shape it implies; attention ops use batch_size, q_len, kv_len and the
    head counts; the all-reduces use num_gpus and message_bytes. MoE ops reuse the
    columns (the table in `optimizer.dims`): num_tokens = tokens of the whole expert
    group, n = one expert's intermediate width (unsplit), k = hidden size, batch_size =
    experts per token (top-k), num_heads = routed experts, tp = the MoE's tensor-split
    degree, num_gpus = its expert-parallel degree; dtype names the expert weights' format
    ("bfloat16", "fp8", "fp4" = NVFP4, "mxfp4", "int4" = weight-only INT4).
    MLA block ops (MLA_PREFILL, MLA_DECODE and their _FP8KV twins over an FP8 KV cache)
    use batch_size, q_len, kv_len, num_tokens = batch_size x q_len and num_heads (per
    GPU) as attention does, n = kv_lora_rank, k = hidden size and head_dim = the
    query/key head width (qk_nope + qk_rope) of the measured layer; dtype names the
    projections' weight format ("bfloat16", "fp8" = 128x128 block-scaled FP8, "fp4").
    DSA block ops (DSA_DECODE, DSA_DECODE_FP8KV) use the same fields; k (the hidden size)
    names the measured layer (`optimizer.latency.dsa_module.MEASURED`).
    Gated DeltaNet core ops (GDN_PREFILL, GDN_DECODE) use batch_size, q_len (decode 1),
    num_tokens = batch_size x q_len, num_heads = value heads and num_kv_heads = key heads
    (per GPU), head_dim = the key head width, n = the value head width, k = the model's
    hidden size (`optimizer.latency.gdn_module`).
    """

    op: OpKind
    median_ms: float
    p10_ms: float
    p90_ms: float
    num_repeats: int = 1
    model: str = ""  # shape name for per-model ops, "" for generic ones
    dtype: str = "bfloat16"
    tp: int = 1
    num_tokens: int = 0
    n: int = 0
    k: int = 0
    batch_size: int = 0
    q_len: int = 0
    kv_len: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    num_gpus: int = 0
    message_bytes: int = 0


class HoldoutSplit(StrEnum):
    """How a latency model's hold-out rows were chosen."""

    RANDOM = "random"  # a seeded random share of the rows
    EXTRAPOLATION = "extrapolation"  # the largest token counts (beyond the training range)


@dataclass(frozen=True, slots=True)
class HoldoutMetric:
    """Error of one operator's model on one hold-out split (percentages)."""

    op: str
    split: HoldoutSplit
    num_rows: int
    median_ape: float
    p90_ape: float


@dataclass(frozen=True, slots=True)
class ProfileRunInfo:
    id: int
    name: str
    source: str  # "profiler" | "aiconfigurator" | "vidur"
    accelerator: str  # accelerator preset name, e.g. "h100", or "cpu"
    device: DeviceInfo
    created_at: datetime
    num_samples: int
    # whose kernels the tables time ("vllm", "sglang", "trtllm": AIConfigurator's folders);
    # "" for tables of no serving engine (servetune's profiler, Vidur's)
    engine: str = ""
