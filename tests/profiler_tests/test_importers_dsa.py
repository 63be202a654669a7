"""AIConfigurator's vLLM DSA decode module table (`sparse_attention/vllm/<ver>/
dsa_generation_module_perf.parquet`): which rows come in and how they map onto
KernelSamples, on a tiny hand-written table."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from optimizer.records import OpKind
from profiler.importers._common import ProfileImportError
from profiler.importers.aiconfigurator_dsa import dsa_samples


def _row(b: int, step: int, latency: float, **over: object) -> dict:
    row = {
        "framework": "VLLM",
        "version": "0.24.0",
        "device": "NVIDIA H100 80GB HBM3",
        "op_name": "dsa_generation_module",
        "kernel_source": "FLASHMLA_SPARSE",
        "model": "zai-org/GLM-5",
        "architecture": "GlmMoeDsaForCausalLM",
        "mla_dtype": "bfloat16",
        "kv_cache_dtype": "bfloat16",
        "gemm_type": "fp8_block",
        "num_heads": 8,
        "batch_size": b,
        "isl": 1,
        "tp_size": 1,
        "step": step,
        "latency": latency,
    }
    return row | over


def _write(tmp_path: Path, rows: list[dict]) -> Path:
    folder = tmp_path / "h100_sxm"
    table = folder / "sparse_attention" / "vllm" / "0.24.0"
    table.mkdir(parents=True)
    pl.DataFrame(rows).write_parquet(table / "dsa_generation_module_perf.parquet")
    return folder


def test_the_importer_maps_a_row_onto_the_measured_layers_dims(tmp_path: Path) -> None:
    """GLM-5, 4 sequences over 1,000 keys, FP8 block weights, a 16-bit cache -> dsa_decode
    of dtype "fp8", kv_len 1,000, n = kv_lora_rank 512, k = hidden 6144, head_dim = 192 +
    64; an FP8 cache -> dsa_decode_fp8kv; V3.2 -> k 7168, head_dim 192. Dropped: another
    model, a TP-2 row, fp8 queries."""
    rows = [
        _row(4, 1000, 0.2),
        _row(4, 1000, 0.18, kv_cache_dtype="fp8"),
        _row(2, 64, 0.15, model="deepseek-ai/DeepSeek-V3.2", gemm_type="bfloat16"),
        _row(4, 1000, 0.2, model="deepseek-ai/DeepSeek-V3"),
        _row(4, 1000, 0.2, tp_size=2),
        _row(4, 1000, 0.2, mla_dtype="fp8"),
    ]
    glm, glm_fp8kv, v32 = dsa_samples(_write(tmp_path, rows))
    assert (glm.op, glm.dtype, glm.median_ms) == (OpKind.DSA_DECODE, "fp8", 0.2)
    assert (glm.batch_size, glm.num_tokens, glm.q_len, glm.kv_len) == (4, 4, 1, 1000)
    assert (glm.num_heads, glm.n, glm.k, glm.head_dim) == (8, 512, 6144, 256)
    assert (glm_fp8kv.op, glm_fp8kv.median_ms) == (OpKind.DSA_DECODE_FP8KV, 0.18)
    assert (v32.op, v32.dtype, v32.k, v32.head_dim, v32.kv_len) == (
        OpKind.DSA_DECODE,
        "bfloat16",
        7168,
        192,
        64,
    )


def test_a_key_measured_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProfileImportError, match="more than once"):
        dsa_samples(_write(tmp_path, [_row(4, 1000, 0.2), _row(4, 1000, 0.3)]))
