"""Importing `profiler` must not import torch."""

from __future__ import annotations

import subprocess
import sys


def test_import_profiler_does_not_import_torch() -> None:
    code = (
        "import sys, profiler, optimizer.shapes, optimizer.hardware, profiler.sweep; "
        "profiler.ProfileGrid; profiler.default_cpu_grid(); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_lazy_exports_resolve() -> None:
    import profiler

    assert profiler.default_cpu_grid().passes == 5
    assert callable(profiler.run_sweep)
    try:
        profiler.nope  # noqa: B018
    except AttributeError as exc:
        assert "nope" in str(exc)
    else:
        raise AssertionError("missing attribute did not raise")
