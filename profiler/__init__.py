"""Operator profiling: kernel timings, grids and sweeps (the only torch user).

Public names are re-exported lazily: importing `profiler` never imports torch;
the sweep imports it on first use. Model shapes and accelerators are the core's
vocabulary (`optimizer.shapes`, `optimizer.hardware`).

    from optimizer.shapes import get_shape
    from profiler import default_cpu_grid, run_sweep
    samples = run_sweep(get_shape("tiny"), default_cpu_grid(), "cpu")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from profiler._lazy import lazy_getattr

_EXPORTS = {
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
    "ProfileGrid",
    "default_cpu_grid",
    "default_gpu_grid",
    "describe_device",
    "load_grid",
    "measure_mixed_iteration",
    "parse_device",
    "quick_grid",
    "run_sweep",
]

if TYPE_CHECKING:
    from profiler.device import describe_device, parse_device
    from profiler.mixed import measure_mixed_iteration
    from profiler.sweep import (
        ProfileGrid,
        default_cpu_grid,
        default_gpu_grid,
        load_grid,
        quick_grid,
        run_sweep,
    )


__getattr__ = lazy_getattr(__name__, _EXPORTS)
