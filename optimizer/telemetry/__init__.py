"""Production telemetry: a running vLLM server's Prometheus metrics, read, turned into
the window's traffic, and compared with what the simulator predicts for the deployed
config (docs/observe.md)."""

from optimizer.telemetry.compare import ObservationReport, compare
from optimizer.telemetry.errors import (
    BucketMismatchError,
    CounterResetError,
    EmptyWindowError,
    ExpositionSyntaxError,
    ForeignEngineError,
    MissingMetricError,
    TelemetryError,
    WindowError,
)
from optimizer.telemetry.exposition import Exposition, parse_exposition
from optimizer.telemetry.histogram import Histogram
from optimizer.telemetry.reconstruct import MAX_RECONSTRUCTED_REQUESTS, reconstruct_workload
from optimizer.telemetry.vllm import ObservedWindow, VllmScrape, observed_window, read_vllm

__all__ = [
    "MAX_RECONSTRUCTED_REQUESTS",
    "BucketMismatchError",
    "CounterResetError",
    "EmptyWindowError",
    "Exposition",
    "ExpositionSyntaxError",
    "ForeignEngineError",
    "Histogram",
    "MissingMetricError",
    "ObservationReport",
    "ObservedWindow",
    "TelemetryError",
    "VllmScrape",
    "WindowError",
    "compare",
    "observed_window",
    "parse_exposition",
    "read_vllm",
    "reconstruct_workload",
]
