"""Vidur's per-operator profiling CSVs -> KernelSamples.

Files understood (one file, or a folder searched recursively for them):
- `mlp.csv`: per-layer token-parallel ops by `num_tokens` and
  `num_tensor_parallel_workers`, with the model shape (`n_head`, `n_kv_head`,
  `n_embd`, `n_expanded_embd`, `use_gated_mlp`); n/k come from
  `optimizer.dims.sample_nk`, as for our own profiles (head_dim = n_embd /
  n_head). Elementwise ops carry in `n` the row width they touch on one GPU:
  hidden size (norms, adds, embedding), intermediate / TP (activation),
  (heads + KV heads) x head_dim / TP (RoPE).
- `attention.csv`: `attn_prefill` (q = prefill_chunk_size, kv = kv_cache_size +
  chunk) and `attn_decode` (batch of sequences, each with kv_cache_size tokens);
  head counts stored per GPU (divided by the TP degree).
- `all_reduce.csv`: all-reduce by `size` (bytes) and `num_workers`; only
  single-node rows (`devices_per_node >= num_workers`) are kept.

Times are milliseconds. Vidur measured fp16 models with an fp16 KV cache, so
every row is kept and labelled "float16". p10/p90 are approximated from the
median and std (clipped to min/max), as Vidur stores no percentiles.
The model name comes from the folder (`meta-llama/Llama-2-7b-hf` ->
"llama-2-7b"); the accelerator from a path part such as `h100` or `a100_dgx`.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from optimizer.dims import RankDims, sample_nk
from optimizer.records import DeviceInfo, KernelSample, OpKind
from profiler.importers._common import (
    ImportedProfile,
    ImportFormat,
    ProfileImportError,
    accelerator_name,
    read_csv,
    require_columns,
)

MLP_OPS: dict[str, OpKind] = {
    "emb": OpKind.EMBEDDING,
    "input_layernorm": OpKind.NORM,
    "attn_pre_proj": OpKind.QKV_PROJ,
    "attn_rope": OpKind.ROPE,
    "attn_post_proj": OpKind.ATTN_OUT_PROJ,
    "post_attention_layernorm": OpKind.NORM,
    "mlp_up_proj": OpKind.MLP_UP,
    "mlp_act": OpKind.ACTIVATION,
    "mlp_down_proj": OpKind.MLP_DOWN,
    "add": OpKind.ADD,
}
MLP_SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp")
ATTN_SHAPE = ("n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers")
ATTN_KEYS = ("batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill")
KNOWN_FILES = ("mlp.csv", "attention.csv", "all_reduce.csv")
_Z90 = 1.2816  # standard normal 90th percentile


def _stats(df: pl.DataFrame, name: str, where: Path) -> pl.DataFrame:
    """Columns median/p10/p90 (float ms) for op `name`; rows without a median dropped."""
    cols = [f"time_stats.{name}.{s}" for s in ("median", "std", "min", "max")]
    require_columns(df, cols, where)
    med, std, lo, hi = (pl.col(c).cast(pl.Float64, strict=False) for c in cols)
    return df.with_columns(
        med.alias("_median"),
        pl.max_horizontal(lo, med - _Z90 * std.fill_null(0.0)).alias("_p10"),
        pl.min_horizontal(hi, med + _Z90 * std.fill_null(0.0)).alias("_p90"),
    ).filter(pl.col("_median").is_not_null() & (pl.col("_median") > 0))


def _model_name(path: Path) -> str:
    name = path.parent.name.lower()
    return name.removesuffix("-hf")


def _mlp_samples(path: Path, df: pl.DataFrame) -> list[KernelSample]:
    require_columns(df, (*MLP_SHAPE, "num_tokens", "num_tensor_parallel_workers"), path)
    model = _model_name(path)
    out: list[KernelSample] = []
    for name, op in MLP_OPS.items():
        part = _stats(df, name, path)
        rows = part.select(
            *MLP_SHAPE, "num_tokens", "num_tensor_parallel_workers", "_median", "_p10", "_p90"
        ).iter_rows()
        for a, g, h, f, gated, tokens, tp, med, p10, p90 in rows:
            d = h // a
            # Vidur's CSVs have no vocabulary: its embedding rows keep k = 0.
            dims = RankDims(h, a // tp, max(1, g // tp), d, f // tp, 0, bool(gated), 2)
            n, k = sample_nk(op, dims)
            out.append(
                KernelSample(
                    op,
                    med,
                    p10,
                    p90,
                    model=model,
                    dtype="float16",
                    tp=tp,
                    num_tokens=tokens,
                    n=n,
                    k=k,
                    num_heads=dims.heads,
                    num_kv_heads=dims.kv_heads,
                    head_dim=d,
                )
            )
    return out


def _attention_samples(path: Path, df: pl.DataFrame) -> list[KernelSample]:
    require_columns(df, (*ATTN_SHAPE, *ATTN_KEYS), path)
    model = _model_name(path)
    out: list[KernelSample] = []
    for name, op, prefill in (
        ("attn_prefill", OpKind.PREFILL_ATTN, True),
        ("attn_decode", OpKind.DECODE_ATTN, False),
    ):
        part = _stats(df.filter(pl.col("is_prefill") == prefill), name, path)
        rows = part.select(*ATTN_SHAPE, *ATTN_KEYS[:3], "_median", "_p10", "_p90").iter_rows()
        for h, a, g, tp, b, chunk, kv, med, p10, p90 in rows:
            q = chunk if prefill else 1
            out.append(
                KernelSample(
                    op,
                    med,
                    p10,
                    p90,
                    model=model,
                    dtype="float16",
                    tp=tp,
                    num_tokens=b * q,
                    batch_size=b,
                    q_len=q,
                    kv_len=kv + chunk if prefill else kv,
                    num_heads=a // tp,
                    num_kv_heads=max(1, g // tp),
                    head_dim=h // a,
                )
            )
    return out


def _all_reduce_samples(path: Path, df: pl.DataFrame) -> list[KernelSample]:
    require_columns(df, ("num_workers", "size", "devices_per_node"), path)
    part = _stats(df, "all_reduce", path).filter(
        pl.col("devices_per_node") >= pl.col("num_workers")
    )
    return [
        KernelSample(
            OpKind.ALL_REDUCE,
            med,
            p10,
            p90,
            dtype="float16",
            tp=g,
            num_gpus=g,
            message_bytes=size,
        )
        for g, size, med, p10, p90 in part.select(
            "num_workers", "size", "_median", "_p10", "_p90"
        ).iter_rows()
    ]


def _files(path: Path) -> list[Path]:
    if path.is_file():
        if path.name not in KNOWN_FILES:
            raise ProfileImportError(f"{path}: not a Vidur profile; expected one of {KNOWN_FILES}")
        return [path]
    files = sorted(p for p in path.rglob("*.csv") if p.name in KNOWN_FILES)
    if not files:
        raise ProfileImportError(f"{path}: no Vidur profile files {KNOWN_FILES} found")
    return files


def import_vidur(path: Path, gpu: str | None = None) -> ImportedProfile:
    """Import one Vidur CSV or every Vidur CSV under a folder (all for one accelerator)."""
    files = _files(path)
    of_file = {f: accelerator_name(f.parts[::-1], gpu, f) for f in files}
    accelerators = set(of_file.values())
    if len(accelerators) > 1:
        groups = "; ".join(
            f"{acc}: " + ", ".join(str(f) for f in files if of_file[f] == acc)
            for acc in sorted(accelerators)
        )
        raise ProfileImportError(
            f"{path}: files of several accelerators ({groups}); import one accelerator's "
            "files at a time (--gpu names the accelerator only of files whose path names none)"
        )
    samples: list[KernelSample] = []
    for f in files:
        df = read_csv(f)
        reader = {
            "mlp.csv": _mlp_samples,
            "attention.csv": _attention_samples,
            "all_reduce.csv": _all_reduce_samples,
        }[f.name]
        samples += reader(f, df)
    if not samples:
        raise ProfileImportError(f"{path}: no usable rows")
    accelerator = accelerators.pop()
    device = DeviceInfo(kind="imported", name=f"{accelerator} (Vidur profile)")
    return ImportedProfile(ImportFormat.VIDUR.value, accelerator, device, samples)
