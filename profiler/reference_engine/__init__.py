"""The reference engine: a real tiny transformer served with the simulator's policies.

A measuring instrument for `servetune validate`: continuous batching with a
token budget, `max_num_seqs`, a paged KV cache with preemption, speculative
decoding with a draft model, and prefill/decode disaggregation across two
processes. Importing this package does not import torch. `serve_open_loop` serves
Poisson traffic with vLLM's Prometheus metrics (`python -m
profiler.reference_engine.exporter`, docs/observe.md).

    from profiler.reference_engine import ReplayRequests, replay
    result = replay(ReplayRequests(arrival_s, input_tokens, output_tokens), config)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from profiler._lazy import lazy_getattr

_EXPORTS = {
    "Clock": "profiler.reference_engine.realtime",
    "EngineError": "profiler.reference_engine.scheduler",
    "OpenLoopTraffic": "profiler.reference_engine.traffic",
    "ReplayOptions": "profiler.reference_engine.realtime",
    "ReplayRequests": "profiler.reference_engine.realtime",
    "ReplayResult": "profiler.reference_engine.realtime",
    "TrafficPhase": "profiler.reference_engine.traffic",
    "VllmMetrics": "profiler.reference_engine.exporter",
    "replay": "profiler.reference_engine.serve",
    "serve_open_loop": "profiler.reference_engine.exporter",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from profiler.reference_engine.exporter import VllmMetrics, serve_open_loop  # noqa: F401
    from profiler.reference_engine.realtime import (  # noqa: F401
        Clock,
        ReplayOptions,
        ReplayRequests,
        ReplayResult,
    )
    from profiler.reference_engine.scheduler import EngineError  # noqa: F401
    from profiler.reference_engine.serve import replay  # noqa: F401
    from profiler.reference_engine.traffic import OpenLoopTraffic, TrafficPhase  # noqa: F401


__getattr__ = lazy_getattr(__name__, _EXPORTS)
