"""AIConfigurator's vLLM DeepSeek-sparse-attention module tables (one GPU folder) ->
KernelSamples of `dsa_decode` and its FP8-KV twin `dsa_decode_fp8kv`
(`optimizer.latency.dsa_module`).

Table read (newest version folder, when present):
  <gpu>/sparse_attention/vllm/<ver>/dsa_generation_module_perf.parquet  decode, ms

What a row measures (AIConfigurator's collector/vllm/collect_mla_module.py, "dsa" cases,
vLLM 0.24.0, H100/H200/B200/B300): one `DeepseekV2MLAAttention` with its lightning
indexer and sparse attention, of deepseek-ai/DeepSeek-V3.2 or zai-org/GLM-5 (`model`),
built with `num_heads` heads at TP 1, timed in a CUDA graph: `batch_size` sequences of
one token over `step` keys (`optimizer.latency.dsa_module`).

Not read: dsa_context_module_perf.parquet. The collector times the DSA prefill eagerly
(`use_cuda_graph = not (attn_type == "dsa" and is_context)`), so its rows hold the
host's launches (about 1.5 ms a layer on H100 up to 1,024 new tokens), which the step
model prices apart (`optimizer.latency.launches`); and they hold cached prefixes of 0
and 128 tokens only, where a chunk after a long prompt's first reads many more.

Kept, mapped to sample fields, as `profiler.importers.aiconfigurator_mla` maps the MLA
module's: `model` one of `dsa_module.MEASURED`'s, `mla_dtype` "bfloat16", `tp_size` 1,
`latency` > 0; `kv_cache_dtype` "bfloat16" -> dsa_decode, "fp8" (vLLM's fp8_ds_mla
cache) -> dsa_decode_fp8kv; `gemm_type` "bfloat16" / "fp8_block" / "nvfp4" -> dtype
"bfloat16" / "fp8" / "fp4". Each row key holds one `kernel_source`, the sparse backend
vLLM 0.24 picked (H100/H200: FLASHMLA_SPARSE; B200/B300: FlashInfer's at an FP8 cache
and below 32 heads, FlashMLA's otherwise): checked on import. Fields: num_tokens =
batch_size, q_len 1, kv_len = step, num_heads = heads per GPU, n = kv_lora_rank, k =
hidden size (which names the measured layer), head_dim = qk_nope + qk_rope of the
measured layer. One latency per row: median, p10 and p90 alike.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from optimizer.latency.dsa_module import MEASURED
from optimizer.records import KernelSample, OpKind
from profiler.importers._common import ProfileImportError, read_parquet, version_key

DSA_GEMM_DTYPES = {"bfloat16": "bfloat16", "fp8_block": "fp8", "nvfp4": "fp4"}
DSA_OPS = {"bfloat16": OpKind.DSA_DECODE, "fp8": OpKind.DSA_DECODE_FP8KV}
DSA_TABLE = "dsa_generation_module_perf.parquet"
DSA_HIDDEN = {dims["model"]: hidden for hidden, dims in MEASURED.items()}
DSA_COLUMNS = (
    "kernel_source",
    "model",
    "mla_dtype",
    "kv_cache_dtype",
    "gemm_type",
    "num_heads",
    "batch_size",
    "isl",
    "tp_size",
    "step",
    "latency",
)
_KEY = ("model", "kv_cache_dtype", "gemm_type", "num_heads", "batch_size", "isl", "step")


def _newest(root: Path, table: str) -> Path | None:
    if not root.is_dir():
        return None
    dirs = [d for d in root.iterdir() if (d / table).is_file()]
    return max(dirs, key=lambda d: version_key(d.name)) / table if dirs else None


def _decode_samples(path: Path) -> list[KernelSample]:
    df = read_parquet(path, DSA_COLUMNS).filter(
        pl.col("model").is_in(list(DSA_HIDDEN)),
        pl.col("mla_dtype") == "bfloat16",
        pl.col("kv_cache_dtype").is_in(["bfloat16", "fp8"]),
        pl.col("gemm_type").is_in(list(DSA_GEMM_DTYPES)),
        pl.col("tp_size") == 1,
        pl.col("isl") == 1,
        pl.col("latency") > 0,
    )
    clashes = df.group_by(_KEY).len().filter(pl.col("len") > 1)
    if clashes.height:
        raise ProfileImportError(
            f"{path}: {clashes.height} row keys were measured more than once; expected one "
            "row (one kernel) per (model, kv dtype, gemm type, heads, batch, isl, step)"
        )
    out = []
    for model, kv, gemm, heads, b, _isl, step, lat in df.select(*_KEY, "latency").iter_rows():
        hidden = DSA_HIDDEN[model]
        dims = MEASURED[hidden]
        out.append(
            KernelSample(
                DSA_OPS[kv],
                lat,
                lat,
                lat,
                dtype=DSA_GEMM_DTYPES[gemm],
                num_tokens=b,
                batch_size=b,
                q_len=1,
                kv_len=step,
                num_heads=heads,
                n=int(dims["kv_lora_rank"]),
                k=hidden,
                head_dim=int(dims["qk_nope_head_dim"]) + int(dims["qk_rope_head_dim"]),
            )
        )
    return out


def dsa_samples(folder: Path) -> list[KernelSample]:
    """The DSA decode module rows of one GPU folder (none when it has no such table)."""
    path = _newest(folder / "sparse_attention" / "vllm", DSA_TABLE)
    return [] if path is None else _decode_samples(path)
