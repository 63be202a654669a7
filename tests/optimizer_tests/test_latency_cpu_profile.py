"""Own CPU profile of the tiny shape: per-op hold-out and composed mixed iterations."""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.latency.compose import Pricing, fit_overhead_s, iteration_ms
from optimizer.latency.model import FitOptions, fit_latency_model
from optimizer.latency.roofline import RooflinePricer
from profiler.hardware import get_accelerator
from profiler.shapes import get_shape
from storage.records import KernelSample, OpKind


def mixed_load(s: KernelSample):
    """A MIXED_ITERATION sample (see profiler.mixed) as the StepLoad it measured."""
    from optimizer.latency import StepLoad

    chunk, decodes = s.q_len, s.batch_size
    return StepLoad(
        num_tokens=chunk + decodes,
        num_logits=decodes + (1 if chunk else 0),
        prefill_q=(chunk,) if chunk else (),
        prefill_kv=(chunk,) if chunk else (),
        num_decode_seqs=decodes,
        decode_kv_tokens=decodes * s.kv_len,
    )


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
    pricing = Pricing(shape, 1, RooflinePricer(get_accelerator("cpu")), model)
    loads = [mixed_load(s) for s in mixed]
    half = len(mixed) // 2
    overhead = fit_overhead_s(pricing, loads[::2], [s.median_ms / 1e3 for s in mixed[::2]])
    pred = np.array([iteration_ms(pricing, ld, overhead) for ld in loads[1::2]])
    true = np.array([s.median_ms for s in mixed[1::2]])
    ape = np.abs(pred / true - 1.0) * 100
    assert half > 0 and np.median(ape) <= 15.0, f"median APE {np.median(ape):.1f}%"
