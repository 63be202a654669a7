"""NVIDIA AIConfigurator performance database (one folder per GPU) -> KernelSamples.

Layout read (newest version folder of each table):
  <gpu>/gemm/vllm/<ver>/gemm_perf.parquet            GEMM by (m, n, k), latency ms
  <gpu>/attention/vllm/<ver>/context_attention_perf.parquet     prefill attention
  <gpu>/attention/vllm/<ver>/generation_attention_perf.parquet  decode attention
  <gpu>/comm/nccl/<ver>/nccl_perf.parquet            collectives, message_size in elements
  <gpu>/comm/vllm/<ver>/custom_allreduce_perf.parquet vLLM's own all-reduce (optional)
  <gpu>/<gpu>.yaml                                   system spec (memory, preferred NCCL)
  <gpu>/moe/vllm/<ver>/moe_perf.parquet              fused MoE layer (optional)
  <gpu>/comm/vllm/<ver>/moe_a2a_perf.parquet         EP all-to-all (optional)
  (the MoE tables: `profiler.importers.aiconfigurator_moe`, which says what it keeps)
  <gpu>/mla/vllm/<ver>/mla_{context,generation}_module_perf.parquet  vLLM's whole MLA
  block (optional; `profiler.importers.aiconfigurator_mla`, which says what it keeps)
  <gpu>/linear_attention/<engine>/<ver>/gdn_perf.parquet  a Gated DeltaNet layer's core
  (optional, vLLM and SGLang; `profiler.importers.aiconfigurator_gdn`)
  <gpu>/sparse_attention/vllm/<ver>/dsa_generation_module_perf.parquet  vLLM's whole
  DeepSeek-sparse-attention block decoding (optional; `profiler.importers.aiconfigurator_dsa`)

Filters (a bf16 model with a bf16 KV cache, plus the FP8 variants vLLM runs for
FP8 checkpoints and `--kv-cache-dtype fp8`):
- GEMM: `gemm_dtype` "bfloat16" (dtype "bfloat16") and "fp8" (dtype "fp8").
  "fp8" rows are CUTLASS per-tensor scaled FP8 GEMMs
  (`CutlassFP8ScaledMMLinearKernel`: FP8 weights with per-tensor or
  per-channel scales, activations quantised dynamically to FP8, 16-bit
  output): the kernel vLLM runs on Hopper for `quant_method: fp8` checkpoints
  without a weight block size, ModelOpt FP8 and compressed-tensors FP8
  (e.g. nvidia/...-FP8, RedHatAI/...-FP8(-dynamic)), i.e. what `ModelShape`
  quantization "fp8" means. Dropped: "fp8_block" (128x128 block-scaled
  weights, CUTLASS/DeepGEMM/FlashInfer kernels), which vLLM uses only for
  checkpoints that declare `weight_block_size` (DeepSeek-V3 style, Qwen's own
  Qwen3-*-FP8), on their own grid of shapes; the model has no block-scaled
  format yet. A100 tables hold bf16 GEMMs only (no FP8 tensor cores). "nvfp4"
  (B200/B300: W4A4 NVFP4 GEMMs, FP8 scales per 16 weights, what vLLM runs for
  ModelOpt / compressed-tensors NVFP4 checkpoints) -> dtype "fp4", the 4-bit variant
  `ModelShape` quantization "fp4" prices its projections with.
- Attention: `attn_dtype` "bfloat16"/"float16" with `kv_cache_dtype` either
  16-bit (dtype = attn_dtype) or "fp8" (dtype "fp8": for an
  attention sample the dtype names the KV-cache format; queries and output
  stay in attn_dtype); full attention only (`window_size == 0`; sliding
  windows dropped), `beam_width == 1`. H100/H200 vLLM 0.24 hold FP8-KV rows
  (FlashAttention-3) for both phases: per GPU 16,129 decode and 13,158
  prefill rows of full attention (30,683 decode rows with the sliding-window
  ones this drops); A100 0.14 holds none.
- NCCL: `op_name` "all_reduce", "all_gather" and "reduce_scatter" (vLLM's default
  DP + EP exchange gathers and scatters over the DP ranks), `nccl_dtype == "half"`; the
  version named by the spec YAML's `misc.nccl_version` when it holds all-reduce rows,
  else the newest such version. message_bytes = message_size x 2 (message_size is the
  whole tensor in elements: the all-gather's output, the reduce-scatter's input).
- vLLM's all-reduce: `tensor_model_parallel_all_reduce` as vLLM runs it (its
  communicator picks the custom all-reduce, symmetric memory or NCCL by size), bf16,
  measured inside a CUDA graph (`backend` "vllm_graph" -> `vllm_all_reduce`) and
  eagerly ("vllm_eager" -> `vllm_all_reduce_eager`); message_size in elements, as for
  NCCL (the two tables agree on large messages: 0.881 and 0.885 ms for 2^27 elements on
  two H100s).

Engines: `engine` (default "vllm") picks the <engine> folder of the GEMM and attention
tables (SGLang's and TensorRT-LLM's have the same columns). SGLang's own all-reduce
(`comm/sglang/<ver>/custom_allreduce_perf.parquet`, backends "sglang_graph" and
"sglang_eager", the same columns as vLLM's) and its fused MoE layer are read as vLLM's
are, into the same operators (`vllm_all_reduce` names the engine's own all-reduce). The
EP all-to-all and the MLA and DSA blocks are read for "vllm" only: SGLang's are other tables
(DeepEP inside SGLang, MLA kernels rather than the whole block), priced by the roofline
and listed as such (`Pricing.estimated_ops`). The GDN core's table is read for "vllm" and
"sglang", whose kernels its importer names. NCCL's tables serve every engine.

Mapping: KV length attended = isl + step (context: step = cached prefix;
generation: isl = 1, step = tokens already in the cache). Head counts are per
GPU, as measured.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import yaml

from optimizer.records import DeviceInfo, KernelSample, OpKind
from profiler.importers._common import (
    ImportedProfile,
    ImportFormat,
    ProfileImportError,
    accelerator_name,
    read_parquet,
    version_key,
)
from profiler.importers.aiconfigurator_dsa import dsa_samples
from profiler.importers.aiconfigurator_gdn import gdn_samples
from profiler.importers.aiconfigurator_mla import mla_samples
from profiler.importers.aiconfigurator_moe import moe_a2a_samples, moe_samples

SIXTEEN_BIT = ("bfloat16", "float16")
FP8 = "fp8"  # KernelSample.dtype of FP8 GEMMs and of attention over an FP8 KV cache
# gemm_dtype values kept ("fp8_block" dropped) -> KernelSample.dtype
GEMM_DTYPES = {"bfloat16": "bfloat16", FP8: FP8, "nvfp4": "fp4"}
GEMM_COLUMNS = ("gemm_dtype", "m", "n", "k", "latency")
ATTN_COLUMNS = (
    "batch_size",
    "isl",
    "num_heads",
    "num_key_value_heads",
    "head_dim",
    "beam_width",
    "attn_dtype",
    "kv_cache_dtype",
    "step",
    "latency",
)
NCCL_COLUMNS = ("op_name", "nccl_dtype", "num_gpus", "message_size", "latency")
VLLM_AR_COLUMNS = ("op_name", "allreduce_dtype", "num_gpus", "message_size", "latency", "backend")
VLLM_AR_BACKENDS = {
    "vllm_graph": OpKind.VLLM_ALL_REDUCE,
    "vllm_eager": OpKind.VLLM_ALL_REDUCE_EAGER,
}
# SGLang's custom all-reduce, the same call and columns: the engine's own all-reduce
SGLANG_AR_BACKENDS = {
    "sglang_graph": OpKind.VLLM_ALL_REDUCE,
    "sglang_eager": OpKind.VLLM_ALL_REDUCE_EAGER,
}
ENGINE_AR_BACKENDS = {"vllm": VLLM_AR_BACKENDS, "sglang": SGLANG_AR_BACKENDS}


def _version_dirs(root: Path, table: str) -> list[Path]:
    """Version folders under `root` holding `table`, newest first."""
    if not root.is_dir():
        return []
    dirs = [d for d in root.iterdir() if (d / table).is_file()]
    return sorted(dirs, key=lambda d: version_key(d.name), reverse=True)


def _newest(root: Path, table: str) -> Path:
    dirs = _version_dirs(root, table)
    if not dirs:
        raise ProfileImportError(
            f"{root}: no <version>/{table} found (expected an AIConfigurator GPU folder "
            "such as .../aiconfigurator/h100_sxm)"
        )
    return dirs[0] / table


ENGINES = ("vllm", "sglang", "trtllm")


def _read_spec(spec_path: Path) -> dict:
    if not spec_path.is_file():
        return {}
    try:
        data = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ProfileImportError(f"{spec_path}: cannot parse system spec: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _gemm_samples(path: Path) -> list[KernelSample]:
    df = read_parquet(path, GEMM_COLUMNS).filter(pl.col("gemm_dtype").is_in(list(GEMM_DTYPES)))
    return [
        KernelSample(OpKind.GEMM, lat, lat, lat, dtype=GEMM_DTYPES[dtype], num_tokens=m, n=n, k=k)
        for m, n, k, lat, dtype in df.select("m", "n", "k", "latency", "gemm_dtype").iter_rows()
    ]


# SGLang's Blackwell tables time one shape with several attention backends; kept: the one
# SGLang runs by default, first of this order (trtllm_mha on Blackwell, fa3 on Hopper,
# flashinfer elsewhere), as its server picks it for a standard-attention model.
SGLANG_ATTENTION_PREFERENCE = ("trtllm_mha", "fa3", "flashinfer", "flash_attention", "triton")
_ATTN_KEY = (
    "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "attn_dtype",
    "kv_cache_dtype", "step", "window_size", "beam_width",
)  # fmt: skip


def _one_backend(df: pl.DataFrame, engine: str) -> pl.DataFrame:
    """One row per shape: the engine's default backend where a shape was timed with several
    (SGLang's B200/B300/GB200/GB300 tables; vLLM's hold one kernel per shape)."""
    if engine != "sglang" or "kernel_source" not in df.columns:
        return df
    order = {k: i for i, k in enumerate(SGLANG_ATTENTION_PREFERENCE)}
    rank = pl.col("kernel_source").replace_strict(order, default=len(order))
    return df.sort(rank).unique(subset=list(_ATTN_KEY), keep="first", maintain_order=True)


def _attention_samples(path: Path, op: OpKind, engine: str = "vllm") -> list[KernelSample]:
    df = read_parquet(path, ATTN_COLUMNS)
    if (
        "window_size" not in df.columns
    ):  # older tables (e.g. A100 vLLM 0.14) hold full attention only
        df = df.with_columns(pl.lit(0).alias("window_size"))
    kv = pl.col("kv_cache_dtype")
    df = df.filter(
        pl.col("attn_dtype").is_in(SIXTEEN_BIT),
        kv.is_in(SIXTEEN_BIT) | (kv == FP8),
        pl.col("window_size") == 0,
        pl.col("beam_width") == 1,
    ).with_columns(pl.when(kv == FP8).then(pl.lit(FP8)).otherwise(pl.col("attn_dtype")).alias("dt"))
    df = _one_backend(df, engine)
    cols = ("batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim")
    out = []
    for b, isl, step, heads, kv_heads, head_dim, lat, dtype in df.select(
        *cols, "latency", "dt"
    ).iter_rows():
        out.append(
            KernelSample(
                op,
                lat,
                lat,
                lat,
                dtype=dtype,
                num_tokens=b * isl,
                batch_size=b,
                q_len=isl,
                kv_len=isl + step,
                num_heads=heads,
                num_kv_heads=kv_heads,
                head_dim=head_dim,
            )
        )
    return out


NCCL_OPS = {
    "all_reduce": OpKind.ALL_REDUCE,
    "all_gather": OpKind.ALL_GATHER,
    "reduce_scatter": OpKind.REDUCE_SCATTER,
}


def _nccl_samples(root: Path, spec: dict) -> list[KernelSample]:
    preferred = str((spec.get("misc") or {}).get("nccl_version") or "")
    dirs = _version_dirs(root, "nccl_perf.parquet")
    dirs.sort(key=lambda d: d.name != preferred)  # stable: preferred first, then newest
    for d in dirs:
        path = d / "nccl_perf.parquet"
        df = read_parquet(path, NCCL_COLUMNS).filter(
            pl.col("op_name").is_in(list(NCCL_OPS)), pl.col("nccl_dtype") == "half"
        )
        if df.filter(pl.col("op_name") == "all_reduce").height:
            rows = df.select("op_name", "num_gpus", "message_size", "latency").iter_rows()
            return [
                KernelSample(
                    NCCL_OPS[name],
                    lat,
                    lat,
                    lat,
                    dtype="float16",
                    tp=g,
                    num_gpus=g,
                    message_bytes=2 * size,
                )
                for name, g, size, lat in rows
            ]
    return []


def _engine_all_reduce_samples(root: Path, engine: str = "vllm") -> list[KernelSample]:
    """The engine's own all-reduce (newest version folder whose table holds the engine's
    backends: SGLang's older folders hold TensorRT-LLM's rows), bf16 rows."""
    backends = ENGINE_AR_BACKENDS[engine]
    for d in _version_dirs(root, "custom_allreduce_perf.parquet"):
        path = d / "custom_allreduce_perf.parquet"
        if "backend" not in pl.read_parquet_schema(path):
            continue  # an older layout of another engine's rows
        df = read_parquet(path, VLLM_AR_COLUMNS).filter(
            pl.col("op_name") == "all_reduce",
            pl.col("allreduce_dtype") == "bfloat16",
            pl.col("backend").is_in(list(backends)),
        )
        if df.height:
            break
    else:
        return []
    rows = df.select("backend", "num_gpus", "message_size", "latency").iter_rows()
    return [
        KernelSample(
            backends[backend],
            lat,
            lat,
            lat,
            dtype="bfloat16",
            tp=g,
            num_gpus=g,
            message_bytes=2 * size,
        )
        for backend, g, size, lat in rows
    ]


def import_aiconfigurator(
    folder: Path,
    gpu: str | None = None,
    *,
    engine: str = "vllm",
    spec_path: Path | None = None,
) -> ImportedProfile:
    """Import one AIConfigurator GPU folder (GEMM, attention and, if present, NCCL, the
    GDN core for vLLM and SGLang and, for vLLM, its all-reduce, the fused MoE layer, the EP
    all-to-all and the MLA and DSA blocks).

    `spec_path` is the system spec YAML (default: `<folder>/<folder name>.yaml`, as the
    shared copy lays it out; the package keeps it beside the data folder)."""
    if engine not in ENGINES:
        raise ProfileImportError(f"engine {engine!r}: expected one of {list(ENGINES)}")
    if not folder.is_dir():
        raise ProfileImportError(
            f"{folder}: expected an AIConfigurator GPU folder (e.g. .../aiconfigurator/h100_sxm)"
        )
    accelerator = accelerator_name([folder.name], gpu, folder)
    spec = _read_spec(spec_path or folder / f"{folder.name}.yaml")
    gemm_path = _newest(folder / "gemm" / engine, "gemm_perf.parquet")
    samples = _gemm_samples(gemm_path)
    ctx_path = _newest(folder / "attention" / engine, "context_attention_perf.parquet")
    gen_path = _newest(folder / "attention" / engine, "generation_attention_perf.parquet")
    samples += _attention_samples(ctx_path, OpKind.PREFILL_ATTN, engine)
    samples += _attention_samples(gen_path, OpKind.DECODE_ATTN, engine)
    samples += _nccl_samples(folder / "comm" / "nccl", spec)
    if engine in ENGINE_AR_BACKENDS:
        samples += _engine_all_reduce_samples(folder / "comm" / engine, engine)
        samples += moe_samples(folder, engine=engine)
    if engine == "vllm":
        samples += moe_a2a_samples(folder)
        samples += mla_samples(folder)
        samples += dsa_samples(folder)
    samples += gdn_samples(folder, engine)
    if not samples:
        raise ProfileImportError(f"{folder}: no bf16/fp16 or fp8 rows found in the tables")
    device_name = str(read_parquet(gemm_path, ("device",))["device"][0])
    mem = (spec.get("gpu") or {}).get("mem_capacity")
    device = DeviceInfo(
        kind="imported",
        name=device_name,
        memory_gb=round(float(mem) / 1e9, 1) if mem else None,
        compute_capability=str((spec.get("gpu") or {}).get("sm_version") or "") or None,
    )
    return ImportedProfile(
        ImportFormat.AICONFIGURATOR.value, accelerator, device, samples, engine=engine
    )
