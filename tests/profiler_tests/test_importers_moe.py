"""AIConfigurator's MoE tables: which rows come in, how they map onto KernelSamples."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from optimizer.records import OpKind
from profiler.importers import ProfileImportError
from profiler.importers.aiconfigurator_moe import moe_a2a_samples, moe_samples

pytestmark = pytest.mark.shared_data


def _folder(shared_data: Path, gpu: str) -> Path:
    return shared_data / "profiles" / "aiconfigurator" / gpu


def test_b300_moe_rows_keep_aiconfigurators_routing_and_the_supported_formats(
    shared_data,
) -> None:
    samples = moe_samples(_folder(shared_data, "b300_sxm"))
    formats = Counter(s.dtype for s in samples)
    # per-tensor fp8, w4a8_mxfp4_mxfp8, Kimi's MXFP4 Marlin rows and the other two routing
    # distributions (balanced, power_law_1.2) dropped: fp8_block as "fp8", power_law_1.01
    assert formats == {"fp4": 5292, "bfloat16": 4678, "fp8": 5076, "mxfp4": 648, "int4": 351}
    deepseek = [s for s in samples if s.dtype == "fp8" and (s.k, s.num_heads) == (7168, 256)]
    assert deepseek  # DeepSeek-V3's experts are measured in their own (block) format
    row = next(
        s for s in samples
        if s.dtype == "bfloat16" and (s.num_tokens, s.k, s.n, s.batch_size, s.num_heads)
        == (16384, 2048, 512, 8, 256) and (s.tp, s.num_gpus) == (1, 256)
    )  # fmt: skip
    assert row.median_ms == pytest.approx(0.113126, rel=1e-5)  # the power_law_1.01 row
    keys = Counter((s.dtype, s.num_tokens, s.n, s.k, s.batch_size, s.num_heads, s.tp,
                    s.num_gpus) for s in samples)  # fmt: skip
    assert max(keys.values()) == 1  # one kernel per row key


def test_other_routings_are_there_for_comparisons_only(shared_data) -> None:
    folder = _folder(shared_data, "b300_sxm")
    skewed = moe_samples(folder, "power_law_1.2")
    assert skewed and len(skewed) != len(moe_samples(folder))
    # A100's vLLM 0.14 table measured skewed routing only: the default brings it in.
    assert moe_samples(folder.parent / "a100_sxm", "balanced") == []
    assert len(moe_samples(folder.parent / "a100_sxm")) == 3180
    with pytest.raises(ProfileImportError, match="distribution"):
        moe_samples(folder, "zipf")


def test_deepep_rows_take_the_faster_backend_in_ms(shared_data) -> None:
    folder = _folder(shared_data, "h100_sxm")
    samples = moe_a2a_samples(folder)
    assert Counter(s.op for s in samples) == {OpKind.MOE_DISPATCH: 132, OpKind.MOE_COMBINE: 132}
    assert {s.num_gpus for s in samples} == {8}
    raw = pl.read_parquet(folder / "comm" / "vllm" / "0.24.0" / "moe_a2a_perf.parquet").filter(
        pl.col("phase") == "dispatch", pl.col("hidden_size") == 7168, pl.col("topk") == 8,
        pl.col("num_experts") == 256, pl.col("num_tokens") == 128,
        pl.col("comm_backend").is_in(["deepep_ht", "deepep_ll"]),
    )  # fmt: skip
    mine = [s for s in samples if s.op is OpKind.MOE_DISPATCH and (s.k, s.batch_size,
            s.num_heads, s.num_tokens) == (7168, 8, 256, 128)]  # fmt: skip
    assert len(mine) == 1 and mine[0].median_ms == pytest.approx(raw["latency"].min() / 1e3)


def test_a_folder_without_moe_tables_brings_none(tmp_path: Path) -> None:
    assert moe_samples(tmp_path) == [] and moe_a2a_samples(tmp_path) == []
