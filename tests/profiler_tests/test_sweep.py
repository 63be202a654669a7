"""Grids, the sweep of the tiny shape on CPU, and whole mixed iterations."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import pytest
import torch

from optimizer.records import OpKind
from optimizer.shapes import GatedDeltaNetSpec, get_shape
from profiler.mixed import build_forward, measure_mixed_iteration
from profiler.sweep import (
    ProfileGrid,
    default_cpu_grid,
    default_gpu_grid,
    load_grid,
    plan_cases,
    quick_grid,
    run_sweep,
)
from profiler.timing import TimingConfig

TINY = get_shape("tiny")
FAST = TimingConfig(warmup=0, repeats=2, min_repeats=1, max_seconds=0.01)


def tiny_grid() -> ProfileGrid:
    return ProfileGrid(
        num_tokens=(2, 8),
        tp_degrees=(1, 2),
        lm_head_rows=(1, 3),
        prefill_batch_sizes=(1,),
        prefill_chunk_lens=(4,),
        prefill_context_lens=(0, 8),
        decode_batch_sizes=(2,),
        decode_kv_lens=(16,),
        verify_batch_sizes=(1,),
        verify_k_values=(2, 20),  # K=20 needs kv >= 21: skipped at kv 16
        verify_kv_lens=(16,),
        mixed_chunk_lens=(0, 4),
        mixed_num_decodes=(0, 2),
        mixed_decode_kv_lens=(16,),
        warmup=0,
        repeats=2,
        min_repeats=1,
        max_case_s=0.01,
    )


def test_plan_counts_by_hand() -> None:
    counts = Counter(c.op for c in plan_cases(TINY, tiny_grid()))
    # 2 token counts x 2 tp for sharded ops; norm/add only at tp 1.
    assert counts[OpKind.QKV_PROJ] == 4 and counts[OpKind.EMBEDDING] == 4
    assert counts[OpKind.NORM] == 2 and counts[OpKind.ADD] == 2
    assert counts[OpKind.LM_HEAD] == 4
    assert counts[OpKind.PREFILL_ATTN] == 4  # 2 contexts x 2 tp
    assert counts[OpKind.VERIFY_ATTN] == 2  # only K=2 fits kv 16
    # (chunk, decodes) in {(0,2), (4,0), (4,2)}; (0,0) is not an iteration.
    assert counts[OpKind.MIXED_ITERATION] == 3
    assert OpKind.GEMM not in counts and OpKind.ALL_REDUCE not in counts


def test_sweep_of_the_tiny_shape() -> None:
    seen: list[tuple[int, int, str]] = []
    samples = run_sweep(TINY, tiny_grid(), "cpu", progress=lambda *a: seen.append(a))
    total = len(plan_cases(TINY, tiny_grid()))
    assert len(samples) == total == len(seen)
    assert seen[-1][:2] == (total, total)
    for s in samples:
        assert 0 <= s.p10_ms <= s.median_ms <= s.p90_ms, s
        assert s.model == "tiny" and s.dtype == "float32" and s.num_repeats >= 1
    prefill = sorted((s.tp, s.kv_len) for s in samples if s.op is OpKind.PREFILL_ATTN)
    assert prefill == [(1, 4), (1, 12), (2, 4), (2, 12)]  # kv_len = context + chunk
    qkv = {(s.tp, s.num_tokens): (s.n, s.k) for s in samples if s.op is OpKind.QKV_PROJ}
    assert qkv == {(1, 2): (384, 256), (1, 8): (384, 256), (2, 2): (192, 256), (2, 8): (192, 256)}
    mixed = sorted(
        (s.q_len, s.batch_size, s.kv_len, s.num_tokens)
        for s in samples
        if s.op is OpKind.MIXED_ITERATION
    )
    assert mixed == [(0, 2, 16, 2), (4, 0, 0, 4), (4, 2, 16, 6)]


def test_sweep_restores_thread_count_and_subsets_ops() -> None:
    before = torch.get_num_threads()
    grid = ProfileGrid(**{**_fields(tiny_grid()), "ops": (OpKind.NORM,), "num_threads": 1})
    samples = run_sweep(TINY, grid, torch.device("cpu"))
    assert [s.op for s in samples] == [OpKind.NORM, OpKind.NORM]
    assert torch.get_num_threads() == before


def _fields(grid: ProfileGrid) -> dict:
    return {f: getattr(grid, f) for f in grid.__dataclass_fields__}


def test_sweep_rejects_a_tp_degree_that_does_not_fit() -> None:
    grid = ProfileGrid(**{**_fields(tiny_grid()), "tp_degrees": (1, 3)})
    with pytest.raises(ValueError, match="tp degree 3 does not fit shape tiny"):
        run_sweep(TINY, grid, "cpu")


def test_kv_cache_cap_by_hand() -> None:
    # tiny, one rank, one layer: 2 (K, V) x KV heads x 32 x 4 bytes = 512 B/token at tp 1,
    # 256 B at tp 2 (one KV head). Decode b=2, kv=16: 32 tokens -> 16,384 B or 8,192 B.
    only_decode = {**_fields(tiny_grid()), "ops": (OpKind.DECODE_ATTN,)}
    kept = plan_cases(TINY, ProfileGrid(**{**only_decode, "max_kv_cache_gb": 1.7e-5}))
    assert [c.tp for c in kept] == [1, 2]
    capped = plan_cases(TINY, ProfileGrid(**{**only_decode, "max_kv_cache_gb": 1.6e-5}))
    assert [c.tp for c in capped] == [2]
    # Mixed (2 decodes x kv 16, tp 1): 4 layers x 16,384 B = 65,536 B.
    mixed = {**_fields(tiny_grid()), "ops": (OpKind.MIXED_ITERATION,)}
    points = plan_cases(TINY, ProfileGrid(**{**mixed, "max_kv_cache_gb": 6.6e-5}))
    assert sorted((c.q_len, c.batch_size) for c in points) == [(0, 2), (4, 0), (4, 2)]
    points = plan_cases(TINY, ProfileGrid(**{**mixed, "max_kv_cache_gb": 6.5e-5}))
    assert sorted((c.q_len, c.batch_size) for c in points) == [(4, 0)]


def test_presets_are_valid_and_sized() -> None:
    assert len(plan_cases(TINY, quick_grid())) < 60
    assert 500 < len(plan_cases(TINY, default_cpu_grid())) < 1500
    big = plan_cases(get_shape("llama-3.1-8b"), default_gpu_grid())
    assert 1500 < len(big) < 5000


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"num_tokens": (0, 4)}, "num_tokens: expected integers >= 1"),
        ({"prefill_context_lens": (-1,)}, "prefill_context_lens: expected integers >= 0"),
        ({"min_repeats": 9, "repeats": 3}, "min_repeats 9 > repeats 3"),
        ({"ops": (OpKind.ALL_REDUCE,)}, "imported, not profiled"),
        ({"max_case_s": 0}, "max_case_s"),
        ({"max_kv_cache_gb": -1.0}, "max_kv_cache_gb must be a number > 0"),
    ],
)
def test_grid_validation(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ProfileGrid(**kw)


def test_load_grid_json_and_yaml(tmp_path) -> None:
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"num_tokens": [4, 8], "ops": ["norm", "mlp_up"], "repeats": 5}))
    grid = load_grid(path, base=quick_grid())
    assert grid.num_tokens == (4, 8) and grid.ops == (OpKind.NORM, OpKind.MLP_UP)
    assert grid.repeats == 5 and grid.decode_kv_lens == quick_grid().decode_kv_lens
    ypath = tmp_path / "g.yaml"
    ypath.write_text("tp_degrees: [1, 2, 4]\n")
    assert load_grid(ypath).tp_degrees == (1, 2, 4)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.json", '{"tokens": [1]}', "unknown grid keys \\['tokens'\\]"),
        ("a.json", "[1, 2]", "expected a mapping"),
        ("a.json", "{", "cannot read a profile grid"),
        ("a.yaml", "num_tokens: 4\n", "num_tokens: expected a list"),
        ("a.yaml", "ops: [matmul]\n", "grid ops"),
        ("a.toml", "", "unsupported extension"),
        ("a.yml", "num_tokens: [1, -2]\n", "expected integers >= 1"),
    ],
)
def test_load_grid_errors_name_the_file(tmp_path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as err:
        load_grid(path)
    assert str(path) in str(err.value)


def test_mixed_forward_output_and_record() -> None:
    forward = build_forward(
        TINY, chunk_len=5, num_decodes=3, decode_kv_len=12, device=torch.device("cpu")
    )
    with torch.inference_mode():
        logits = forward()
    assert logits.shape == (4, TINY.vocab_size)  # chunk's last row + 3 decodes
    assert torch.isfinite(logits).all()
    s = measure_mixed_iteration(TINY, 5, 3, 12, torch.device("cpu"), FAST)
    assert s.op is OpKind.MIXED_ITERATION
    assert (s.q_len, s.batch_size, s.kv_len, s.num_tokens, s.tp) == (5, 3, 12, 8, 1)
    assert 0 < s.p10_ms <= s.median_ms <= s.p90_ms
    only_decodes = build_forward(TINY, 0, 2, 4, torch.device("cpu"))
    with torch.inference_mode():
        assert only_decodes().shape == (2, TINY.vocab_size)


@pytest.mark.parametrize(
    ("chunk", "decodes", "kv", "message"),
    [(0, 0, 8, "need a prefill chunk"), (-1, 2, 8, "must be >= 0"), (4, 2, 0, "decode_kv_len")],
)
def test_mixed_rejects_bad_parameters(chunk: int, decodes: int, kv: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_forward(TINY, chunk, decodes, kv, torch.device("cpu"))


def test_whole_model_forwards_refuse_deltanet_layers_and_gated_attention() -> None:
    """The mixed iterations and the reference engine build every layer as ungated softmax
    attention: a Gated DeltaNet hybrid, or a gated attention alone, is refused by name."""
    from profiler.reference_engine.model import PagedTransformer

    gdn = GatedDeltaNetSpec(num_layers=2, num_key_heads=2, num_value_heads=4,
                            key_head_dim=16, value_head_dim=16)  # fmt: skip
    cpu = torch.device("cpu")
    for shape in (replace(TINY, gdn=gdn), replace(TINY, attn_output_gate=True)):
        with pytest.raises(ValueError, match=r"Gated DeltaNet .* not supported by the reference"):
            build_forward(shape, 4, 1, 8, cpu)
        with pytest.raises(ValueError, match=f"{shape.name}: Gated DeltaNet"):
            PagedTransformer(shape, num_blocks=4, block_size=16, device=cpu)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sweep_on_cuda() -> None:
    samples = run_sweep(TINY, tiny_grid(), "cuda")
    assert len(samples) == len(plan_cases(TINY, tiny_grid()))
    assert all(0 < s.p10_ms <= s.median_ms <= s.p90_ms for s in samples)
    bf16 = TINY.with_dtype("bfloat16")
    assert len(run_sweep(bf16, tiny_grid(), "cuda:0")) == len(samples)
