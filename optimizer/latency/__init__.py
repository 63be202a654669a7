"""Latency models: what one engine iteration costs (see `base` for the contract).

Public entry points: `fit_latency_model` (scikit-learn, offline) ->
`build_catalog` (compiled tables, a `LatencySource`) or `compile_roofline`
(an estimate from an accelerator's spec alone).
"""

from optimizer.latency.base import LatencySource, StepLatency, StepLoad, TableReach
from optimizer.latency.catalog import (
    LatencyCatalog,
    build_catalog,
    compile_learned,
    compile_roofline,
)
from optimizer.latency.fit import fit_latency_model
from optimizer.latency.model import FitOptions, LatencyModel
from optimizer.latency.roofline import ROOFLINE_LABEL, RooflineOptions
from optimizer.latency.table import CompiledStepLatency

__all__ = [
    "ROOFLINE_LABEL",
    "CompiledStepLatency",
    "FitOptions",
    "LatencyCatalog",
    "LatencyModel",
    "LatencySource",
    "RooflineOptions",
    "StepLatency",
    "StepLoad",
    "TableReach",
    "build_catalog",
    "compile_learned",
    "compile_roofline",
    "fit_latency_model",
]
