"""AIConfigurator's vLLM MLA module tables (one GPU folder) -> KernelSamples of
`mla_prefill`, `mla_decode` and their FP8-KV twins `mla_prefill_fp8kv`, `mla_decode_fp8kv`.

Tables read (newest version folder, when present):
  <gpu>/mla/vllm/<ver>/mla_context_module_perf.parquet     prefill, latency ms
  <gpu>/mla/vllm/<ver>/mla_generation_module_perf.parquet  decode, latency ms

What a row measures (AIConfigurator's collector/vllm/collect_mla_module.py, vLLM 0.24.0,
H100/H200/B200/B300): one `DeepseekV2MLAAttention` of deepseek-ai/DeepSeek-V3 built with
`num_heads` heads at TP 1, its forward timed in a CUDA graph: the whole MLA block of one
TP rank at heads = 128 / TP (projections, RoPE, attention, o_proj; not the TP all-reduce;
`optimizer.latency.mla_module`). Context rows: `batch_size` sequences of `isl` new
tokens and no cached prefix (`step` 0); generation rows: `batch_size` sequences of one
token over `step` keys (the cached `step - 1` plus its own).

Kept, mapped to sample fields (`optimizer.dims`):
- `model` deepseek-ai/DeepSeek-V3, `tp_size` 1, `latency` > 0;
- `mla_dtype` "bfloat16" only: 16-bit queries, vLLM's default. The "fp8" rows (FP8
  prefill queries, `use_prefill_query_quantization`, an opt-in on Blackwell run by the
  TRTLLM_RAGGED or FlashInfer prefill) are dropped;
- `kv_cache_dtype` "bfloat16" -> mla_prefill / mla_decode, "fp8" -> the _fp8kv ops
  (`--kv-cache-dtype fp8`, the FP8 variant of attention);
- `gemm_type` is the projections' weight format: "bfloat16" -> dtype "bfloat16",
  "fp8_block" (128x128 block-scaled FP8, DeepSeek-V3's own checkpoint) -> "fp8" (the
  shapes part counts block-scaled FP8 as "fp8"), "nvfp4" (Blackwell) -> "fp4".
- Kernels: with those filters each row key holds one `kernel_source`, the backend vLLM
  0.24 itself picked for the batch (checked on import): decode and batches vLLM treats as
  decodes (short queries) run the decode backend (H100/H200: FLASH_ATTN_MLA for a 16-bit
  KV cache, FLASHMLA for FP8; B200/B300: FLASHINFER_MLA), longer prefills the prefill
  backend (FLASH_ATTN, FlashAttention's ragged MHA over the up-projected keys). So this
  is the default vLLM runs; no choice between kernels is made here.
Fields: num_tokens = batch_size x q_len, q_len = isl (decode 1), kv_len = isl (decode
step), num_heads = heads per GPU, n = kv_lora_rank 512, k = hidden 7168, head_dim =
qk_nope + qk_rope 192 (the measured layer's dims). The tables give one latency per row:
median, p10 and p90 are all of it.
Not read: mla_bmm/vllm/<ver>/mla_bmm_perf.parquet (the absorbed W_UK / W_UV batched
matmuls alone): the generation module rows already contain them.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from optimizer.records import KernelSample, OpKind
from profiler.importers._common import ProfileImportError, read_parquet, version_key

MLA_MODEL = "deepseek-ai/DeepSeek-V3"
MLA_GEMM_DTYPES = {"bfloat16": "bfloat16", "fp8_block": "fp8", "nvfp4": "fp4"}
MLA_OPS = {
    ("context", "bfloat16"): OpKind.MLA_PREFILL,
    ("context", "fp8"): OpKind.MLA_PREFILL_FP8KV,
    ("generation", "bfloat16"): OpKind.MLA_DECODE,
    ("generation", "fp8"): OpKind.MLA_DECODE_FP8KV,
}
# The measured layer's dims (DeepSeek-V3 config.json), stored in n, k and head_dim
MLA_KV_LORA_RANK, MLA_HIDDEN, MLA_QK_HEAD_DIM = 512, 7168, 192
MLA_COLUMNS = (
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
_KEY = ("kv_cache_dtype", "gemm_type", "num_heads", "batch_size", "isl", "step")


def _newest(root: Path, table: str) -> Path | None:
    if not root.is_dir():
        return None
    dirs = [d for d in root.iterdir() if (d / table).is_file()]
    return max(dirs, key=lambda d: version_key(d.name)) / table if dirs else None


def _phase_samples(path: Path, phase: str) -> list[KernelSample]:
    df = read_parquet(path, MLA_COLUMNS).filter(
        pl.col("model") == MLA_MODEL,
        pl.col("mla_dtype") == "bfloat16",
        pl.col("kv_cache_dtype").is_in(["bfloat16", "fp8"]),
        pl.col("gemm_type").is_in(list(MLA_GEMM_DTYPES)),
        pl.col("tp_size") == 1,
        pl.col("latency") > 0,
    )
    if phase == "context":
        df = df.filter(pl.col("step") == 0)
    clashes = df.group_by(_KEY).len().filter(pl.col("len") > 1)
    if clashes.height:
        raise ProfileImportError(
            f"{path}: {clashes.height} row keys were measured more than once; expected one "
            "row (one kernel) per (kv dtype, gemm type, heads, batch, isl, step)"
        )
    out = []
    for kv, gemm, heads, b, isl, step, lat in df.select(*_KEY, "latency").iter_rows():
        q = isl if phase == "context" else 1
        out.append(
            KernelSample(
                MLA_OPS[phase, kv],
                lat,
                lat,
                lat,
                dtype=MLA_GEMM_DTYPES[gemm],
                num_tokens=b * q,
                batch_size=b,
                q_len=q,
                kv_len=isl if phase == "context" else step,
                num_heads=heads,
                n=MLA_KV_LORA_RANK,
                k=MLA_HIDDEN,
                head_dim=MLA_QK_HEAD_DIM,
            )
        )
    return out


def mla_samples(folder: Path) -> list[KernelSample]:
    """The MLA module rows of one GPU folder (none when it has no mla tables)."""
    out: list[KernelSample] = []
    for phase in ("context", "generation"):
        path = _newest(folder / "mla" / "vllm", f"mla_{phase}_module_perf.parquet")
        if path is not None:
            out += _phase_samples(path, phase)
    return out
