"""Physically motivated features for operator latency.

Every operator instance is described by the same columnar parameters
(`OpBatch`); from them come the two roofline quantities, FLOPs and bytes
moved, which let a fitted model extrapolate sanely (time grows with work),
plus log-scaled shape features for the learned residual (tile quantisation,
kernel switches, cache regimes). Shapes follow DOMAIN.md §9; head counts are
per GPU.

Number formats: `dtype_bytes` is the activations' element size;
`weight_dtype_bytes` that of a GEMM's weights and `kv_dtype_bytes` that of an
attention's KV cache (both default to `dtype_bytes`). A GEMM moves its input
and output activations at the activation width and its weights at the weight
width; an attention moves Q and its output at the activation width and K and V
at the KV width. A sample of dtype "fp8" (`FP8_DTYPE`) is, for a GEMM, a GEMM
whose weights (and quantised input) are FP8 with a 16-bit output, and for an
attention, one over an FP8 KV cache with 16-bit queries and output
(AIConfigurator's FP8 tables; see `profiler.importers.aiconfigurator`). An
FP8 batch (`is_fp8`) is priced by a model fitted on FP8 samples only: a fitted
model holds its FP8 operators apart from its 16-bit ones
(`optimizer.latency.model.group_samples`). With one width throughout, these
formulas compute exactly (bit for bit) what every stored model was fitted on,
so the feature versions below are unchanged by them.

MoE (`OpKind.MOE`, vLLM's fused MoE layer; fields as in `optimizer.dims`): its work is
that of the routed tokens' gated expert GEMMs on one rank (`_moe_work`), its bytes those
of the local experts' weights the tokens touch; FP8 and the 4-bit weight formats
(`LOW_BIT_BYTES`, named by `OpBatch.weight_format`) are variants of their own, as FP8
GEMMs are (`op_format`). MoE dispatch / combine (expert-parallel all-to-all) move each
token's hidden state to or from its experts' ranks. vLLM's whole MLA block (`MLA_OPS`,
`optimizer.latency.mla_module`) has the work of its projections and latent attention and
attention's shape features; its weight format is its variant, its KV format its op. NCCL's
all-gather and reduce-scatter (`GATHER_OPS`) have an all-reduce's features and half its
traffic. A Gated DeltaNet layer's core (`GDN_OPS`, `optimizer.latency.gdn_module`) has the
work of its conv and delta rule and attention's shape features; vLLM's whole DSA block
decoding (`DSA_OPS`, `optimizer.latency.dsa_module`) the MLA block's work with its
indexer and sparse attention, and variants as the MLA block's. These ops are new: no
stored model holds them, so the feature versions are unchanged by them.

The residual's feature set is versioned (`FEATURE_VERSION`): a fitted model
records the version it was trained on and is always priced with it, so models
stored before a feature was added keep their meaning.

- version 1: the features below without the lookup-table column;
- version 2: adds, for elementwise ops, log2 of the lookup table's bytes
  (embedding: ceil(V/t) rows of h; 0 for the others). An embedding gathers
  random rows of that table, so its cost depends on whether the table fits in
  cache: on this project's CPU a 4 MB table (TP1) costs up to 1.4x the 1 MB
  one (TP4) at the same token count, which version 1 could not tell apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from optimizer.latency.dsa_module import DSA_FP8KV_OPS, DSA_OPS
from optimizer.latency.dsa_module import module_work as dsa_work
from optimizer.latency.gdn_module import GDN_OPS
from optimizer.latency.gdn_module import module_work as gdn_work
from optimizer.latency.mla_module import MLA_DECODE_OPS, MLA_FP8KV_OPS, MLA_OPS, module_work
from optimizer.records import KernelSample, OpKind

GEMM_OPS = frozenset(
    {
        OpKind.GEMM,
        OpKind.QKV_PROJ,
        OpKind.ATTN_OUT_PROJ,
        OpKind.MLP_UP,
        OpKind.MLP_DOWN,
        OpKind.LM_HEAD,
    }
)
ELEMENTWISE_OPS = frozenset(
    {OpKind.NORM, OpKind.ACTIVATION, OpKind.ROPE, OpKind.ADD, OpKind.EMBEDDING}
)
ATTENTION_OPS = frozenset({OpKind.PREFILL_ATTN, OpKind.DECODE_ATTN, OpKind.VERIFY_ATTN})
ALL_REDUCE_OPS = frozenset(
    {OpKind.ALL_REDUCE, OpKind.VLLM_ALL_REDUCE, OpKind.VLLM_ALL_REDUCE_EAGER}
)
# NCCL's all-gather and reduce-scatter: each GPU sends (or receives) all but its own
# 1/g of the message, half an all-reduce's traffic
GATHER_OPS = frozenset({OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER})
COLLECTIVE_OPS = ALL_REDUCE_OPS | GATHER_OPS  # priced by group size and message bytes
MOE_OPS = frozenset({OpKind.MOE})
A2A_OPS = frozenset({OpKind.MOE_DISPATCH, OpKind.MOE_COMBINE})
MODELLED_OPS = GEMM_OPS | ELEMENTWISE_OPS | ATTENTION_OPS | COLLECTIVE_OPS | MOE_OPS | A2A_OPS
MODELLED_OPS |= MLA_OPS | GDN_OPS | DSA_OPS
WEIGHT_OPS = GEMM_OPS | MOE_OPS | MLA_OPS | DSA_OPS  # operators whose weights have a format

FP8_DTYPE = "fp8"  # KernelSample.dtype of FP8 GEMMs (weights) and FP8-KV attention
FP8_OPS = WEIGHT_OPS | ATTENTION_OPS  # operators that have FP8 variants
# 4-bit weight formats (KernelSample.dtype of such MoE / GEMM samples) and the bytes one
# weight moves with its scales: "fp4" NVFP4 (E2M1, one FP8 scale per 16: 0.5 + 1/16),
# "mxfp4" OCP MX FP4 as gpt-oss ships it (one E8M0 scale per 32: 0.5 + 1/32), "int4"
# weight-only INT4 (compressed-tensors WNA16, one bf16 scale per group of 128: 0.5 + 2/128).
LOW_BIT_BYTES = {"fp4": 0.5625, "mxfp4": 0.53125, "int4": 0.515625}
WEIGHT_FORMATS = ("", FP8_DTYPE, *LOW_BIT_BYTES)  # "": the activations' own width
_DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0}
_FP8_ACTIVATION_BYTES = 2.0  # FP8 samples keep 16-bit activations (and attention queries)
_ARRAYS = (
    "num_tokens",
    "n",
    "k",
    "batch_size",
    "q_len",
    "kv_len",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "num_gpus",
    "message_bytes",
    "tp",  # the MoE's tensor-split degree (KernelSample.tp; unused by the other ops)
)


FEATURE_VERSION = 2
FEATURE_VERSIONS = (1, 2)


class FeatureError(ValueError):
    """Operator parameters that cannot be turned into features."""


@dataclass(frozen=True, slots=True)
class OpBatch:
    """Parameters of `len(self)` instances of one operator, as float64 arrays.

    Unused parameters are zero (as in `KernelSample`). `dtype_bytes` is the
    element size of activations; `weight_dtype_bytes` (GEMM weights) and
    `kv_dtype_bytes` (attention K and V) default to it (None).
    """

    op: OpKind
    num_tokens: np.ndarray
    n: np.ndarray
    k: np.ndarray
    batch_size: np.ndarray
    q_len: np.ndarray
    kv_len: np.ndarray
    num_heads: np.ndarray
    num_kv_heads: np.ndarray
    head_dim: np.ndarray
    num_gpus: np.ndarray
    message_bytes: np.ndarray
    tp: np.ndarray
    dtype_bytes: float = 2.0
    weight_dtype_bytes: float | None = None  # None: dtype_bytes (resolved on construction)
    kv_dtype_bytes: float | None = None  # None: dtype_bytes (resolved on construction)
    # A 4-bit weight format of LOW_BIT_BYTES ("fp4", "mxfp4", "int4"); "" for the others,
    # whose format the widths tell (FP8: 1-byte weights or KV cache).
    weight_format: str = ""

    def __post_init__(self) -> None:
        for name in ("weight_dtype_bytes", "kv_dtype_bytes"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, float(self.dtype_bytes))
        if self.weight_format and self.weight_format not in LOW_BIT_BYTES:
            raise FeatureError(
                f"{self.op}: weight_format {self.weight_format!r}: expected one of "
                f"{sorted(LOW_BIT_BYTES)} or ''"
            )

    def __len__(self) -> int:
        return int(self.num_tokens.shape[0])

    @classmethod
    def make(
        cls,
        op: OpKind,
        dtype_bytes: float = 2.0,
        *,
        weight_dtype_bytes: float | None = None,
        kv_dtype_bytes: float | None = None,
        weight_format: str = "",
        **params: object,
    ) -> OpBatch:
        """Broadcast scalars/arrays given by name; parameters not given are zero."""
        unknown = sorted(set(params) - set(_ARRAYS))
        if unknown:
            raise FeatureError(f"{op}: unknown parameters {unknown}; expected some of {_ARRAYS}")
        arrays = [np.asarray(params.get(name, 0), dtype=np.float64) for name in _ARRAYS]
        arrays = np.broadcast_arrays(*arrays, np.zeros(1))[:-1]
        return cls(
            op,
            *(np.ascontiguousarray(a) for a in arrays),
            dtype_bytes=dtype_bytes,
            weight_dtype_bytes=weight_dtype_bytes,
            kv_dtype_bytes=kv_dtype_bytes,
            weight_format=weight_format,
        )

    @classmethod
    def from_samples(cls, op: OpKind, samples: Sequence[KernelSample]) -> OpBatch:
        batch = cls._from_rows(op, samples)
        fp8_kv = op in MLA_FP8KV_OPS or op in DSA_FP8KV_OPS
        return replace(batch, kv_dtype_bytes=1.0) if fp8_kv else batch

    @classmethod
    def _from_rows(cls, op: OpKind, samples: Sequence[KernelSample]) -> OpBatch:
        rows = [s for s in samples if s.op == op]
        if not rows:
            raise FeatureError(f"no samples of op {op.value!r}")
        dtypes = {s.dtype for s in rows}
        if len(dtypes) > 1:
            raise FeatureError(
                f"{op}: samples mix dtypes {sorted(dtypes)}; fit one dtype at a time"
            )
        dtype = dtypes.pop()
        cols = {name: np.fromiter((getattr(s, name) for s in rows), np.float64) for name in _ARRAYS}
        if dtype in LOW_BIT_BYTES:
            if op not in WEIGHT_OPS:
                raise FeatureError(f"{op}: dtype {dtype!r} is a weight format (GEMM, MoE only)")
            return cls(op, dtype_bytes=_FP8_ACTIVATION_BYTES,
                       weight_dtype_bytes=LOW_BIT_BYTES[dtype], weight_format=dtype,
                       **cols)  # fmt: skip
        if dtype not in _DTYPE_BYTES:
            raise FeatureError(f"{op}: unknown dtype {dtype!r}; expected one of {_DTYPE_BYTES}")
        if dtype != FP8_DTYPE:
            return cls(op, dtype_bytes=_DTYPE_BYTES[dtype], **cols)
        if op not in FP8_OPS:
            raise FeatureError(
                f"{op}: dtype {FP8_DTYPE!r} is meant for GEMMs (FP8 weights) and attention "
                "(FP8 KV cache) only"
            )
        fp8 = _DTYPE_BYTES[FP8_DTYPE]
        return cls(
            op,
            dtype_bytes=_FP8_ACTIVATION_BYTES,
            weight_dtype_bytes=fp8 if op in WEIGHT_OPS else None,
            kv_dtype_bytes=fp8 if op in ATTENTION_OPS else None,
            **cols,
        )

    def take(self, index: np.ndarray) -> OpBatch:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in _ARRAYS:
            values[name] = values[name][index]
        return OpBatch(**values)


def is_fp8(batch: OpBatch) -> bool:
    """Whether `batch` is an FP8 variant: a GEMM or MoE with 1-byte weights or an attention
    over a 1-byte KV cache (priced by FP8 models only, never by 16-bit ones)."""
    fp8 = _DTYPE_BYTES[FP8_DTYPE]
    if batch.op in WEIGHT_OPS:
        return batch.weight_dtype_bytes == fp8 and not batch.weight_format
    if batch.op in ATTENTION_OPS:
        return batch.kv_dtype_bytes == fp8
    return False


def op_format(batch: OpBatch) -> str:
    """The format variant `batch` is priced by: "" (the activations' width), "fp8", or a
    4-bit weight format; each is fitted and priced apart."""
    if batch.weight_format:
        return batch.weight_format
    return FP8_DTYPE if is_fp8(batch) else ""


def moe_pairs_per_rank(batch: OpBatch) -> np.ndarray:
    """(token, expert) pairs one rank of a fused MoE computes: num_tokens x top-k spread
    evenly over the EP group (balanced routing)."""
    return batch.num_tokens * batch.batch_size / np.maximum(batch.num_gpus, 1.0)


def expected_experts_touched(
    num_local: np.ndarray, num_tokens: np.ndarray, top_k: np.ndarray, num_experts: np.ndarray
) -> np.ndarray:
    """Distinct experts of a rank's `num_local` that `num_tokens` tokens reach, each routed
    at random to `top_k` distinct experts of all `num_experts`: an expert is missed by one
    token with probability 1 - k/E, so num_local x (1 - (1 - k/E)^T), at least 1."""
    e = np.maximum(np.asarray(num_experts, dtype=np.float64), 1.0)
    share = np.clip(np.asarray(top_k, dtype=np.float64) / e, 0.0, 1.0)
    t = np.maximum(np.asarray(num_tokens, dtype=np.float64), 1.0)
    missed = np.where(share >= 1.0, 0.0, np.exp(t * np.log1p(-np.minimum(share, 1.0 - 1e-12))))
    return np.maximum(np.asarray(num_local, dtype=np.float64) * (1.0 - missed), 1.0)


def _moe_work(batch: OpBatch) -> tuple[np.ndarray, np.ndarray]:
    """A fused MoE layer on one rank: gated expert GEMMs (gate + up 2n/tp wide, down n/tp)
    over its pairs; bytes = the weights of the local experts those pairs touch at the
    weight width (`expected_experts_touched`: about T x k x local / E for few tokens, every
    local expert for many), plus the tokens in, the pairs' activations and the tokens out
    at the activation width."""
    dt, w = batch.dtype_bytes, batch.weight_dtype_bytes
    ep, tp = np.maximum(batch.num_gpus, 1.0), np.maximum(batch.tp, 1.0)
    width = batch.n / tp
    pairs = moe_pairs_per_rank(batch)
    local = batch.num_heads / ep
    touched = expected_experts_touched(local, batch.num_tokens, batch.batch_size, batch.num_heads)
    flops = 2.0 * pairs * batch.k * 3.0 * width
    moved = w * touched * 3.0 * width * batch.k
    moved = moved + dt * (2.0 * batch.num_tokens * batch.k + pairs * (batch.k + 3.0 * width))
    return flops, moved


def work(batch: OpBatch) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, bytes moved) per instance: the roofline's two axes."""
    op, dt = batch.op, batch.dtype_bytes
    m, n, k = batch.num_tokens, batch.n, batch.k
    if op in GEMM_OPS:
        flops, w = 2.0 * m * n * k, batch.weight_dtype_bytes
        if w == dt:  # one width: the formula every stored model was fitted with
            return flops, dt * (m * k + k * n + m * n)
        # activations in (m x k) and out (m x n) at their width, weights (k x n) at theirs
        return flops, dt * (m * k + m * n) + w * k * n
    if op in ELEMENTWISE_OPS:
        width = np.maximum(n, 1.0)
        return 4.0 * m * width, 2.0 * dt * m * width
    if op in ATTENTION_OPS:
        b, q, kv = batch.batch_size, batch.q_len, batch.kv_len
        heads, kv_heads, d = batch.num_heads, batch.num_kv_heads, batch.head_dim
        # causal: query i (of q) sees kv - q + i + 1 keys
        pairs = b * q * np.maximum(kv - (q - 1) / 2.0, 1.0)
        flops, kvw = 4.0 * heads * d * pairs, batch.kv_dtype_bytes
        if kvw == dt:  # one width: the formula every stored model was fitted with
            return flops, dt * b * d * (2.0 * q * heads + 2.0 * kv * kv_heads)
        # Q read and output written at the activation width, K and V at the KV width
        return flops, b * d * (dt * 2.0 * q * heads + kvw * 2.0 * kv * kv_heads)
    if op in COLLECTIVE_OPS:  # an all-reduce is a reduce-scatter then an all-gather
        g, passes = np.maximum(batch.num_gpus, 2.0), 1.0 if op in GATHER_OPS else 2.0
        return np.zeros_like(batch.message_bytes), batch.message_bytes * passes * (g - 1.0) / g
    if op in MOE_OPS:
        return _moe_work(batch)
    if op in MLA_OPS:
        return module_work(batch)
    if op in GDN_OPS:
        return gdn_work(batch)
    if op in DSA_OPS:
        return dsa_work(batch)
    if op in A2A_OPS:
        # each token goes to (or comes back from) the ranks of its top-k experts, at most
        # min(top-k, EP) of them, all but 1/EP of it over the link; hidden x 16-bit values
        g = np.maximum(batch.num_gpus, 2.0)
        sent = batch.num_tokens * np.minimum(batch.batch_size, g) * batch.k * dt * (g - 1.0) / g
        return np.zeros_like(sent), sent
    raise FeatureError(f"op {op.value!r} has no latency features")


def token_count(batch: OpBatch) -> np.ndarray:
    """The size axis an extrapolation hold-out withholds the top of."""
    if batch.op in COLLECTIVE_OPS:
        return batch.message_bytes
    if batch.op is OpKind.PREFILL_ATTN or batch.op in MLA_OPS - MLA_DECODE_OPS:
        return batch.batch_size * batch.q_len
    if batch.op in ATTENTION_OPS or batch.op in MLA_DECODE_OPS | DSA_OPS:
        return batch.batch_size * batch.kv_len
    return batch.num_tokens


def _pad_ratio(x: np.ndarray, tile: float) -> np.ndarray:
    x = np.maximum(x, 1.0)
    return np.ceil(x / tile) * tile / x


def feature_matrix(batch: OpBatch, version: int = FEATURE_VERSION) -> np.ndarray:
    """Log-scaled shape and work features for the learned residual (rows x features),
    in feature set `version` (see the module docstring)."""
    if version not in FEATURE_VERSIONS:
        raise FeatureError(f"feature version {version!r}: expected one of {FEATURE_VERSIONS}")
    flops, moved = work(batch)
    lf, lb = np.log1p(flops), np.log1p(moved)
    cols: list[np.ndarray]
    if batch.op in GEMM_OPS:
        m = batch.num_tokens
        cols = [
            np.log2(np.maximum(m, 1.0)),
            np.log2(np.maximum(batch.n, 1.0)),
            np.log2(np.maximum(batch.k, 1.0)),
            _pad_ratio(m, 64.0),
            _pad_ratio(m, 128.0),
            _pad_ratio(m, 256.0),
        ]
    elif batch.op in ATTENTION_OPS or batch.op in MLA_OPS | GDN_OPS | DSA_OPS:
        cols = [
            np.log2(np.maximum(batch.batch_size, 1.0)),
            np.log2(np.maximum(batch.q_len, 1.0)),
            np.log2(np.maximum(batch.kv_len, 1.0)),
            np.log2(np.maximum(batch.num_heads, 1.0)),
            np.log2(np.maximum(batch.num_kv_heads, 1.0)),
            np.log2(np.maximum(batch.head_dim, 1.0)),
        ]
    elif batch.op in COLLECTIVE_OPS:
        cols = [np.log2(np.maximum(batch.message_bytes, 1.0)), batch.num_gpus]
    elif batch.op in MOE_OPS:
        pairs = moe_pairs_per_rank(batch)
        local = batch.num_heads / np.maximum(batch.num_gpus, 1.0)
        cols = [
            np.log2(np.maximum(batch.num_tokens, 1.0)),
            np.log2(np.maximum(batch.n / np.maximum(batch.tp, 1.0), 1.0)),
            np.log2(np.maximum(batch.k, 1.0)),
            np.log2(np.maximum(batch.batch_size, 1.0)),
            np.log2(np.maximum(local, 1.0)),
            np.log2(np.maximum(pairs / np.maximum(local, 1.0), 1.0 / 64)),  # pairs per expert
            np.log2(np.maximum(batch.num_gpus, 1.0)),
            np.log2(np.maximum(batch.tp, 1.0)),
        ]
    elif batch.op in A2A_OPS:
        cols = [
            np.log2(np.maximum(batch.num_tokens, 1.0)),
            np.log2(np.maximum(batch.k, 1.0)),
            np.log2(np.maximum(batch.batch_size, 1.0)),
            np.log2(np.maximum(batch.num_heads, 1.0)),
            batch.num_gpus,
        ]
    else:
        cols = [np.log2(np.maximum(batch.num_tokens, 1.0)), np.log2(np.maximum(batch.n, 1.0))]
        if version >= 2:
            table = batch.k * batch.n * batch.dtype_bytes  # k: table rows (embedding), else 0
            cols.append(np.log2(np.maximum(table, 1.0)))
    cols += [lf, lb, lf - lb]
    return np.column_stack(cols)
