"""Operator profiling: model shapes, kernel timings, grids and sweeps.

Public names are re-exported lazily: importing `profiler` (or `profiler.shapes`,
`profiler.hardware`) never imports torch; the sweep imports it on first use.

    from profiler import get_shape, default_cpu_grid, run_sweep
    samples = run_sweep(get_shape("tiny"), default_cpu_grid(), "cpu")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from profiler._lazy import lazy_getattr

_EXPORTS = {
    "ModelShape": "profiler.shapes",
    "get_shape": "profiler.shapes",
    "Accelerator": "profiler.hardware",
    "get_accelerator": "profiler.hardware",
    "ProfileGrid": "profiler.sweep",
    "default_cpu_grid": "profiler.sweep",
    "default_gpu_grid": "profiler.sweep",
    "quick_grid": "profiler.sweep",
    "load_grid": "profiler.sweep",
    "run_sweep": "profiler.sweep",
    "measure_mixed_iteration": "profiler.mixed",
    "describe_device": "profiler.device",
    "parse_device": "profiler.device",
}

__all__ = [
    "Accelerator",
    "ModelShape",
    "ProfileGrid",
    "default_cpu_grid",
    "default_gpu_grid",
    "describe_device",
    "get_accelerator",
    "get_shape",
    "load_grid",
    "measure_mixed_iteration",
    "parse_device",
    "quick_grid",
    "run_sweep",
]

if TYPE_CHECKING:
    from profiler.device import describe_device, parse_device
    from profiler.hardware import Accelerator, get_accelerator
    from profiler.mixed import measure_mixed_iteration
    from profiler.shapes import ModelShape, get_shape
    from profiler.sweep import (
        ProfileGrid,
        default_cpu_grid,
        default_gpu_grid,
        load_grid,
        quick_grid,
        run_sweep,
    )


__getattr__ = lazy_getattr(__name__, _EXPORTS)
