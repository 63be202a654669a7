"""Own CPU profile of the tiny shape: per-op hold-out and composed mixed iterations."""

from __future__ import annotations

import pytest

from optimizer.latency.evaluate import evaluate_mixed
from optimizer.latency.fit import fit_latency_model
from optimizer.latency.model import FitOptions
from optimizer.records import OpKind
from optimizer.shapes import get_shape


@pytest.mark.slow
def test_composed_prediction_of_measured_mixed_iterations() -> None:
    from profiler.sweep import ProfileGrid, run_sweep

    grid = ProfileGrid(
        num_tokens=(1, 4, 16, 32, 64, 128, 256, 512),
        tp_degrees=(1,),
        lm_head_rows=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        prefill_batch_sizes=(1,),
        prefill_chunk_lens=(16, 32, 64, 128, 256),
        prefill_context_lens=(0, 128),
        decode_batch_sizes=(1, 2, 4, 8, 16),
        decode_kv_lens=(32, 64, 128, 256),
        verify_batch_sizes=(1,),
        verify_k_values=(1,),
        verify_kv_lens=(64,),
        mixed_chunk_lens=(0, 16, 64, 128),
        mixed_num_decodes=(0, 2, 8),
        mixed_decode_kv_lens=(64, 256),
        warmup=1,
        repeats=7,
        min_repeats=5,
        max_case_s=0.05,
    )
    shape = get_shape("tiny")
    samples = run_sweep(shape, grid, "cpu")
    mixed = [s for s in samples if s.op is OpKind.MIXED_ITERATION]
    assert len(mixed) >= 10
    model = fit_latency_model(samples, accelerator="cpu", options=FitOptions(max_iter=100))
    assert model.overhead_s is not None and model.num_mixed == len(mixed)
    acc = evaluate_mixed(model, shape, mixed)
    assert acc.num_test > 0 and acc.median_ape <= 15.0, f"median APE {acc.median_ape:.1f}%"
