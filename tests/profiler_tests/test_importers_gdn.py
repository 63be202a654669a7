"""AIConfigurator's Gated DeltaNet tables (`linear_attention/<engine>/<ver>/gdn_perf.parquet`):
which rows come in and how a row key's kernels map onto one KernelSample, on tiny
hand-written tables; then the installed package's H100 vLLM table."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from optimizer.hardware import get_accelerator
from optimizer.latency import fit_latency_model, gdn
from optimizer.latency.compose import Pricing
from optimizer.latency.roofline import RooflinePricer
from optimizer.records import OpKind
from optimizer.shapes import get_shape
from profiler.importers._common import ProfileImportError
from profiler.importers.aiconfigurator_gdn import GDN_KERNELS, gdn_samples

CONV, RULE = GDN_KERNELS["vllm"]["context"]
UPDATE, STEP = GDN_KERNELS["vllm"]["generation"]


def _row(kernel: str, phase: str, b: int, s: int, latency: float, **over: object) -> dict:
    row = {
        "framework": "vLLM",
        "version": "0.24.0",
        "device": "NVIDIA H100 80GB HBM3",
        "op_name": "gdn",
        "kernel_source": kernel,
        "phase": phase,
        "batch_size": b,
        "seq_len": s,
        "num_tokens": b * s,
        "d_model": 3072,
        "d_conv": 4,
        "num_k_heads": 4,
        "head_k_dim": 128,
        "num_v_heads": 16,
        "head_v_dim": 128,
        "model_name": "Qwen/Qwen3.5-122B-A10B",
        "latency": latency,
    }
    return row | over


def _write(tmp_path: Path, rows: list[dict], engine: str = "vllm", ver: str = "0.24.0") -> Path:
    folder = tmp_path / "h100_sxm"
    table = folder / "linear_attention" / engine / ver
    table.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).write_parquet(table / "gdn_perf.parquet")
    return folder


def test_a_keys_kernels_sum_into_one_sample_with_the_heads_mapped(tmp_path: Path) -> None:
    """Context b=2 x s=64: conv 0.002 + delta rule 0.010 = 0.012 ms, num_tokens 128, q_len
    64; generation b=4: conv update 0.001 + recurrent step 0.003 = 0.004 ms, q_len 1,
    num_tokens 4. Heads: value 16 -> num_heads, key 4 -> num_kv_heads, head_k_dim 128 ->
    head_dim, head_v_dim 128 -> n, d_model 3072 -> k. Dropped: a generation key without its
    recurrent step (b=8), a conv of 3, a zero latency."""
    rows = [
        _row(CONV, "context", 2, 64, 0.002),
        _row(RULE, "context", 2, 64, 0.010),
        _row(UPDATE, "generation", 4, 1, 0.001),
        _row(STEP, "generation", 4, 1, 0.003),
        _row(UPDATE, "generation", 8, 1, 0.001),  # its recurrent step is missing
        _row(CONV, "context", 1, 16, 0.002, d_conv=3),
        _row(RULE, "context", 1, 16, 0.009, d_conv=3),
        _row(CONV, "context", 1, 32, 0.0),
        _row(RULE, "context", 1, 32, 0.009),
    ]
    prefill, decode = gdn_samples(_write(tmp_path, rows))
    assert prefill.op is OpKind.GDN_PREFILL and decode.op is OpKind.GDN_DECODE
    assert prefill.median_ms == pytest.approx(0.012) == prefill.p10_ms == prefill.p90_ms
    assert (prefill.batch_size, prefill.q_len, prefill.num_tokens) == (2, 64, 128)
    assert decode.median_ms == pytest.approx(0.004)
    assert (decode.batch_size, decode.q_len, decode.num_tokens) == (4, 1, 4)
    for s in (prefill, decode):
        assert (s.num_heads, s.num_kv_heads, s.head_dim, s.n, s.k) == (16, 4, 128, 128, 3072)
        assert (s.dtype, s.model, s.kv_len) == ("bfloat16", "", 0)


def test_sglang_names_its_delta_rule_and_the_newest_version_is_read(tmp_path: Path) -> None:
    """SGLang's table names FLA's `chunk_gated_delta_rule` (vLLM's FlashInfer one would be
    ignored there); of two version folders the newer is read; TensorRT-LLM: none."""
    rows = [
        _row(CONV, "context", 1, 128, 0.002),
        _row("chunk_gated_delta_rule", "context", 1, 128, 0.020),
        _row(RULE, "context", 1, 128, 9.0),  # not SGLang's kernel
    ]
    _write(tmp_path, [_row(CONV, "context", 1, 128, 5.0)], "sglang", "0.5.9")
    folder = _write(tmp_path, rows, "sglang", "0.5.14")
    (sample,) = gdn_samples(folder, "sglang")
    assert sample.median_ms == pytest.approx(0.022)
    assert gdn_samples(folder, "trtllm") == [] and gdn_samples(folder) == []


def test_a_kernel_measured_twice_for_one_key_is_refused(tmp_path: Path) -> None:
    rows = [_row(CONV, "context", 1, 8, 0.002), _row(CONV, "context", 1, 8, 0.003)]
    rows.append(_row(RULE, "context", 1, 8, 0.01))
    with pytest.raises(ProfileImportError, match="more than once"):
        gdn_samples(_write(tmp_path, rows))


def test_the_installed_h100_vllm_table_imports_fits_and_prices_the_397b(aic_package) -> None:
    """aiconfigurator-core's H100 vLLM 0.24 table: every context key has both kernels
    (4,141 samples), decode 405 of 407 keys (two of the largest batches at 64 value heads
    lack their recurrent step). A sample is its key's two rows summed; fitted, the model
    reprices Qwen3.5-397B-A17B's chunks at TP 4 (4 key / 16 value heads) within 5% of the
    table inside the grid (q <= 32,768), and `gdn` labels only what lies beyond it."""
    folder = aic_package.folder("h100_sxm")
    samples = gdn_samples(folder)
    assert Counter(s.op for s in samples) == {OpKind.GDN_PREFILL: 4141, OpKind.GDN_DECODE: 405}
    table = pl.read_parquet(next((folder / "linear_attention" / "vllm").glob("*/gdn_perf.parquet")))
    key = (
        (pl.col("model_name") == "Qwen/Qwen3.5-397B-A17B")
        & (pl.col("num_k_heads") == 4)
        & (pl.col("batch_size") == 1)
        & (pl.col("phase") == "context")
    )
    by_q = table.filter(key).group_by("seq_len").agg(pl.col("latency").sum())
    want = dict(by_q.iter_rows())
    got = {
        s.q_len: s.median_ms
        for s in samples
        if s.op is OpKind.GDN_PREFILL
        and s.k == 4096
        and s.batch_size == 1
        and (s.num_kv_heads, s.num_heads) == (4, 16)
    }
    assert got == pytest.approx(want)
    model = fit_latency_model(samples, accelerator="h100", source="aic")
    pricing = Pricing(
        get_shape("qwen3.5-397b-a17b"), 4, RooflinePricer(get_accelerator("h100")), model
    )
    beyond = ("gdn_prefill:beyond_32768", "gdn_decode:beyond_1024", "gdn_state:float32")
    assert gdn.estimated(pricing) == beyond
    prefill = gdn.covering(pricing, OpKind.GDN_PREFILL)
    assert prefill is not None
    q = np.array([256.0, 2048.0, 8192.0])
    core = gdn.measured_core_ms(pricing, prefill[0], np.ones_like(q), q)
    assert core == pytest.approx([want[256], want[2048], want[8192]], rel=0.05)
