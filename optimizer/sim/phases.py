"""The clients' phases in a closed loop, and how far TTFT depends on them.

A replay of `vllm bench serve` or aiperf with equal lengths sends the clients' burst and
keeps it in lock-step: requests that prefill in one step finish in one step, and their
successors arrive together (docs/closed-loop.md). Measured vLLM runs do that where a
step holds few of the prompts, and do not where it holds many: on the development set
(Qwen3-32B, H100, vLLM 0.12), with 4,096-token prompts (2 per 8,192-token step) the
lock-step replay's mean TTFT is within 10-18% of the measured one, with 1,024-token
prompts (7-8 per step) it is 1.8-2.7x above it, and measured TTFT lies between the
lock-step replay and a replay whose clients start at independent phases. Where the
clients' phases decide TTFT, `out_of_step_bound` replays the same deployment with the
clients out of step, the other end of that range, so the answer states both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from optimizer.closed_loop_workload import ClosedLoopWorkload
from optimizer.config import ServingConfig, ServingMode
from optimizer.latency.base import LatencySource
from optimizer.sim.engine import simulate
from optimizer.sim.metrics import Percentiles, SimulationResult

# The most prompts one step holds for which measured closed loops matched the lock-step
# replay (4,096-token prompts, 8,192-token steps); above it the clients' phases decide.
LOCKSTEP_VALIDATED_PROMPTS = 2


@dataclass(frozen=True, slots=True)
class OutOfStepBound:
    """One deployment's closed loop replayed with the clients out of step (`ttft`,
    `tpot`), beside the lock-step replay's TTFT it bounds from below (`lockstep_ttft`)."""

    prompts_per_step: int  # the mean prompt's copies in one prefill step's token budget
    ttft: Percentiles
    tpot: Percentiles
    lockstep_ttft: Percentiles

    @property
    def note(self) -> str:
        return (
            f"TTFT replays the clients' burst, which stays in lock-step: a step holds "
            f"{self.prompts_per_step} of these prompts, and measured vLLM closed loops run "
            f"out of step there and measure lower TTFT. With the clients out of step the "
            f"same deployment gives TTFT mean {self.ttft.mean * 1e3:,.1f} ms (p50 "
            f"{self.ttft.p50 * 1e3:,.1f} ms) against {self.lockstep_ttft.mean * 1e3:,.1f} ms; "
            f"measured runs of this kind fell between the two (docs/closed-loop.md)"
        )


def prompts_per_step(workload: ClosedLoopWorkload, config: ServingConfig) -> int:
    """How many of the workload's mean prompts one prefill step's token budget holds."""
    inst = config.prefill if config.mode is ServingMode.DISAGGREGATED else config.replica
    assert inst is not None  # a valid config has its prefill-handling instance
    mean_prompt = float(np.mean(workload.input_tokens))
    return int(inst.max_num_batched_tokens // mean_prompt)


def out_of_step_bound(
    workload: ClosedLoopWorkload,
    config: ServingConfig,
    latency: LatencySource,
    lockstep: SimulationResult,
    *,
    seed: int = 0,
) -> OutOfStepBound | None:
    """`workload` under `config` with the clients out of step
    (`ClosedLoopWorkload.out_of_step`, phases over the lock-step replay's mean request
    cycle), where the clients' phases decide TTFT: a burst of two or more clients (no
    request schedule) whose step holds more prompts than the lock-step replay was
    validated at. None elsewhere, or when the lock-step replay completed no request."""
    if workload.num_clients < 2 or workload.release_s is not None:
        return None
    per_step = prompts_per_step(workload, config)
    cycle_s = float(np.nanmean(lockstep.e2e_s)) if lockstep.num_completed else 0.0
    if per_step <= LOCKSTEP_VALIDATED_PROMPTS or not cycle_s > 0:
        return None
    result = simulate(workload.out_of_step(cycle_s, seed), config, latency, seed=seed)
    return OutOfStepBound(per_step, result.ttft, result.tpot, lockstep.ttft)
