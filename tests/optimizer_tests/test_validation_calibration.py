"""Calibration recovers a known per-step overhead and phase scales from synthetic observations."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from optimizer.config import InstanceConfig, ServingConfig
from optimizer.latency.base import StepLoad
from optimizer.sim import SLO, simulate
from optimizer.validation import (
    CalibratedSource,
    CalibratedStepLatency,
    Calibration,
    CalibrationCase,
    Metric,
    RequestOutcomes,
    ValidationError,
    compare,
    compare_observation,
    evaluate,
    fit_calibration,
)
from optimizer.validation.api import calibrated_source, observation_from_arrays
from optimizer.workload import FixedLength, LognormalLength, synthetic_workload


@dataclass(frozen=True, slots=True)
class LinearStep:
    """1.1 ms + 100 us per token + 20 ns per decode KV token."""

    is_estimate: bool = False

    def step_time_s(self, load: StepLoad) -> float:
        return 1.1e-3 + 1e-4 * load.num_tokens + 2e-8 * load.decode_kv_tokens


@dataclass(frozen=True, slots=True)
class LinearSource:
    def for_instance(
        self, accelerator: str, tp: int, reach=None, precision=None, engine=None, layout=None
    ) -> LinearStep:
        return LinearStep()


# Observations of a synchronous engine (as the reference engine is): vLLM V1 before 0.14.
CONFIG = ServingConfig.colocated(
    "tiny",
    InstanceConfig(accelerator="cpu", max_num_batched_tokens=512, max_num_seqs=32),
    engine_version="0.13",
)
TRUE = Calibration(overhead_s=3e-3, prefill_scale=1.4, decode_scale=0.8)


def observed_case(rate: float, seed: int) -> CalibrationCase:
    w = synthetic_workload(
        50, rate, input_lengths=LognormalLength(200, 0.8, 16, 2000),
        output_lengths=LognormalLength(150, 0.8, 2, 600), seed=seed,
    )  # fmt: skip
    truth = CalibratedSource(LinearSource(), default=TRUE)
    measured = RequestOutcomes.of_simulation(simulate(w, CONFIG, truth, seed=seed))
    return CalibrationCase(w, CONFIG, measured, f"rate-{rate}")


def test_calibrated_step_applies_overhead_and_phase_scales() -> None:
    step = CalibratedStepLatency(LinearStep(), TRUE)
    decode = StepLoad(8, 8, (), (), 8, 800, 1)
    prefill = StepLoad(100, 1, (100,), (100,), 0, 0, 1)
    base_d, base_p = LinearStep().step_time_s(decode), LinearStep().step_time_s(prefill)
    assert step.step_time_s(decode) == pytest.approx(3e-3 + 0.8 * base_d)
    assert step.step_time_s(prefill) == pytest.approx(3e-3 + 1.4 * base_p)
    assert CalibratedSource(LinearSource()).for_instance("cpu", 1) == LinearStep()


def test_fit_recovers_known_correction() -> None:
    cases = [observed_case(2.0, 1), observed_case(12.0, 2)]
    fit = fit_calibration(cases, LinearSource(), max_evaluations=120)
    cal = fit.calibration
    assert fit.loss_after < fit.loss_before / 100
    assert cal.prefill_scale == pytest.approx(TRUE.prefill_scale, rel=0.1)
    # Overhead and decode scale trade off; the decode step they price is pinned down.
    for n in (4, 16):
        load = StepLoad(n, n, (), (), n, n * 300, 1)
        fitted = CalibratedStepLatency(LinearStep(), cal).step_time_s(load)
        true = CalibratedStepLatency(LinearStep(), TRUE).step_time_s(load)
        assert fitted == pytest.approx(true, rel=0.1)
    held_out = observed_case(6.0, 3)
    slo = SLO(ttft_s=0.5, tpot_s=0.05)
    (before,) = evaluate([held_out], LinearSource(), slo)
    (after,) = evaluate([held_out], CalibratedSource(LinearSource(), default=cal), slo)
    for m in (Metric.MEAN_TTFT, Metric.MEAN_TPOT):
        assert abs(after.error(m)) < abs(before.error(m))
        assert abs(after.error(m)) < 0.05


def test_compare_observation_and_stored_calibrations() -> None:
    case = observed_case(6.0, 4)
    arrays = {
        "arrival_s": case.measured.arrival_s, "input_tokens": case.measured.input_tokens,
        "output_tokens": case.measured.output_tokens, "ttft_s": case.measured.ttft_s,
        "e2e_s": case.measured.e2e_s,
    }  # fmt: skip
    obs = observation_from_arrays("synthetic", arrays)

    @dataclass
    class Stored:
        accelerator: str = "cpu"
        tp: int = 1
        overhead_s: float = TRUE.overhead_s
        prefill_scale: float = TRUE.prefill_scale
        decode_scale: float = TRUE.decode_scale

    exact = compare_observation(obs, CONFIG, calibrated_source(LinearSource(), [Stored()]))
    assert abs(exact.error(Metric.MEAN_TTFT)) < 1e-9 and abs(exact.error(Metric.GOODPUT)) < 1e-9
    off = compare_observation(obs, CONFIG, LinearSource())
    assert off.error(Metric.MEAN_TPOT) < 0  # uncorrected decode is faster than observed here
    assert calibrated_source(LinearSource(), []) == LinearSource()


def test_comparison_rejects_different_workloads_and_bad_calibrations() -> None:
    a = observed_case(4.0, 1).measured
    w = synthetic_workload(
        3, 1.0, input_lengths=FixedLength(8), output_lengths=FixedLength(2), seed=0
    )
    b = RequestOutcomes.of_simulation(simulate(w, CONFIG, LinearSource()))
    with pytest.raises(ValidationError, match="same workload"):
        compare(a, b, SLO(1.0, 0.1))
    with pytest.raises(ValidationError, match="overhead_s"):
        Calibration(overhead_s=-1.0)
    with pytest.raises(ValidationError, match="decode_scale"):
        Calibration(decode_scale=0.0)
    assert np.isfinite(compare(a, a, SLO(1.0, 0.1)).error(Metric.P99_TPOT))
