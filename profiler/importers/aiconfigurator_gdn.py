"""AIConfigurator's Gated DeltaNet tables (one GPU folder) -> KernelSamples of
`gdn_prefill` and `gdn_decode` (`optimizer.latency.gdn_module`).

Table read (newest version folder, when present):
  <gpu>/linear_attention/<engine>/<ver>/gdn_perf.parquet   one row per kernel, latency ms

for the engines whose kernels are named below: "vllm" (0.24.0) and "sglang" (0.5.14),
whose tables have the same columns. (TensorRT-LLM's folder holds its own kernels.)

What a row measures (aiconfigurator-core 0.12's tables, H100/H200/B200/B300): one
kernel of one GDN layer's core on one GPU, built with `num_k_heads` key heads and
`num_v_heads` value heads per GPU (the Qwen3.5 checkpoints at TP 1, 2, 4, ...), heads
`head_k_dim` / `head_v_dim` wide, a conv of `d_conv`: `phase` "context" rows run
`batch_size` sequences of `seq_len` new tokens, "generation" rows `batch_size`
sequences of one token (`seq_len` 1). `d_model` and `model_name` name the checkpoint the
head counts came from; two checkpoints with the same head counts (Qwen3.5-122B-A10B and
-397B-A17B) give two rows of each key, both kept (the kernels do not read the hidden
size; it is kept in `k`).

Kept, mapped to sample fields (`optimizer.records.KernelSample`):
- `d_conv` 4 (`gdn_module.CONV_KERNEL`), `latency` > 0;
- a row key's kernels summed into one sample: context = the causal conv1d and the
  chunked delta rule, generation = the conv update and the packed recurrent step
  (`GDN_KERNELS`); a key without all of its phase's kernels (the collectors skip the
  largest decode batches at 64 value heads, a CUDA grid limit) is dropped, a key
  measured twice for one kernel refused;
- fields: batch_size, q_len = seq_len (generation 1), num_tokens = batch_size x q_len,
  num_heads = num_v_heads, num_kv_heads = num_k_heads, head_dim = head_k_dim,
  n = head_v_dim, k = d_model; dtype "bfloat16" (the tables' activations; the state is
  float32, `gdn_module.STATE_DTYPE`). One latency per row: median, p10 and p90 alike.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from optimizer.latency.gdn_module import CONV_KERNEL
from optimizer.records import KernelSample, OpKind
from profiler.importers._common import ProfileImportError, read_parquet, version_key

GDN_TABLE = "gdn_perf.parquet"
# Per engine and phase, the kernels of one core (what vLLM 0.24 and SGLang 0.5.14 run)
GDN_KERNELS = {
    "vllm": {
        "context": ("causal_conv1d_fn", "chunk_gated_delta_rule_flashinfer"),
        "generation": ("causal_conv1d_update", "fused_recurrent_gated_delta_rule_packed_decode"),
    },
    "sglang": {
        "context": ("causal_conv1d_fn", "chunk_gated_delta_rule"),
        "generation": ("causal_conv1d_update", "fused_recurrent_gated_delta_rule_packed_decode"),
    },
}
GDN_OPS = {"context": OpKind.GDN_PREFILL, "generation": OpKind.GDN_DECODE}
GDN_COLUMNS = (
    "kernel_source",
    "phase",
    "batch_size",
    "seq_len",
    "d_model",
    "d_conv",
    "num_k_heads",
    "head_k_dim",
    "num_v_heads",
    "head_v_dim",
    "model_name",
    "latency",
)
_KEY = (
    "model_name",
    "d_model",
    "num_k_heads",
    "head_k_dim",
    "num_v_heads",
    "head_v_dim",
    "batch_size",
    "seq_len",
)


def _newest(root: Path) -> Path | None:
    if not root.is_dir():
        return None
    dirs = [d for d in root.iterdir() if (d / GDN_TABLE).is_file()]
    return max(dirs, key=lambda d: version_key(d.name)) / GDN_TABLE if dirs else None


def _phase_samples(
    df: pl.DataFrame, path: Path, phase: str, kernels: tuple[str, ...]
) -> list[KernelSample]:
    rows = df.filter(pl.col("phase") == phase, pl.col("kernel_source").is_in(list(kernels)))
    twice = rows.group_by(*_KEY, "kernel_source").len().filter(pl.col("len") > 1)
    if twice.height:
        raise ProfileImportError(
            f"{path}: {twice.height} ({phase}) row keys hold a kernel more than once; "
            f"expected one row per kernel and (heads, head dims, batch, seq_len, model)"
        )
    whole = (
        rows.group_by(_KEY)
        .agg(pl.len().alias("num_kernels"), pl.col("latency").sum())
        .filter(pl.col("num_kernels") == len(kernels))
        .sort(_KEY)
    )
    out = []
    for _model, hidden, hk, dk, hv, dv, b, s, lat in whole.select(*_KEY, "latency").iter_rows():
        q = s if phase == "context" else 1
        out.append(
            KernelSample(
                GDN_OPS[phase],
                lat,
                lat,
                lat,
                model="",
                num_tokens=b * q,
                batch_size=b,
                q_len=q,
                num_heads=hv,
                num_kv_heads=hk,
                head_dim=dk,
                n=dv,
                k=hidden,
            )
        )
    return out


def gdn_samples(folder: Path, engine: str = "vllm") -> list[KernelSample]:
    """The GDN core rows of one GPU folder for `engine` (none when it has no such table
    or the engine's kernels are not known here)."""
    kernels = GDN_KERNELS.get(engine)
    path = _newest(folder / "linear_attention" / engine)
    if kernels is None or path is None:
        return []
    df = read_parquet(path, GDN_COLUMNS).filter(
        pl.col("d_conv") == CONV_KERNEL, pl.col("latency") > 0
    )
    out: list[KernelSample] = []
    for phase in ("context", "generation"):
        out += _phase_samples(df, path, phase, kernels[phase])
    return out
