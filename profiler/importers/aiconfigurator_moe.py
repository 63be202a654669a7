"""AIConfigurator's MoE tables (one GPU folder) -> KernelSamples of `moe`, `moe_dispatch`
and `moe_combine`.

Tables read (newest version folder of each, when present):
  <gpu>/moe/vllm/<ver>/moe_perf.parquet          vLLM's fused MoE layer, latency ms
  <gpu>/comm/vllm/<ver>/moe_a2a_perf.parquet     DeepEP dispatch / combine, latency us

`moe_perf` (vLLM 0.24.0 on H100/H200/B200/B300): one row per (num_tokens, hidden_size,
inter_size, topk, num_experts, moe_tp_size, moe_ep_size, distribution, moe_dtype) with
the `kernel_source` that ran it. `num_tokens` is the tokens of the whole expert group
before routing (all EP ranks' tokens): one rank runs its num_experts / ep experts, each
inter_size / moe_tp wide, over its share of the num_tokens x topk (token, expert) pairs.
Kept:
- `distribution == "power_law_1.01"`: routing skewed as real prompts route, the
  distribution AIConfigurator itself prices vLLM's MoE with by default (its
  ModelConfig.workload_distribution "power_law" reads these rows), and the only one
  every GPU folder holds (A100's vLLM 0.14 table has no "balanced" rows). "balanced"
  (tokens spread evenly: every expert busy, an upper bound on the weights a small
  batch reads) and "power_law_1.2" stay readable for comparisons;
- `moe_dtype` "bfloat16" -> dtype "bfloat16", "fp8_block" (128x128 block-scaled FP8,
  what the FP8 MoE checkpoints run: DeepSeek-V3/R1, Kimi-K2, Qwen3-*-FP8, MiniMax-M2;
  `ModelShape` quantization "fp8" counts them) -> "fp8",
  "nvfp4" (W4A4 NVFP4, Blackwell) -> "fp4", "w4a16_mxfp4" of gpt-oss's kernel
  (`vllm_gptossmxfp4moe_*`: OAI Triton on Hopper, FlashInfer TRT-LLM MXFP4 x BF16 on
  Blackwell) -> "mxfp4", "int4_wo" (compressed-tensors WNA16 Marlin) -> "int4".
- One kernel per row key: the tables hold exactly one kernel_source per key and dtype
  (checked on import), the one AIConfigurator's collector found vLLM 0.24 selecting for
  that dtype, GPU and split (e.g. bf16: Triton `TritonExperts` on Hopper, FlashInfer
  TRT-LLM `TrtLlmBf16Experts` on Blackwell, FlashInfer CUTLASS for the MiniMax shape),
  so no choice between kernels is made here.
SGLang (`moe/sglang/<ver>/moe_perf.parquet`, 0.5.14) is read by the same rules: its
kernels (Triton fused MoE, FlashInfer CUTLASS / TRT-LLM, Marlin) are again one per row
key; its MXFP4 rows tagged "situ_as_silu" are dropped, as vLLM's Kimi rows are. Its
wide-EP tables (`wideep_*`, DeepEP inside SGLang) are not read; nor are TensorRT-LLM's.

Dropped: "fp8" (per-tensor FP8 experts, ModelOpt's: one FP8 MoE variant is kept, the
block-scaled one the published FP8 MoE checkpoints use; the per-tensor rows lack
DeepSeek's and Kimi's dims, so a fit on them priced DeepSeek-V3's FP8 experts 3x slower
than bf16), "w4a8_mxfp4_mxfp8" (an opt-in FlashInfer path), the Kimi-K3
compressed-tensors MXFP4 Marlin rows (not gpt-oss's MXFP4 kernel), the other two
distributions (`moe_samples` reads them on request; benchmarks/bench_moe_steps.py
compares them).

`moe_a2a_perf` (H100/H200/B200/B300, EP 8 on one node): DeepEP dispatch and combine by
tokens per rank (`num_tokens`), hidden size, top-k and experts. Kept: the
`deepep_ht` (high-throughput, prefill) and `deepep_ll` (low-latency, decode) backends of
DeepEP v1, whichever is faster at each key (vLLM picks one per deployment with
--all2all-backend; the faster of the two is what a tuned deployment runs at that size);
`latency` is in microseconds, stored as ms. Dropped: the `deepep_v2_*` rows (H100/H200
only). Sample fields: num_tokens = tokens per rank, k = hidden, batch_size = top-k,
num_heads = experts, num_gpus = tp = EP size.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from optimizer.records import KernelSample, OpKind
from profiler.importers._common import ProfileImportError, read_parquet, version_key

MOE_DTYPES = {
    "bfloat16": "bfloat16",
    "fp8_block": "fp8",
    "nvfp4": "fp4",
    "w4a16_mxfp4": "mxfp4",
    "int4_wo": "int4",
}
MXFP4_KERNEL_PREFIX = "vllm_gptossmxfp4moe_"  # gpt-oss's MXFP4 MoE (the other is Kimi's)
# SGLang's MXFP4 rows of a plain-SiLU variant (not gpt-oss's clamped SwiGLU), dropped
SGLANG_SILU_SUFFIX = "situ_as_silu"
MOE_COLUMNS = (
    "kernel_source",
    "moe_dtype",
    "num_tokens",
    "hidden_size",
    "inter_size",
    "topk",
    "num_experts",
    "moe_tp_size",
    "moe_ep_size",
    "distribution",
    "latency",
)
A2A_COLUMNS = (
    "comm_backend",
    "phase",
    "ep_size",
    "hidden_size",
    "topk",
    "num_experts",
    "num_tokens",
    "latency",
)
A2A_BACKENDS = ("deepep_ht", "deepep_ll")
A2A_PHASES = {"dispatch": OpKind.MOE_DISPATCH, "combine": OpKind.MOE_COMBINE}
_KEY = (
    "moe_dtype",
    "num_tokens",
    "hidden_size",
    "inter_size",
    "topk",
    "num_experts",
    "moe_tp_size",
    "moe_ep_size",
)


def _newest(root: Path, table: str) -> Path | None:
    if not root.is_dir():
        return None
    dirs = [d for d in root.iterdir() if (d / table).is_file()]
    return max(dirs, key=lambda d: version_key(d.name)) / table if dirs else None


MOE_DISTRIBUTIONS = ("balanced", "power_law_1.01", "power_law_1.2")


DEFAULT_MOE_DISTRIBUTION = "power_law_1.01"  # AIConfigurator's default ("power_law")


def _mxfp4_kernel(engine: str) -> pl.Expr:
    """Which MXFP4 rows are gpt-oss's kernel, by engine."""
    kernel = pl.col("kernel_source")
    if engine == "vllm":
        return kernel.str.starts_with(MXFP4_KERNEL_PREFIX)
    return ~kernel.str.ends_with(SGLANG_SILU_SUFFIX)


def moe_samples(
    folder: Path, distribution: str = DEFAULT_MOE_DISTRIBUTION, engine: str = "vllm"
) -> list[KernelSample]:
    """The fused MoE rows of one GPU folder for `engine` (none when it has no moe table),
    of one routing `distribution` (the import keeps DEFAULT_MOE_DISTRIBUTION; the others
    are for comparisons such as benchmarks/bench_moe_steps.py)."""
    if distribution not in MOE_DISTRIBUTIONS:
        raise ProfileImportError(
            f"MoE distribution {distribution!r}: expected one of {MOE_DISTRIBUTIONS}"
        )
    if engine not in ("vllm", "sglang"):
        return []  # TensorRT-LLM's MoE rows are not read (its step is not priced)
    path = _newest(folder / "moe" / engine, "moe_perf.parquet")
    if path is None:
        return []
    kernel = pl.col("kernel_source")
    df = read_parquet(path, MOE_COLUMNS).filter(
        pl.col("distribution") == distribution,
        pl.col("moe_dtype").is_in(list(MOE_DTYPES)),
        (pl.col("moe_dtype") != "w4a16_mxfp4") | _mxfp4_kernel(engine),
        pl.col("latency") > 0,
    )
    clashes = (
        df.group_by(_KEY).agg(kernel.n_unique().alias("kernels")).filter(pl.col("kernels") > 1)
    )
    if clashes.height:
        raise ProfileImportError(
            f"{path}: {clashes.height} row keys were measured with several kernels; "
            "expected one kernel per (dtype, shape, split)"
        )
    df = df.unique(subset=list(_KEY), keep="first", maintain_order=True)
    rows = df.select(*_KEY, "latency").iter_rows()
    return [
        KernelSample(
            OpKind.MOE,
            lat,
            lat,
            lat,
            dtype=MOE_DTYPES[dtype],
            num_tokens=tokens,
            n=inter,
            k=hidden,
            batch_size=topk,
            num_heads=experts,
            tp=tp,
            num_gpus=ep,
        )
        for dtype, tokens, hidden, inter, topk, experts, tp, ep, lat in rows
    ]


def moe_a2a_samples(folder: Path) -> list[KernelSample]:
    """DeepEP dispatch / combine rows (the faster backend per key), ms."""
    path = _newest(folder / "comm" / "vllm", "moe_a2a_perf.parquet")
    if path is None:
        return []
    key = ["phase", "ep_size", "hidden_size", "topk", "num_experts", "num_tokens"]
    df = (
        read_parquet(path, A2A_COLUMNS)
        .filter(
            pl.col("comm_backend").is_in(A2A_BACKENDS),
            pl.col("latency") > 0,
            pl.col("phase").is_in(list(A2A_PHASES)),
        )
        .group_by(key)
        .agg(pl.col("latency").min())
        .sort(key)
    )
    return [
        KernelSample(
            A2A_PHASES[phase],
            us / 1e3,
            us / 1e3,
            us / 1e3,
            tp=ep,
            num_gpus=ep,
            num_tokens=tokens,
            k=hidden,
            batch_size=topk,
            num_heads=experts,
        )
        for phase, ep, hidden, topk, experts, tokens, us in df.iter_rows()
    ]
