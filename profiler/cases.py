"""Profiling cases: one operator at one parameter point, its inputs and its record.

`Case` names what is measured; `build_call` allocates the inputs on a device
and returns a zero-argument closure that runs the operator once;
`case_sample` turns a case plus its timing into a `KernelSample`.

Field meaning in the resulting KernelSample: `optimizer.dims` (the one definition
of each operator's per-rank n and k, shared by the importers and the latency
model's composition).

Cold caches: in a real forward every layer reads its own weights and KV cache,
so they come from memory, not from a cache warmed by the previous repeat.
With `cold_bytes > 0` a case allocates enough copies of its weights (GEMMs,
LM head, embedding table) or KV caches (attention) to total at least that
many bytes and cycles through them, one copy per call. Activations stay
fixed: in a forward they were just written by the previous operator. On this
project's 2-core CPU a hot-cache GEMM at a few tokens runs 2-5x faster than the
same GEMM in a whole forward; rotating over 64 MB removes that bias.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from optimizer.dims import GEMM_OPS, RankDims, gemm_nk, sample_nk
from optimizer.records import KernelSample, OpKind
from optimizer.shapes import ModelShape
from profiler import kernels
from profiler.timing import Timing

TOKEN_OPS = (
    *GEMM_OPS,
    OpKind.NORM,
    OpKind.ACTIVATION,
    OpKind.ROPE,
    OpKind.ADD,
    OpKind.EMBEDDING,
)
TP_INDEPENDENT_OPS = (OpKind.NORM, OpKind.ADD)
ATTENTION_OPS = (OpKind.PREFILL_ATTN, OpKind.DECODE_ATTN, OpKind.VERIFY_ATTN)
MAX_COPIES = 1024  # rotation copies of one case's weights / KV caches


@dataclass(frozen=True, slots=True)
class Case:
    """One operator at one parameter point (kv_len: total keys attended)."""

    op: OpKind
    tp: int = 1
    num_tokens: int = 0  # token ops: T; lm_head: sampled rows
    batch_size: int = 0  # attention
    q_len: int = 0
    kv_len: int = 0

    @property
    def label(self) -> str:
        if self.op is OpKind.MIXED_ITERATION:
            return f"{self.op} chunk={self.q_len} decodes={self.batch_size} kv={self.kv_len}"
        if self.op in ATTENTION_OPS:
            return f"{self.op} b={self.batch_size} q={self.q_len} kv={self.kv_len} tp={self.tp}"
        return f"{self.op} T={self.num_tokens} tp={self.tp}"


def _rand(*size: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*size, device=device, dtype=dtype) * 0.05


def num_copies(bytes_per_copy: int, cold_bytes: int) -> int:
    """Copies of a case's weights or caches that together reach `cold_bytes` (>= 1)."""
    if cold_bytes <= 0 or bytes_per_copy <= 0:
        return 1
    return max(1, min(MAX_COPIES, math.ceil(cold_bytes / bytes_per_copy)))


def _copies(*tensors: torch.Tensor, cold_bytes: int) -> Callable[[], tuple[torch.Tensor, ...]]:
    """A closure returning the next copy of `tensors` (cycled; clones made once, here)."""
    size = sum(t.numel() * t.element_size() for t in tensors)
    sets = [tensors] + [
        tuple(t.clone() for t in tensors) for _ in range(num_copies(size, cold_bytes) - 1)
    ]
    return itertools.cycle(sets).__next__


def build_call(
    case: Case, shape: ModelShape, device: torch.device, dtype: torch.dtype, cold_bytes: int = 0
) -> Callable[[], object]:
    """Allocate the case's inputs on `device` and return a closure running the op once
    (with weights or KV caches rotated over `cold_bytes`, see the module docstring)."""
    dims = RankDims.of(shape, case.tp)
    kw = {"device": device, "dtype": dtype}
    t, h = case.num_tokens, dims.hidden
    op = case.op
    if op in GEMM_OPS and shape.quantization == "fp8":
        n, k = gemm_nk(op, dims)
        x = _rand(t, k, **kw).to(kernels.FP8)  # (T, k)
        w8 = _copies(_rand(n, k, **kw).to(kernels.FP8), cold_bytes=cold_bytes)  # (n, k) each
        scale = torch.ones((), device=device, dtype=torch.float32)
        return lambda: kernels.gemm_fp8(x, *w8(), scale, scale)
    if op in GEMM_OPS or op is OpKind.LM_HEAD:
        n, k = gemm_nk(op, dims)
        x = _rand(t, k, **kw)  # (T, k)
        weight = _copies(_rand(n, k, **kw), cold_bytes=cold_bytes)  # (n, k) each
        fn = kernels.lm_head if op is OpKind.LM_HEAD else kernels.gemm
        return lambda: fn(x, *weight())
    if op is OpKind.NORM:
        x, w = _rand(t, h, **kw), torch.ones(h, **kw)  # (T, h), (h,)
        return lambda: kernels.rms_norm(x, w)
    if op is OpKind.ADD:
        x, r = _rand(t, h, **kw), _rand(t, h, **kw)  # (T, h) twice
        return lambda: kernels.residual_add(x, r)
    if op is OpKind.ACTIVATION:
        if dims.gated:
            gu = _rand(t, 2 * dims.intermediate, **kw)  # (T, 2f/t)
            return lambda: kernels.silu_and_mul(gu)
        u = _rand(t, dims.intermediate, **kw)  # (T, f/t)
        return lambda: kernels.gelu(u)
    if op is OpKind.ROPE:
        q = _rand(t, dims.heads, dims.head_dim, **kw)  # (T, a/t, d)
        kk = _rand(t, dims.kv_heads, dims.head_dim, **kw)  # (T, g/t, d)
        cos, sin = kernels.rope_tables(torch.arange(t, device=device), dims.head_dim)
        return lambda: (kernels.rope(q, cos, sin), kernels.rope(kk, cos, sin))
    if op is OpKind.EMBEDDING:
        ids = torch.randint(0, dims.vocab, (t,), device=device)  # (T,)
        table = _copies(_rand(dims.vocab, h, **kw), cold_bytes=cold_bytes)  # (V/t, h) each
        return lambda: kernels.embedding(ids, *table())
    if op in ATTENTION_OPS:
        return _attention_call(case, dims, device, dtype, cold_bytes)
    raise ValueError(f"{op} is not profiled per operator")


def _attention_call(
    case: Case, dims: RankDims, device: torch.device, dtype: torch.dtype, cold_bytes: int
) -> Callable[[], object]:
    b, q_len, kv_len, d = case.batch_size, case.q_len, case.kv_len, dims.head_dim
    if not (b >= 1 and 1 <= q_len <= kv_len):
        raise ValueError(f"{case.label}: need batch >= 1 and 1 <= q_len <= kv_len")
    kw = {"device": device, "dtype": dtype}
    q = _rand(b, dims.heads, q_len, d, **kw)  # (B, a/t, q, d)
    k_new = _rand(b, dims.kv_heads, q_len, d, **kw)  # (B, g/t, q, d)
    v_new = _rand(b, dims.kv_heads, q_len, d, **kw)
    caches = _copies(  # (B, g/t, kv, d) keys and values, each copy
        _rand(b, dims.kv_heads, kv_len, d, **kw),
        _rand(b, dims.kv_heads, kv_len, d, **kw),
        cold_bytes=cold_bytes,
    )
    attend = {
        OpKind.PREFILL_ATTN: kernels.prefill_attention,
        OpKind.DECODE_ATTN: kernels.decode_attention,
        OpKind.VERIFY_ATTN: kernels.verify_attention,
    }[case.op]

    def call() -> torch.Tensor:
        k_cache, v_cache = caches()
        kernels.write_kv(k_cache, k_new)
        kernels.write_kv(v_cache, v_new)
        return attend(q, k_cache, v_cache)

    return call


def op_dtype(op: OpKind, shape: ModelShape) -> str:
    """The dtype an operator runs in: fp8 for the projections of an fp8-quantised model
    (vLLM keeps the LM head, embedding and norms in the activation dtype), else the
    shape's activation dtype."""
    if op in GEMM_OPS and shape.quantization == "fp8":
        return "fp8"
    return shape.dtype


def case_sample(case: Case, shape: ModelShape, timing: Timing) -> KernelSample:
    """The stored record of a measured case (milliseconds)."""
    dims = RankDims.of(shape, case.tp)
    n, k = sample_nk(case.op, dims)
    attention = case.op in ATTENTION_OPS
    return KernelSample(
        op=case.op,
        median_ms=timing.median_ms,
        p10_ms=timing.p10_ms,
        p90_ms=timing.p90_ms,
        num_repeats=timing.num_repeats,
        model=shape.name,
        dtype=op_dtype(case.op, shape),
        tp=case.tp,
        num_tokens=case.batch_size * case.q_len if attention else case.num_tokens,
        n=n,
        k=k,
        batch_size=case.batch_size,
        q_len=case.q_len,
        kv_len=case.kv_len,
        num_heads=dims.heads if attention or case.op is OpKind.ROPE else 0,
        num_kv_heads=dims.kv_heads if attention or case.op is OpKind.ROPE else 0,
        head_dim=dims.head_dim if attention or case.op is OpKind.ROPE else 0,
    )
