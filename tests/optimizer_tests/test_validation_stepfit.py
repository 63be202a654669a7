"""Step calibration recovers a known correction from measured step costs; outliers and
under-determined phases are handled; trace calibration flags a disturbed run."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

from optimizer.latency.base import StepLoad
from optimizer.validation import (
    CalibratedSource,
    CalibratedStepLatency,
    Calibration,
    CalibrationCase,
    RequestOutcomes,
    StepObservation,
    ValidationError,
    fit_calibration,
    fit_step_calibration,
)
from optimizer.validation.api import calibrated_source
from optimizer.validation.calibration import kv_tokens_read
from tests.optimizer_tests.test_validation_calibration import (
    CONFIG,
    LinearSource,
    LinearStep,
    observed_case,
)

TRUE = Calibration(
    overhead_s=0.8e-3, prefill_scale=1.3, decode_scale=0.7, kv_token_s=5e-9, seq_s=40e-6
)


def loads(seed: int = 0, n: int = 120) -> list[StepLoad]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        dec = int(rng.integers(0, 16))
        kv = int(dec * rng.integers(16, 1200))
        chunk = int(rng.choice([0, 0, 64, 256]))
        if dec == 0 and chunk == 0:
            chunk = 32
        pkv = chunk + int(rng.integers(0, 800)) if chunk else 0
        pq, pk = ((chunk,), (pkv,)) if chunk else ((), ())
        out.append(StepLoad(dec + chunk, dec + (1 if chunk else 0), pq, pk, dec, kv, 1))
    return out


def measured(cal: Calibration, ls: list[StepLoad]) -> list[StepObservation]:
    truth = CalibratedStepLatency(LinearStep(), cal)
    return [StepObservation(ld, truth.step_time_s(ld)) for ld in ls]


def test_recovers_a_known_correction() -> None:
    fit = fit_step_calibration(LinearStep(), measured(TRUE, loads()))
    c = fit.calibration
    assert c.overhead_s == pytest.approx(TRUE.overhead_s, rel=1e-3, abs=1e-7)
    assert c.prefill_scale == pytest.approx(TRUE.prefill_scale, rel=1e-3)
    assert c.decode_scale == pytest.approx(TRUE.decode_scale, rel=1e-3)
    assert c.kv_token_s == pytest.approx(TRUE.kv_token_s, rel=1e-2)
    assert c.seq_s == pytest.approx(TRUE.seq_s, rel=1e-2)
    assert fit.num_outliers == 0 and fit.median_error_after < 1e-6
    assert fit.median_error_before > 0.05


def test_disturbed_steps_are_left_out() -> None:
    obs = measured(TRUE, loads())
    disturbed = [StepObservation(o.load, o.seconds * 4) if i % 15 == 0 else o for i, o in
                 enumerate(obs)]  # fmt: skip
    fit = fit_step_calibration(LinearStep(), disturbed)
    assert fit.num_outliers == len(obs[::15])
    assert fit.calibration.decode_scale == pytest.approx(TRUE.decode_scale, rel=1e-2)


def test_a_phase_without_steps_keeps_scale_one() -> None:
    decode_only = [ld for ld in loads() if not ld.prefill_q]
    fit = fit_step_calibration(
        LinearStep(), measured(TRUE, decode_only), kv_term=False, seq_term=False
    )
    assert fit.calibration.prefill_scale == 1.0
    assert fit.calibration.kv_token_s == 0.0 and fit.calibration.seq_s == 0.0


def test_too_few_steps_are_refused() -> None:
    with pytest.raises(ValidationError, match="needs >= 3"):
        fit_step_calibration(LinearStep(), measured(TRUE, loads(n=2)))


def test_kv_term_prices_every_kv_token_read() -> None:
    ld = StepLoad(70, 7, (64,), (300,), 6, 600, 1)
    assert kv_tokens_read(ld) == 900
    plain = CalibratedStepLatency(LinearStep(), Calibration())
    with_kv = CalibratedStepLatency(LinearStep(), Calibration(kv_token_s=1e-8))
    assert with_kv.step_time_s(ld) - plain.step_time_s(ld) == pytest.approx(9e-6)
    with pytest.raises(ValidationError):
        Calibration(kv_token_s=-1.0)


def test_stored_kv_term_is_applied() -> None:
    class Stored:
        accelerator, tp = "cpu", 1
        overhead_s, prefill_scale, decode_scale = 0.0, 1.0, 1.0
        details: ClassVar[dict[str, float]] = {"kv_token_s": 2e-9, "seq_s": 3e-5}

    source = calibrated_source(LinearSource(), [Stored()])
    assert isinstance(source, CalibratedSource)
    cal = source.for_instance("cpu", 1).calibration  # type: ignore[attr-defined]
    assert (cal.kv_token_s, cal.seq_s) == (2e-9, 3e-5)


def test_trace_calibration_flags_a_disturbed_run() -> None:
    cases = [observed_case(r, s) for r, s in ((2.0, 1), (4.0, 2), (3.0, 3))]
    bad = cases[2]
    m = bad.measured
    slow = RequestOutcomes(m.arrival_s, m.input_tokens, m.output_tokens, m.ttft_s * 6, m.e2e_s * 6)
    cases[2] = CalibrationCase(bad.workload, CONFIG, slow, "disturbed")
    fit = fit_calibration(cases, LinearSource(), max_evaluations=60)
    assert fit.outliers == ("disturbed",)
    kept = fit_calibration(cases, LinearSource(), max_evaluations=60, outlier_factor=0)
    assert kept.outliers == ()
