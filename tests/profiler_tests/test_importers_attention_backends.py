"""AIConfigurator attention tables with several backends per shape: one row per shape,
the backend the engine runs by default (SGLang's Blackwell tables)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from optimizer.records import OpKind
from profiler.importers.aiconfigurator import _attention_samples


def _table(path: Path) -> Path:
    """Two decode shapes: the first timed by triton, trtllm_mha and flashinfer, the second
    by triton only."""
    rows = {
        "kernel_source": ["triton", "trtllm_mha", "flashinfer", "triton"],
        "batch_size": [8, 8, 8, 16],
        "isl": [1, 1, 1, 1],
        "num_heads": [32, 32, 32, 32],
        "num_key_value_heads": [8, 8, 8, 8],
        "head_dim": [128, 128, 128, 128],
        "beam_width": [1, 1, 1, 1],
        "attn_dtype": ["bfloat16"] * 4,
        "kv_cache_dtype": ["bfloat16"] * 4,
        "step": [1024, 1024, 1024, 1024],
        "window_size": [0, 0, 0, 0],
        "latency": [0.30, 0.10, 0.20, 0.50],
    }
    pl.DataFrame(rows).write_parquet(path)
    return path


def test_sglang_keeps_its_default_backend_per_shape(tmp_path: Path) -> None:
    path = _table(tmp_path / "generation_attention_perf.parquet")
    sglang = _attention_samples(path, OpKind.DECODE_ATTN, "sglang")
    assert sorted((s.batch_size, s.median_ms) for s in sglang) == [(8, 0.10), (16, 0.50)]
    # vLLM's tables hold one kernel per shape: nothing is chosen there
    assert len(_attention_samples(path, OpKind.DECODE_ATTN, "vllm")) == 4
