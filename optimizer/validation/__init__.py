"""Predictions against real runs: comparison, benchmark-result import, calibration.

from optimizer.validation import compare_observation, load_vllm_result
obs = load_vllm_result("result.json")
comparison = compare_observation(obs, config, latency_source)
"""

from optimizer.validation.api import compare_observation
from optimizer.validation.calibration import (
    CalibratedSource,
    CalibratedStepLatency,
    Calibration,
    CalibrationCase,
    CalibrationFit,
    evaluate,
    fit_calibration,
)
from optimizer.validation.compare import (
    Comparison,
    Metric,
    MetricError,
    RequestOutcomes,
    Summary,
    ValidationError,
    compare,
    default_slo,
    summarize,
)
from optimizer.validation.observations import (
    Observation,
    ObservationFormatError,
    load_vllm_result,
    parse_vllm_result,
)
from optimizer.validation.stepfit import StepFit, StepObservation, fit_step_calibration

__all__ = [
    "CalibratedSource",
    "CalibratedStepLatency",
    "Calibration",
    "CalibrationCase",
    "CalibrationFit",
    "Comparison",
    "Metric",
    "MetricError",
    "Observation",
    "ObservationFormatError",
    "RequestOutcomes",
    "StepFit",
    "StepObservation",
    "Summary",
    "ValidationError",
    "compare",
    "compare_observation",
    "default_slo",
    "evaluate",
    "fit_calibration",
    "fit_step_calibration",
    "load_vllm_result",
    "parse_vllm_result",
    "summarize",
]
