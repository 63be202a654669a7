"""`replay(requests, config)`: serve a workload in real time on the reference engine.

One colocated replica runs in this process (`profiler.reference_engine.realtime`);
a disaggregated config runs one prefill and one decode instance in separate
processes (`profiler.reference_engine.disagg`).
"""

from __future__ import annotations

from optimizer.config import Role, ServingConfig, ServingMode
from profiler.reference_engine.disagg import replay_disaggregated
from profiler.reference_engine.instance import open_engine
from profiler.reference_engine.realtime import (
    Clock,
    CpuClock,
    ReplayOptions,
    ReplayRequests,
    ReplayResult,
    check_fits,
    collect,
    instance_spec,
    make_requests,
    run_realtime,
)
from profiler.reference_engine.scheduler import EngineError


def replay(
    requests: ReplayRequests, config: ServingConfig, options: ReplayOptions | None = None
) -> ReplayResult:
    """Serve `requests` in real time on the engine `config` describes."""
    options = options or ReplayOptions()
    if config.mode is ServingMode.DISAGGREGATED:
        return replay_disaggregated(requests, config, options)
    import torch

    from profiler.timing import fixed_threads

    spec = instance_spec(config, Role.REPLICA, options)
    check_fits(requests, spec, prompt_only=False)
    with fixed_threads(options.num_threads), torch.inference_mode():
        engine = open_engine(spec)
        engine.warm_up()
        if options.clock is Clock.CPU:
            if engine.device.type != "cpu":
                raise EngineError("the cpu clock measures CPU replays only; use clock=wall")
            engine.clock = CpuClock()
        reqs = make_requests(requests, seed=options.seed, disaggregated=False)
        t0 = engine.clock() + 0.01
        run_realtime(engine, reqs, t0)
    return collect(reqs, t0, (("replica", tuple(engine.steps)),))
