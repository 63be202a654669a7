"""Profile one model's operators on a GPU with servetune's profiler, then compare them
with NVIDIA AIConfigurator's measured tables for the same GPU.

    # on the GPU machine (needs torch with CUDA and numpy; nothing else of the project):
    PYTHONPATH=. python3 benchmarks/gpu_ops.py measure --out DIR [--model llama-3.1-8b]
    # anywhere with the project installed and ../shared/data present:
    .venv/bin/python benchmarks/gpu_ops.py compare benchmarks/results/h200-llama-3.1-8b.csv \\
        --tables ../shared/data/profiles/aiconfigurator/h200_sxm

`measure` runs `profiler.sweep.run_sweep` (the code `servetune profile run --device
cuda` runs) in phases, most wanted first, and writes each phase's samples as soon
as it ends, so a run cut short keeps what it measured:
  1. the four projection GEMMs in bf16 and 2. in FP8 (W8A8, per-tensor scales,
     `torch._scaled_mm`), TP 1, 2 and 4, 1 to 16,384 tokens;
  3. prefill attention (batch 1 and 4, 128 to 16,384 tokens, no context and 4,096
     cached) and decode attention (batch 1 to 1,024, 128 to 32,768 keys), bf16 KV;
  4. the LM head and the elementwise operators.
It writes `<model>.csv` (one row per sample, `KernelSample`'s fields) and
`<model>.json` (the device: name, memory as the driver reports it, versions).

`compare` matches each measured GEMM and attention sample with the table rows of
the same shape (GEMM: dtype, m, n, k; attention: per-GPU heads, head dim, batch,
query and key lengths), and prints the ratio ours / table per operator and dtype.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def _phases(shape):
    """(label, shape, grid) in the order they are measured."""
    from optimizer.records import OpKind
    from profiler.sweep import ProfileGrid

    gemms = (OpKind.QKV_PROJ, OpKind.ATTN_OUT_PROJ, OpKind.MLP_UP, OpKind.MLP_DOWN)
    base = ProfileGrid(
        num_tokens=TOKENS,
        tp_degrees=(1, 2, 4),
        lm_head_rows=(1, 4, 16, 64, 256, 1024),
        prefill_batch_sizes=(1, 4),
        prefill_chunk_lens=(128, 512, 1024, 2048, 4096, 8192, 16384),
        prefill_context_lens=(0, 4096),
        decode_batch_sizes=(1, 4, 16, 64, 256, 1024),
        decode_kv_lens=(128, 512, 2048, 8192, 32768),
        warmup=5,
        repeats=30,
        min_repeats=10,
        max_case_s=0.3,
        max_kv_cache_gb=16.0,
        ops=gemms,
    )
    fp8 = replace(shape, quantization="fp8")
    rest = (OpKind.LM_HEAD, OpKind.NORM, OpKind.ADD, OpKind.ACTIVATION, OpKind.ROPE)
    return (
        ("bf16 GEMMs", shape, base),
        ("fp8 GEMMs", fp8, base),
        ("attention", shape, replace(base, ops=(OpKind.PREFILL_ATTN, OpKind.DECODE_ATTN))),
        ("LM head, elementwise", shape, replace(base, ops=(*rest, OpKind.EMBEDDING))),
    )


def _check_fp8(device) -> float:
    """Relative error of the FP8 GEMM against a float64 reference on fresh random data."""
    import torch

    from profiler import kernels

    x = torch.randn(256, 4096, device=device)
    w = torch.randn(1024, 4096, device=device) * 0.05
    sx, sw = x.abs().max() / 448, w.abs().max() / 448
    out = kernels.gemm_fp8(
        (x / sx).to(kernels.FP8), (w / sw).to(kernels.FP8), sx.float(), sw.float()
    )
    ref = x.double() @ w.double().t()
    return float((out.double() - ref).norm() / ref.norm())


def _fused_attention(device) -> str:
    """Whether SDPA runs our attention shapes (GQA, bottom-right causal) in a fused kernel;
    the math fallback materialises q x kv scores and would be timed instead."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from profiler import kernels

    kw = {"device": device, "dtype": torch.bfloat16}
    q = torch.randn(1, 32, 1024, 128, **kw)
    k, v = torch.randn(1, 8, 1536, 128, **kw), torch.randn(1, 8, 1536, 128, **kw)
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    try:
        with sdpa_kernel(fused):
            kernels.prefill_attention(q, k, v)
            kernels.decode_attention(q[:, :, :1], k, v)
    except RuntimeError as exc:
        return f"no fused kernel ({str(exc).splitlines()[0]})"
    return "fused"


def measure(args: argparse.Namespace) -> None:
    import torch

    from optimizer.records import KernelSample
    from optimizer.shapes import get_shape
    from profiler.device import describe_device, parse_device
    from profiler.sweep import run_sweep

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = parse_device(args.device)
    shape = get_shape(args.model)
    free, total = torch.cuda.mem_get_info(device) if device.type == "cuda" else (0, 0)
    info = asdict(describe_device(device))
    info |= {"mem_total_bytes": total, "mem_free_bytes": free, "model": shape.name}
    info["fp8_gemm_rel_error"] = _check_fp8(device)
    info["attention"] = _fused_attention(device) if device.type == "cuda" else "cpu"
    (out / f"{shape.name}.json").write_text(json.dumps(info, indent=2))
    print(json.dumps(info), flush=True)
    names = [f.name for f in fields(KernelSample)]
    deadline = time.monotonic() + args.budget_s
    with open(out / f"{shape.name}.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(names)
        for label, phase_shape, grid in _phases(shape):
            if time.monotonic() > deadline:
                print(f"{label}: skipped, past the {args.budget_s} s budget", flush=True)
                continue
            if label == "attention" and info["attention"] != "fused":
                grid = replace(grid, prefill_chunk_lens=(128, 512, 1024, 2048, 4096))
            start = time.monotonic()
            try:
                samples = run_sweep(phase_shape, grid, device)
            except Exception as exc:  # keep the other phases
                print(f"{label}: failed: {type(exc).__name__}: {exc}", flush=True)
                continue
            for s in samples:
                writer.writerow([str(getattr(s, n)) for n in names])
            fh.flush()
            took = time.monotonic() - start
            print(f"{label}: {len(samples)} samples in {took:.1f} s", flush=True)
            _summary(samples)


def _summary(samples) -> None:
    for s in samples:
        if s.tp == 1 and s.num_tokens in (1, 128, 4096) and s.n and s.k:
            tflops = 2 * s.num_tokens * s.n * s.k / (s.median_ms * 1e-3) / 1e12
            print(
                f"  {s.op:<14} {s.dtype:<9} m={s.num_tokens:<5} n={s.n:<6} k={s.k:<6} "
                f"{s.median_ms * 1e3:9.1f} us  {tflops:7.1f} TFLOP/s",
                flush=True,
            )


# ---------------------------------------------------------------- compare (no GPU)


def _load_samples(path: Path):
    from optimizer.records import KernelSample, OpKind

    types = {f.name: f.type for f in fields(KernelSample)}
    rows = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            values = {}
            for name, text in row.items():
                kind = types[name]
                if name == "op":
                    values[name] = OpKind(text)
                elif kind in ("float", float):
                    values[name] = float(text)
                elif kind in ("int", int):
                    values[name] = int(text)
                else:
                    values[name] = text
            rows.append(KernelSample(**values))
    return rows


def compare(args: argparse.Namespace) -> None:
    import polars as pl

    from optimizer.records import OpKind

    samples = _load_samples(Path(args.csv))
    tables = Path(args.tables)
    gemm = pl.read_parquet(next(tables.glob("gemm/vllm/*/gemm_perf.parquet")))
    gemm = gemm.filter(pl.col("gemm_dtype").is_in(["bfloat16", "fp8"]))
    gemm_ms = {
        (d, m, n, k): lat
        for d, m, n, k, lat in gemm.group_by("gemm_dtype", "m", "n", "k")
        .agg(pl.col("latency").median())
        .iter_rows()
    }
    attn = {}
    for name, op in (("context", OpKind.PREFILL_ATTN), ("generation", OpKind.DECODE_ATTN)):
        df = pl.read_parquet(next(tables.glob(f"attention/vllm/*/{name}_attention_perf.parquet")))
        df = df.filter(
            pl.col("kv_cache_dtype") == "bfloat16",
            pl.col("window_size") == 0,
            pl.col("beam_width") == 1,
        )
        for b, isl, step, heads, kv_heads, d, lat in df.select(
            "batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim", "latency"
        ).iter_rows():
            attn[(op, heads, kv_heads, d, b, isl, isl + step)] = lat
    ratios: dict[tuple[str, str, int], list[float]] = {}
    points: list[tuple[str, str, int, str, float, float]] = []
    for s in samples:
        if s.n and s.k and s.op is not OpKind.EMBEDDING:
            table_ms = gemm_ms.get((s.dtype, s.num_tokens, s.n, s.k))
            where = f"m={s.num_tokens} n={s.n} k={s.k}"
        elif s.op in (OpKind.PREFILL_ATTN, OpKind.DECODE_ATTN):
            key = (s.op, s.num_heads, s.num_kv_heads, s.head_dim, s.batch_size, s.q_len, s.kv_len)
            table_ms = attn.get(key)
            heads = f"{s.num_heads}/{s.num_kv_heads}"
            where = f"b={s.batch_size} q={s.q_len} kv={s.kv_len} heads={heads}"
        else:
            continue
        if table_ms is None:
            continue
        ratio = s.median_ms / table_ms
        ratios.setdefault((str(s.op), s.dtype, s.tp), []).append(ratio)
        points.append((str(s.op), s.dtype, s.tp, where, s.median_ms, table_ms))
    lines = [
        "| op | dtype | tp | points | median ours/table | p10 | p90 |",
        "|---|---|---|---|---|---|---|",
    ]
    for (op, dtype, tp), values in sorted(ratios.items()):
        values.sort()
        p10 = values[int(0.1 * (len(values) - 1))]
        p90 = values[int(0.9 * (len(values) - 1))]
        lines.append(
            f"| {op} | {dtype} | {tp} | {len(values)} | {statistics.median(values):.2f} "
            f"| {p10:.2f} | {p90:.2f} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.points:
        for op, dtype, tp, where, ours, table in points:
            print(f"{op:<14} {dtype:<9} tp={tp} {where:<44} {ours:9.4f} vs {table:9.4f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="profile on the GPU (writes <model>.csv and .json)")
    m.add_argument("--out", required=True)
    m.add_argument("--model", default="llama-3.1-8b")
    m.add_argument("--device", default="cuda")
    m.add_argument("--budget-s", type=float, default=360.0, help="start no phase after this")
    c = sub.add_parser("compare", help="ours / AIConfigurator per operator (no GPU)")
    c.add_argument("csv")
    c.add_argument("--tables", default="../shared/data/profiles/aiconfigurator/h200_sxm")
    c.add_argument("--points", action="store_true", help="print every matched point")
    args = parser.parse_args()
    if args.command == "measure":
        measure(args)
    else:
        compare(args)


if __name__ == "__main__":
    sys.exit(main())
