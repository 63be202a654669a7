"""Max sustainable rate (DistServe's capacity): the highest arrival rate at
which SLO attainment still reaches a target, found by scaling the trace's
inter-arrival times (DOMAIN.md §2).

A finite trace hides overload: compressed far enough, every request arrives at
once and a short trace can still be served within a loose TTFT SLO. So the
search is capped by the saturation throughput (the request throughput when
every request arrives at once): no rate above what the deployment completes
per second is sustainable. Attainment is taken as non-increasing in the rate
scale. From scale 1 (the trace's own rate) the search probes 0.7 x the cap
(loose SLOs sit near saturation), then bisects on a log scale until the
bracket is within `rel_tol`; below scale 1 it steps down by 4x and calls a
deployment that misses the target at 1/256 of the trace's rate unsustainable
(rate 0). Every probe is one `simulate` call with the same seed, so the search
is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from optimizer.config import ServingConfig
from optimizer.latency.base import LatencySource
from optimizer.sim.engine import SimulationError, simulate
from optimizer.sim.metrics import SLO, SimulationResult
from optimizer.workload import Workload

_BURST_SCALE = 1e-6  # time scale that makes every request arrive at once
_MAX_STEPS_DOWN = 4  # 4^-4 = 1/256 of the trace's rate


@dataclass(frozen=True, slots=True)
class CapacityResult:
    rate_scale: float  # multiplier applied to the trace's arrival rate (0: unsustainable)
    request_rate: float  # requests/s of the scaled trace (arrival span)
    request_rate_per_gpu: float
    attainment: float  # at `rate_scale` (at the lowest rate probed when unsustainable)
    num_simulations: int
    result: SimulationResult  # the run at `rate_scale` (or the lowest rate probed)
    bounded: bool  # False when the search ran out of simulations before converging
    saturation_rate: float  # requests/s completed when every request arrives at once
    result_rate: float = 0.0  # requests/s of `result`'s run (= request_rate when sustainable)
    # The lowest rate probed that misses the target, and its run: what limits the capacity
    # (None when the capacity is the saturation cap, or nothing is sustainable).
    limit_rate: float = 0.0
    limit: SimulationResult | None = None


def max_sustainable_rate(
    workload: Workload,
    config: ServingConfig,
    latency: LatencySource,
    slo: SLO,
    *,
    attainment: float = 0.9,
    seed: int = 0,
    rel_tol: float = 0.02,
    max_simulations: int = 40,
    draft_latency: LatencySource | None = None,
    at_trace_rate: SimulationResult | None = None,
) -> CapacityResult:
    """Bisect the rate scale for the highest one with attainment >= `attainment`.

    `at_trace_rate`, when given, is the caller's run of this workload and config at
    scale 1 (with the same seed), reused instead of simulated again.
    """
    if len(workload) < 2 or workload.duration_s <= 0:
        raise SimulationError("max_sustainable_rate needs a trace with at least two arrival times")
    if not 0 < attainment <= 1:
        raise SimulationError(f"attainment target must be in (0, 1], got {attainment}")
    if not 0 < rel_tol < 1:
        raise SimulationError(f"rel_tol must be in (0, 1), got {rel_tol}")
    runs: dict[float, SimulationResult] = {}
    if at_trace_rate is not None:
        runs[1.0] = at_trace_rate

    def sim(wl: Workload) -> SimulationResult:
        return simulate(wl, config, latency, seed=seed, slo=slo, draft_latency=draft_latency)

    def ok(scale: float) -> bool:
        if scale not in runs:
            runs[scale] = sim(workload.rate_scaled(scale))
        return runs[scale].attainment(slo) >= attainment

    burst = sim(workload.time_scaled(_BURST_SCALE))
    saturation = burst.request_throughput
    upper = max(saturation / workload.mean_rate, 1e-3)
    scale, above, bounded = _search(ok, upper, rel_tol, lambda: len(runs) + 1 >= max_simulations)
    probed_scale = scale if scale > 0 else min(runs)
    probed = runs[probed_scale]
    rate = workload.mean_rate * scale
    limit = runs.get(above) if scale > 0 else None
    return CapacityResult(
        rate_scale=scale,
        request_rate=rate,
        request_rate_per_gpu=rate / config.num_gpus,
        attainment=probed.attainment(slo),
        num_simulations=len(runs) + 1 - (at_trace_rate is not None),
        result=probed,
        bounded=bounded,
        saturation_rate=saturation,
        result_rate=workload.mean_rate * probed_scale,
        limit_rate=workload.mean_rate * above if limit is not None else 0.0,
        limit=limit,
    )


def _search(
    ok: Callable[[float], bool], upper: float, rel_tol: float, exhausted: Callable[[], bool]
) -> tuple[float, float, bool]:
    """(highest scale in (0, upper] with ok(scale), the lowest scale known to fail above it
    (`upper` when none was probed), converged?) — 0.0 first when none is found."""
    if ok(1.0):
        lo, hi = 1.0, max(upper, 1.0)
        if hi <= lo * (1 + rel_tol):
            return lo, hi, True
        guess = 0.7 * hi
        if guess > lo * (1 + rel_tol):
            if ok(guess):
                lo = guess
            else:
                hi = guess
    else:
        lo, hi = min(0.25, upper), 1.0
        steps = 1
        while not ok(lo):
            if steps >= _MAX_STEPS_DOWN:
                return 0.0, lo, True
            hi, lo, steps = lo, lo / 4.0, steps + 1
    while hi / lo > 1 + rel_tol:
        if exhausted():
            return lo, hi, False
        mid = math.sqrt(lo * hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi, True
