"""The MoE per-step check (benchmarks/bench_moe_steps.py prints it for every folder): the
B300 tables, imported as `servetune profile import` does and fitted, price the steps of
vLLM 0.20.1 serving Qwen3.6-35B-A3B at TP 2 with expert parallelism, and the fused MoE
op is priced by its learned model (not the roofline)."""

from __future__ import annotations

import pytest

from optimizer.engines import EngineRelease
from optimizer.latency import TableReach, build_catalog, fit_latency_model
from optimizer.latency.model import FitOptions
from optimizer.parallel import ExpertLayout
from optimizer.shape_parts import MoESpec
from optimizer.shapes import DEFAULT_PRECISION, ModelShape
from optimizer.validation.forward_passes import (
    StepPhase,
    phase_errors,
    price_step_s,
    read_forward_pass_metrics,
)

# As stated in benchmarks/bench_moe_steps.py: its 30 Gated DeltaNet layers approximated as
# sliding-window attention over 512 keys.
QWEN36_MOE = ModelShape(
    "qwen3.6-35b-a3b-hybrid-approx", 40, 2048, 16, 2, 256, 512, 248320,
    moe=MoESpec(256, 8, 512, shared_intermediate_size=512),
    sliding_window=512, sliding_window_layers=30,
)  # fmt: skip


@pytest.mark.shared_data
def test_b300_tables_price_the_moe_steps_within_the_measured_bounds(shared_data) -> None:
    """Measured (power_law_1.01 routing, the import's): prefill 66.9%, decode 7.7%, mixed
    40.7% median |error|. Decode meets the 10% target; prefill and mixed are far from it:
    the Gated DeltaNet layers are not modelled (prefill and mixed steps cost 2-3x what is
    priced; see the benchmark). The bounds keep what the code meets so that a regression
    shows (balanced routing gave decode 28.7%)."""
    from profiler.importers import ImportFormat, import_profile

    folder = shared_data / "profiles" / "aiconfigurator" / "b300_sxm"
    samples = import_profile(folder, ImportFormat.AICONFIGURATOR).samples
    model = fit_latency_model(samples, accelerator="b300", options=FitOptions(max_iter=100))
    assert {"moe", "moe:fp8", "moe:fp4", "moe_dispatch", "gemm:fp4"} <= set(model.op_names())
    table = build_catalog(QWEN36_MOE, [model]).for_instance(
        "b300", 2, TableReach(8192, 256, 8192, 32768), DEFAULT_PRECISION,
        engine=EngineRelease("vllm", "0.20.1"), layout=ExpertLayout(1, True),
    )  # fmt: skip
    assert table.layout == "dp1-ep" and not {"moe", "gemm"} & set(table.estimated_ops)
    run = shared_data / "observations" / "aic-fpm-b300"
    run = run / "fpm_upfront_qwen36_moe_full_once_20260613_201336" / "tp2_ep2_past4096"
    steps = read_forward_pass_metrics(run / "fpm_metrics_detail.csv")
    errors = {e.phase: e for e in phase_errors(steps, lambda s: price_step_s(table, s))}
    assert set(errors) == set(StepPhase)
    bounds = {StepPhase.PREFILL: 0.70, StepPhase.DECODE: 0.10, StepPhase.MIXED: 0.43}
    for phase, e in errors.items():
        assert e.median_abs_error <= bounds[phase], (phase, e)
    assert errors[StepPhase.PREFILL].median_error < 0  # the unpriced DeltaNet layers
