"""Max sustainable rate (DistServe's capacity): the highest arrival rate at
which SLO attainment still reaches a target, found by scaling the trace's
inter-arrival times (DOMAIN.md §2).

Attainment is taken as non-increasing in the rate scale. The search brackets
the answer by doubling or halving the scale from 1, then bisects on a log
scale until the bracket is within `rel_tol`. Every probe is one `simulate`
call with the same seed, so the search is deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.config import ServingConfig
from optimizer.latency.base import LatencySource
from optimizer.sim.engine import SimulationError, simulate
from optimizer.sim.metrics import SLO, SimulationResult
from optimizer.workload import Workload

_MIN_SCALE, _MAX_SCALE = 1e-4, 1e4


@dataclass(frozen=True, slots=True)
class CapacityResult:
    rate_scale: float  # multiplier applied to the trace's arrival rate
    request_rate: float  # requests/s of the scaled trace (arrival span)
    request_rate_per_gpu: float
    attainment: float
    num_simulations: int
    result: SimulationResult  # the run at `rate_scale`
    bounded: bool  # False when the search hit its scale limits


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
) -> CapacityResult:
    """Bisect the rate scale for the highest one with attainment >= `attainment`."""
    if len(workload) < 2 or workload.duration_s <= 0:
        raise SimulationError("max_sustainable_rate needs a trace with at least two arrival times")
    if not 0 < attainment <= 1:
        raise SimulationError(f"attainment target must be in (0, 1], got {attainment}")
    if not 0 < rel_tol < 1:
        raise SimulationError(f"rel_tol must be in (0, 1), got {rel_tol}")
    runs: dict[float, SimulationResult] = {}

    def run(scale: float) -> float:
        if len(runs) >= max_simulations:
            raise SimulationError(f"capacity search did not converge in {max_simulations} runs")
        res = simulate(workload.rate_scaled(scale), config, latency, seed=seed, slo=slo,
                       draft_latency=draft_latency)  # fmt: skip
        runs[scale] = res
        return res.attainment(slo)

    bounded = True
    if run(1.0) >= attainment:
        lo, hi = 1.0, 2.0
        while run(hi) >= attainment:
            lo, hi = hi, hi * 2
            if hi > _MAX_SCALE:
                bounded = False
                break
    else:
        lo, hi = 0.5, 1.0
        while run(lo) < attainment:
            lo, hi = lo / 2, lo
            if lo < _MIN_SCALE:
                raise SimulationError(
                    f"SLO attainment stays below {attainment} even at "
                    f"{_MIN_SCALE:g}x the trace rate"
                )
    while bounded and hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if run(mid) >= attainment:
            lo = mid
        else:
            hi = mid
    best = runs[lo]
    rate = workload.mean_rate * lo
    return CapacityResult(
        rate_scale=lo,
        request_rate=rate,
        request_rate_per_gpu=rate / config.num_gpus,
        attainment=best.attainment(slo),
        num_simulations=len(runs),
        result=best,
        bounded=bounded,
    )
