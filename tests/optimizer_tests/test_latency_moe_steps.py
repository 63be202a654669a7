"""The MoE per-step check (benchmarks/bench_moe_steps.py prints it for every folder): the
B300 tables, imported as `servetune profile import` does and fitted, price the steps of
vLLM 0.20.1 serving Qwen3.6-35B-A3B (the preset: 30 Gated DeltaNet and 10 full-attention
layers) at TP 2 with expert parallelism, and the fused MoE op is priced by its learned
model (not the roofline)."""

from __future__ import annotations

import pytest

from optimizer.engines import EngineRelease
from optimizer.latency import TableReach, build_catalog, fit_latency_model
from optimizer.latency.model import FitOptions
from optimizer.parallel import ExpertLayout
from optimizer.shapes import DEFAULT_PRECISION, get_shape
from optimizer.validation.forward_passes import (
    StepPhase,
    phase_errors,
    price_step_s,
    read_forward_pass_metrics,
)


@pytest.mark.shared_data
def test_b300_tables_price_the_moe_steps_within_the_measured_bounds(shared_data) -> None:
    """Measured (power_law_1.01 routing, the import's): prefill 5.7%, decode 13.1%, mixed
    11.0% median |error|. Prefill and mixed steps are bound by the host's launches outside
    CUDA graphs (the Gated DeltaNet core runs eagerly; above 512 tokens every kernel
    does): without that floor they were 66.9% and 40.7%. The bounds keep what the code
    meets so that a regression shows (balanced routing gave decode 28.7%)."""
    from profiler.importers import ImportFormat, import_profile

    folder = shared_data / "profiles" / "aiconfigurator" / "b300_sxm"
    samples = import_profile(folder, ImportFormat.AICONFIGURATOR).samples
    model = fit_latency_model(samples, accelerator="b300", options=FitOptions(max_iter=100))
    assert {"moe", "moe:fp8", "moe:fp4", "moe_dispatch", "gemm:fp4"} <= set(model.op_names())
    table = build_catalog(get_shape("qwen3.6-35b-a3b"), [model]).for_instance(
        "b300", 2, TableReach(8192, 256, 8192, 32768), DEFAULT_PRECISION,
        engine=EngineRelease("vllm", "0.20.1"), layout=ExpertLayout(1, True),
    )  # fmt: skip
    assert table.layout == "dp1-ep" and not {"moe", "gemm"} & set(table.estimated_ops)
    run = shared_data / "observations" / "aic-fpm-b300"
    run = run / "fpm_upfront_qwen36_moe_full_once_20260613_201336" / "tp2_ep2_past4096"
    steps = read_forward_pass_metrics(run / "fpm_metrics_detail.csv")
    errors = {e.phase: e for e in phase_errors(steps, lambda s: price_step_s(table, s))}
    assert set(errors) == set(StepPhase)
    bounds = {StepPhase.PREFILL: 0.07, StepPhase.DECODE: 0.14, StepPhase.MIXED: 0.12}
    for phase, e in errors.items():
        assert e.median_abs_error <= bounds[phase], (phase, e)
    assert table.host.eager_s > 0.03  # 1,573 launches at tp 2 (test_launches)
