"""AIConfigurator's vLLM MLA module tables: which rows come in, how they map onto
KernelSamples."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from optimizer.records import OpKind
from profiler.importers import ImportFormat, import_profile
from profiler.importers.aiconfigurator_mla import mla_samples

pytestmark = pytest.mark.shared_data

_TABLES = Path("mla") / "vllm" / "0.24.0"


def _folder(shared_data: Path, gpu: str) -> Path:
    return shared_data / "profiles" / "aiconfigurator" / gpu


def test_h200_rows_per_op_and_weight_format_match_the_parquet(shared_data) -> None:
    folder = _folder(shared_data, "h200_sxm")
    samples = mla_samples(folder)
    counts = Counter((s.op, s.dtype) for s in samples)
    assert counts == {
        (OpKind.MLA_PREFILL, "bfloat16"): 976,
        (OpKind.MLA_PREFILL, "fp8"): 976,  # gemm_type fp8_block
        (OpKind.MLA_PREFILL_FP8KV, "bfloat16"): 967,
        (OpKind.MLA_PREFILL_FP8KV, "fp8"): 967,
        (OpKind.MLA_DECODE, "bfloat16"): 1472,
        (OpKind.MLA_DECODE, "fp8"): 1472,
        (OpKind.MLA_DECODE_FP8KV, "bfloat16"): 1472,
        (OpKind.MLA_DECODE_FP8KV, "fp8"): 1472,
    }
    # every row of the tables: Hopper has no opt-in FP8-query rows to drop
    context = pl.read_parquet(folder / _TABLES / "mla_context_module_perf.parquet")
    generation = pl.read_parquet(folder / _TABLES / "mla_generation_module_perf.parquet")
    assert len(samples) == context.height + generation.height


def test_a_decode_row_keeps_its_latency_and_per_gpu_heads(shared_data) -> None:
    samples = mla_samples(_folder(shared_data, "h200_sxm"))
    (row,) = [
        s for s in samples
        if s.op is OpKind.MLA_DECODE_FP8KV and s.dtype == "fp8"
        and (s.num_heads, s.batch_size, s.kv_len) == (16, 32, 2048)
    ]  # fmt: skip
    assert row.median_ms == row.p10_ms == row.p90_ms == pytest.approx(0.1334)  # FLASHMLA
    assert (row.q_len, row.num_tokens, row.tp) == (1, 32, 1)
    assert (row.n, row.k, row.head_dim) == (512, 7168, 192)  # DeepSeek-V3's MLA dims


def test_blackwell_keeps_default_queries_and_fp4_projections(shared_data) -> None:
    folder = _folder(shared_data, "b200_sxm")
    samples = mla_samples(folder)
    counts = Counter((s.op, s.dtype) for s in samples)
    formats = {"bfloat16", "fp8", "fp4"}
    for op, n in (
        (OpKind.MLA_PREFILL, 976),
        (OpKind.MLA_PREFILL_FP8KV, 976),
        (OpKind.MLA_DECODE, 1472),
        (OpKind.MLA_DECODE_FP8KV, 1472),
    ):
        assert {dtype: counts[op, dtype] for dtype in formats} == dict.fromkeys(formats, n)
    raw = pl.read_parquet(folder / _TABLES / "mla_context_module_perf.parquet")
    dropped = raw.filter(pl.col("mla_dtype") == "fp8")  # TRTLLM_RAGGED / FlashInfer opt-in
    assert dropped.height == 3 * (904 + 72)
    assert sum(n for (op, _), n in counts.items() if op in {OpKind.MLA_PREFILL,
               OpKind.MLA_PREFILL_FP8KV}) == raw.height - dropped.height  # fmt: skip
    # the default FlashAttention prefill, not the FP8-query TRTLLM_RAGGED row (0.3363 ms)
    (row,) = [
        s for s in samples
        if s.op is OpKind.MLA_PREFILL_FP8KV and s.dtype == "fp8"
        and (s.num_heads, s.batch_size, s.q_len) == (16, 1, 4096)
    ]  # fmt: skip
    assert row.median_ms == pytest.approx(0.2779)
    assert (row.kv_len, row.num_tokens) == (4096, 4096)
    keys = Counter((s.op, s.dtype, s.num_heads, s.batch_size, s.q_len, s.kv_len) for s in samples)
    assert max(keys.values()) == 1  # one kernel per row key


def test_the_gpu_folder_import_brings_the_mla_rows_in(shared_data) -> None:
    folder = _folder(shared_data, "h100_sxm")
    imported = import_profile(folder, ImportFormat.AICONFIGURATOR).samples
    mla = [s for s in imported if s.op.value.startswith("mla_")]
    assert len(mla) == len(mla_samples(folder)) == 976 * 2 + 967 * 2 + 1448 * 2 + 1472 * 2
