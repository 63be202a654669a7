"""Importers of AIConfigurator and Vidur tables: mapping, filters, errors."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from optimizer.records import OpKind
from profiler.importers import ImportFormat, ProfileImportError, import_profile

pytestmark = pytest.mark.shared_data


@pytest.fixture(scope="module")
def h100(shared_data: Path):
    return import_profile(
        shared_data / "profiles" / "aiconfigurator" / "h100_sxm", ImportFormat.AICONFIGURATOR
    )


def test_aiconfigurator_h100_ops_and_filters(h100) -> None:
    assert h100.source == "aiconfigurator"
    assert h100.accelerator == "h100"
    assert h100.device.kind == "imported" and "H100" in h100.device.name
    counts = Counter(s.op for s in h100.samples)
    assert set(counts) == {
        OpKind.GEMM, OpKind.PREFILL_ATTN, OpKind.DECODE_ATTN, OpKind.ALL_REDUCE,
        OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER, OpKind.VLLM_ALL_REDUCE,
        OpKind.VLLM_ALL_REDUCE_EAGER, OpKind.MOE,
        OpKind.MOE_DISPATCH, OpKind.MOE_COMBINE, OpKind.MLA_PREFILL, OpKind.MLA_DECODE,
        OpKind.MLA_PREFILL_FP8KV, OpKind.MLA_DECODE_FP8KV,
    }  # fmt: skip
    # vLLM's all-reduce: 23 message sizes at 2, 4 and 8 GPUs, in a CUDA graph and eagerly
    assert counts[OpKind.VLLM_ALL_REDUCE] == counts[OpKind.VLLM_ALL_REDUCE_EAGER] == 69
    small = [s for s in h100.samples if s.op is OpKind.VLLM_ALL_REDUCE and s.num_gpus == 2]
    assert min(small, key=lambda s: s.message_bytes).message_bytes == 256  # 128 bf16 values
    gemm = Counter(s.dtype for s in h100.samples if s.op is OpKind.GEMM)
    assert gemm == {"bfloat16": 35742, "fp8": 35742}  # fp8_block (35,704 rows) dropped
    assert all(s.median_ms > 0 for s in h100.samples)


def test_aiconfigurator_fp8_rows_keep_their_measurements(h100, shared_data: Path) -> None:
    """FP8 GEMMs (per-tensor scaled) come in as dtype "fp8", and so does attention over an
    FP8 KV cache (full attention only); each sample is its parquet row."""
    attn = Counter((s.op, s.dtype) for s in h100.samples if s.op is not OpKind.GEMM)
    assert attn[(OpKind.DECODE_ATTN, "fp8")] == 16129  # 30,683 with sliding windows
    assert attn[(OpKind.PREFILL_ATTN, "fp8")] == 13158
    assert attn[(OpKind.DECODE_ATTN, "bfloat16")] == 16929  # FA3 16,129 + FA4 800
    root = shared_data / "profiles" / "aiconfigurator" / "h100_sxm"
    gemm = pl.read_parquet(root / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet")
    row = gemm.filter(
        pl.col("gemm_dtype") == "fp8", pl.col("m") == 8192, pl.col("n") == 8192, pl.col("k") == 8192
    )
    assert row["kernel_source"].to_list() == ["CutlassFP8ScaledMMLinearKernel"]
    fp8 = [
        s
        for s in h100.samples
        if s.op is OpKind.GEMM and s.dtype == "fp8" and (s.num_tokens, s.n, s.k) == (8192,) * 3
    ]
    assert [s.median_ms for s in fp8] == row["latency"].to_list()
    gen = pl.read_parquet(
        root / "attention" / "vllm" / "0.24.0" / "generation_attention_perf.parquet"
    ).filter(
        pl.col("kv_cache_dtype") == "fp8",
        pl.col("window_size") == 0,
        pl.col("batch_size") == 16,
        pl.col("step") == 32767,
        pl.col("num_heads") == 32,
        pl.col("num_key_value_heads") == 8,
        pl.col("head_dim") == 128,
    )
    decode = [
        s
        for s in h100.samples
        if s.op is OpKind.DECODE_ATTN
        and s.dtype == "fp8"
        and (s.batch_size, s.kv_len, s.num_heads, s.num_kv_heads, s.head_dim)
        == (16, 32768, 32, 8, 128)
    ]
    assert gen.height == 1 and [s.median_ms for s in decode] == gen["latency"].to_list()
    assert all(s.q_len == 1 for s in decode)


def test_aiconfigurator_attention_mapping(h100) -> None:
    decode = [s for s in h100.samples if s.op is OpKind.DECODE_ATTN]
    prefill = [s for s in h100.samples if s.op is OpKind.PREFILL_ATTN]
    assert all(s.q_len == 1 and s.kv_len >= 2 for s in decode)  # kv = isl + step
    assert all(s.kv_len == s.q_len for s in prefill)  # no cached prefix in these tables
    assert {s.head_dim for s in decode} >= {64, 128}
    # 8B-like per-GPU heads are present for both phases
    assert any(s.num_heads == 32 and s.num_kv_heads == 8 and s.head_dim == 128 for s in prefill)


@pytest.mark.parametrize("op", [OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER])
def test_aiconfigurator_nccl_bytes(h100, op: OpKind) -> None:
    ar = [s for s in h100.samples if s.op is op]
    assert {s.num_gpus for s in ar} == {2, 4, 8}
    assert min(s.message_bytes for s in ar) >= 512  # message_size elements x 2 bytes
    assert all(s.dtype == "float16" and s.tp == s.num_gpus for s in ar)


def test_aiconfigurator_a100_without_window_column(shared_data: Path) -> None:
    p = import_profile(
        shared_data / "profiles" / "aiconfigurator" / "a100_sxm", ImportFormat.AICONFIGURATOR
    )
    assert p.accelerator == "a100"
    assert Counter(s.op for s in p.samples)[OpKind.DECODE_ATTN] > 1000
    assert not [s for s in p.samples if s.dtype == "fp8"]  # A100: no FP8 rows measured


def test_vidur_mlp_shapes(shared_data: Path) -> None:
    path = shared_data / "profiles" / "vidur" / "compute" / "h100" / "meta-llama" / "Llama-2-7b-hf"
    p = import_profile(path, ImportFormat.VIDUR)
    assert p.source == "vidur" and p.accelerator == "h100"
    qkv = [s for s in p.samples if s.op is OpKind.QKV_PROJ and s.tp == 2]
    assert qkv and all(s.n == 3 * 4096 // 2 and s.k == 4096 for s in qkv)
    up = next(s for s in p.samples if s.op is OpKind.MLP_UP and s.tp == 4)
    assert (up.n, up.k) == (2 * 11008 // 4, 4096)
    down = next(s for s in p.samples if s.op is OpKind.MLP_DOWN and s.tp == 1)
    assert (down.n, down.k) == (4096, 11008)
    assert {s.model for s in p.samples} == {"llama-2-7b"}
    assert all(s.dtype == "float16" and s.p10_ms <= s.median_ms <= s.p90_ms for s in p.samples)


def test_vidur_attention_and_network(shared_data: Path) -> None:
    vidur = shared_data / "profiles" / "vidur"
    attn = import_profile(
        vidur / "compute" / "a100" / "meta-llama" / "Llama-2-70b-hf" / "attention.csv",
        ImportFormat.VIDUR,
    )
    pre = [s for s in attn.samples if s.op is OpKind.PREFILL_ATTN]
    dec = [s for s in attn.samples if s.op is OpKind.DECODE_ATTN]
    assert pre and dec
    assert all(s.kv_len >= s.q_len > 0 for s in pre)
    assert any(s.kv_len > s.q_len for s in pre)  # chunks over a cached prefix
    assert all(s.num_heads == 32 and s.num_kv_heads == 4 and s.tp == 2 for s in dec)
    net = import_profile(vidur / "network" / "h100_dgx" / "all_reduce.csv", ImportFormat.VIDUR)
    assert {s.num_gpus for s in net.samples} == {2, 4, 8}


def test_errors(shared_data: Path, tmp_path: Path) -> None:
    with pytest.raises(ProfileImportError, match="no such file"):
        import_profile(tmp_path / "absent", ImportFormat.VIDUR)
    with pytest.raises(ProfileImportError, match="several accelerators"):
        import_profile(shared_data / "profiles" / "vidur", ImportFormat.VIDUR)
    with pytest.raises(ProfileImportError, match=r"gemm_perf\.parquet"):
        import_profile(tmp_path, ImportFormat.AICONFIGURATOR, gpu="h100")
    bad = tmp_path / "x100" / "gemm" / "vllm" / "1.0"
    bad.mkdir(parents=True)
    pl.DataFrame({"m": [1], "n": [2]}).write_parquet(bad / "gemm_perf.parquet")
    with pytest.raises(ProfileImportError, match="infer the accelerator"):
        import_profile(tmp_path / "x100", ImportFormat.AICONFIGURATOR)
    with pytest.raises(ProfileImportError, match=r"missing columns \['gemm_dtype'"):
        import_profile(tmp_path / "x100", ImportFormat.AICONFIGURATOR, gpu="h100")
    (tmp_path / "notes.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ProfileImportError, match="not a Vidur profile"):
        import_profile(tmp_path / "notes.csv", ImportFormat.VIDUR, gpu="h100")
    mlp = tmp_path / "h100" / "mlp.csv"
    mlp.parent.mkdir()
    mlp.write_text("num_tokens,n_head\n1,2\n")
    with pytest.raises(ProfileImportError, match="missing columns"):
        import_profile(mlp, ImportFormat.VIDUR)


def test_importers_do_not_import_torch() -> None:
    code = (
        "import sys, profiler.importers.aiconfigurator, profiler.importers.vidur, "
        "optimizer.latency\nassert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_gpu_names_only_files_whose_path_names_none(shared_data: Path, tmp_path: Path) -> None:
    """`--gpu a100` on a folder holding h100 and a100 files used to store the H100 files as
    a100; the path's own GPU wins, and mixing accelerators is refused, naming the files."""
    import shutil

    compute = shared_data / "profiles" / "vidur" / "compute"
    with pytest.raises(ProfileImportError) as info:
        import_profile(compute, ImportFormat.VIDUR, gpu="a100")
    message = str(info.value)
    assert "files of several accelerators" in message
    assert "a100: " in message and "h100: " in message
    assert str(compute / "h100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv") in message
    # A path naming its GPU keeps it, whatever --gpu says.
    h100 = compute / "h100" / "meta-llama" / "Llama-2-7b-hf"
    assert import_profile(h100, ImportFormat.VIDUR, gpu="a100").accelerator == "h100"
    # A path naming none takes --gpu.
    anon = tmp_path / "mine" / "meta-llama" / "Llama-2-7b-hf"
    anon.mkdir(parents=True)
    shutil.copy(h100 / "mlp.csv", anon / "mlp.csv")
    assert import_profile(anon, ImportFormat.VIDUR, gpu="a100").accelerator == "a100"
    with pytest.raises(ProfileImportError, match="cannot infer the accelerator"):
        import_profile(anon, ImportFormat.VIDUR)
