"""Replicas in parallel processes: a fleet whose router keeps no shared state.

Round-robin routing sends the k-th request the fleet admits to replica k mod R, whatever
the replicas are doing; a request too long for the deployment is rejected at the front
and takes no turn. So the requests each replica serves are known before the run, and
each replica can be replayed alone on its own requests, in its own process, with the
random generator it has in the whole fleet. The parts' per-request
columns are put back at their request ids and one result is built from them, as the
serial run builds it: per-request results are the same as the serial run's.

What cannot be split (`serial_reason` says which, and the output says so):
- least-outstanding-tokens routing reads every replica's load at each arrival;
- a disaggregated fleet hands every request from a prefill to a decode instance;
- a closed loop's clients each wait for their last request, wherever it ran;
- one replica has nothing to split.

Workers are forked (Linux): they inherit the latency source, its tables already built by
the parent, instead of pickling it; each runs its share of replicas one after another.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass, replace

import numpy as np

from optimizer.closed_loop_workload import ClosedLoopWorkload
from optimizer.config import RoutingPolicy, ServingConfig, ServingMode
from optimizer.latency.base import LatencySource
from optimizer.sim.engine import (
    SimulationError,
    _EventLoop,
    instance_records,
    longest_request,
    max_request_tokens,
    prefix_hashes,
)
from optimizer.sim.fleet import build_fleet, instance_rng
from optimizer.sim.metrics import SLO, InstanceRecord, RunLog, SimulationResult, build_result
from optimizer.workload import Workload


def serial_reason(workload: Workload | ClosedLoopWorkload, config: ServingConfig) -> str | None:
    """Why `config` on `workload` must run in one process (None: its replicas can run in
    parallel)."""
    if isinstance(workload, ClosedLoopWorkload):
        return "a closed loop's clients wait on every replica"
    if config.mode is ServingMode.DISAGGREGATED:
        return "a disaggregated fleet hands requests from prefill to decode instances"
    if config.routing is not RoutingPolicy.ROUND_ROBIN:
        return f"{config.routing.value} routing reads every replica's load at each arrival"
    if (config.num_replicas or 1) < 2:
        return "one replica"
    return None


def replica_of_request(workload: Workload, config: ServingConfig) -> np.ndarray:
    """Per request, the replica round-robin sends it to (-1: rejected at the front, as
    too long for the deployment; it takes no turn)."""
    accepted = (workload.input_tokens + workload.output_tokens) <= max_request_tokens(config)
    replica = np.full(len(workload), -1, dtype=np.int64)
    replica[accepted] = np.arange(int(accepted.sum()), dtype=np.int64) % config.num_replicas
    return replica


@dataclass(frozen=True, slots=True)
class _Part:
    """What one replica's run hands back: its requests' log and its instances' records."""

    rids: np.ndarray
    log: RunLog
    records: list[InstanceRecord]
    num_clamped: int
    latency_is_estimate: bool


def replay_replica(
    workload: Workload,
    rids: np.ndarray,
    config: ServingConfig,
    replica: int,
    latency: LatencySource,
    draft_latency: LatencySource | None,
    *,
    seed: int,
    check_invariants: bool = False,
    jump: bool = True,
) -> _Part:
    """Replica `replica` of `config` alone on the requests `rids` round-robin sends it,
    with the instance indices (and so the random generators) it has in the whole fleet."""
    part = workload.subset(rids)
    one = replace(config, num_replicas=1)
    log = RunLog(len(part))
    hashes, block_tokens = prefix_hashes(part, one)
    clamped = [0]
    fleet = build_fleet(
        one, latency, draft_latency, log, seed=seed, longest_request=longest_request(workload),
        hashes=hashes, block_tokens=block_tokens, force_general=False, clamped=clamped,
        jump=jump,
    )  # fmt: skip
    # Indexed from 0 in this run (the loop indexes its instances by position); each draws
    # from the generator it has in the whole fleet and is recorded under its fleet index.
    first = replica * config.replica.dp
    for inst in fleet.instances:
        inst.rng = instance_rng(seed, first + inst.index)
    loop = _EventLoop(part, one, fleet, log, check_invariants)
    loop.run()
    records = [replace(r, index=first + r.index) for r in instance_records(loop)]
    estimate = any(getattr(t, "is_estimate", True) for t in fleet.targets)
    return _Part(rids, log, records, clamped[0], estimate)


# Set in the parent before forking; the workers read it (never pickled).
_JOB: tuple | None = None


def _run_replicas(replicas: list[int]) -> list[_Part]:
    workload, config, latency, draft, seed, check, jump, replica = _JOB
    parts = []
    for j in replicas:
        rids = np.flatnonzero(replica == j)
        if rids.size:
            parts.append(replay_replica(
                workload, rids, config, j, latency, draft, seed=seed, check_invariants=check,
                jump=jump,
            ))  # fmt: skip
    return parts


def simulate_parallel(
    workload: Workload,
    config: ServingConfig,
    latency: LatencySource,
    *,
    jobs: int,
    seed: int = 0,
    slo: SLO | None = None,
    draft_latency: LatencySource | None = None,
    check_invariants: bool = False,
    jump: bool = True,
) -> SimulationResult:
    """`simulate` of a fleet `serial_reason` accepts, its replicas spread over `jobs`
    forked processes: the same per-request results as the serial run."""
    global _JOB
    reason = serial_reason(workload, config)
    if reason is not None:
        raise SimulationError(f"--jobs: this fleet runs in one process ({reason})")
    if not (isinstance(jobs, int) and jobs >= 1):
        raise SimulationError(f"--jobs: expected a whole number of processes >= 1, got {jobs!r}")
    replica = replica_of_request(workload, config)
    num = config.num_replicas
    # One replica's pricing is built here first, so the workers inherit its tables.
    first = np.flatnonzero(replica == 0)[:1]
    if first.size:
        replay_replica(workload, first, config, 0, latency, draft_latency, seed=seed, jump=jump)
    shares = [list(range(k, num, jobs)) for k in range(min(jobs, num))]
    _JOB = (workload, config, latency, draft_latency, seed, check_invariants, jump, replica)
    try:
        with multiprocessing.get_context("fork").Pool(len(shares)) as pool:
            parts = [p for share in pool.map(_run_replicas, shares) for p in share]
    finally:
        _JOB = None
    return _merge(workload, config, parts, replica, slo)


def _merge(
    workload: Workload,
    config: ServingConfig,
    parts: list[_Part],
    replica: np.ndarray,
    slo: SLO | None,
) -> SimulationResult:
    """One result from the replicas' parts, as the serial run builds it."""
    log = RunLog(len(workload))
    rejected = np.flatnonzero(replica < 0)
    log.column("arrival_s")[rejected] = workload.arrival_s[rejected]  # sent, never served
    for part in parts:
        log.scatter(part.log, part.rids)
    records = sorted((r for p in parts for r in p.records), key=lambda r: r.index)
    return build_result(
        log,
        records,
        input_tokens=workload.input_tokens,
        output_tokens=workload.output_tokens,
        num_gpus=config.num_gpus,
        num_floor_clamped_steps=sum(p.num_clamped for p in parts),
        slo=slo,
        num_rejected=int(rejected.size),
        latency_is_estimate=any(p.latency_is_estimate for p in parts),
    )
