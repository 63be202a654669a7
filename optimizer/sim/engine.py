"""`simulate`: replay a workload on a `ServingConfig` with a discrete-event loop.

The heap holds `(time_s, seq, kind, payload)` tuples; `seq` comes from
`itertools.count`, so ties resolve in insertion order (the only ordering rule).
Events: a request arrives, an instance's step ends, a KV transfer lands; one
event per instance iteration, never per token.

Disaggregated serving: a prefill instance runs prefill steps and emits the
first token; the KV then crosses that instance's link (bytes / bandwidth +
latency, transfers on one link serialised; bytes = the prefill GPU's KV shard,
the TP shards moving in parallel over their own links) and the request queues
for KV blocks on a decode instance chosen by the routing policy.

Requests a deployment cannot hold (prompt + output beyond `max_model_len`, the
KV capacity, or the token budget when chunked prefill is off) are rejected as
vLLM rejects them: no latencies (NaN), counted as SLO misses and in
`SimulationResult.num_rejected`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from heapq import heappop, heappush
from random import Random

import numpy as np

from optimizer.config import Role, RoutingPolicy, ServingConfig, ServingMode
from optimizer.latency.base import LatencySource, StepLatency, StepLoad
from optimizer.sim.floor import check_decode_floor
from optimizer.sim.kv_cache import PrefixCache, hashes_as_lists
from optimizer.sim.metrics import SLO, InstanceRecord, RunLog, SimulationResult, build_result
from optimizer.sim.request import SimRequest
from optimizer.sim.scheduler import Instance
from optimizer.workload import ClosedLoopWorkload, Workload

ARRIVAL, STEP_END, KV_DONE = 0, 1, 2


class SimulationError(ValueError):
    """The simulation cannot run as asked (a latency model is missing, bad inputs)."""


def alpha_from_acceptance(length: np.ndarray, k: int) -> np.ndarray:
    """Per-token acceptance α with (1 - α^(K+1)) / (1 - α) = length, clipped to [1, K+1]."""
    target = np.clip(np.asarray(length, dtype=np.float64), 1.0, k + 1.0)
    lo, hi = np.zeros_like(target), np.ones_like(target)
    for _ in range(60):  # bisection: the expected length is increasing in α
        mid = (lo + hi) / 2
        expected = (1 - mid ** (k + 1)) / (1 - mid)
        below = expected < target
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    alpha = (lo + hi) / 2
    alpha[target >= k + 1.0] = 1.0
    alpha[target <= 1.0] = 0.0
    return alpha


def _log_alphas(workload: Workload | ClosedLoopWorkload, config: ServingConfig) -> list[float]:
    spec = config.speculation
    alpha = np.full(len(workload), spec.acceptance_rate)
    trace = getattr(workload, "acceptance_length", None)
    if spec.use_trace_acceptance and trace is not None:
        known = ~np.isnan(trace)
        alpha[known] = alpha_from_acceptance(trace[known], spec.num_speculative_tokens)
    with np.errstate(divide="ignore"):
        return np.log(alpha).tolist()


def _make_price(
    target: StepLatency,
    draft: StepLatency | None,
    relative_cost: float,
    num_spec: int,
    floor_s: float,
    clamped: list[int],
) -> Callable[[StepLoad], float]:
    """StepLoad -> seconds: the target step (clamped at the floor) plus K draft steps."""
    step = target.step_time_s

    def price(load: StepLoad) -> float:
        t = step(load)
        if t < floor_s:
            clamped[0] += 1
            t = floor_s
        n = load.num_decode_seqs
        if num_spec and n and load.decode_q > 1:
            dl = StepLoad(n, n, (), (), n, load.decode_kv_tokens - n * num_spec, 1)
            per = draft.step_time_s(dl) if draft is not None else relative_cost * step(dl)
            t += num_spec * per
        return t

    return price


def _decode_only(target: StepLatency) -> Callable[[int, int], float]:
    def decode_only(n: int, kv: int) -> float:
        return target.step_time_s(StepLoad(n, n, (), (), n, kv, 1))

    return decode_only


def _build_instances(
    config: ServingConfig,
    latency: LatencySource,
    draft_latency: LatencySource | None,
    log: RunLog,
    seed: int,
    hashes: list[list[int]] | None,
    block_tokens: int,
    force_general: bool,
    clamped: list[int],
) -> tuple[list[Instance], list[Instance], list[StepLatency]]:
    """Front (replica or prefill) and decode instances, and each instance's target
    latency model (by instance index)."""
    shape = config.shape
    spec = config.speculation
    front: list[Instance] = []
    back: list[Instance] = []
    targets: list[StepLatency] = []
    for plan in config.roles():
        icfg = plan.instance
        acc = icfg.resolve_accelerator()
        speculate = spec.enabled and plan.role is not Role.PREFILL
        try:
            target = latency.for_instance(icfg.accelerator, icfg.tp)
            draft = None
            if speculate and draft_latency is not None:
                draft = draft_latency.for_instance(icfg.accelerator, icfg.tp)
        except LookupError as exc:
            raise SimulationError(f"{plan.role} instances: {exc}") from exc
        floor_s = check_decode_floor(target, shape, acc, icfg.tp)
        num_spec = spec.num_speculative_tokens if speculate else 0
        price = _make_price(target, draft, spec.draft_relative_cost, num_spec, floor_s, clamped)
        for _ in range(plan.count):
            index = len(front) + len(back)
            prefix = None
            if config.enable_prefix_caching and hashes is not None and plan.role is not Role.DECODE:
                capacity = max(1, plan.kv_blocks * icfg.block_size // block_tokens)
                prefix = PrefixCache(capacity, block_tokens, icfg.block_size)
            inst = Instance(
                role=plan.role.value,
                index=index,
                max_num_batched_tokens=icfg.max_num_batched_tokens,
                max_num_seqs=icfg.max_num_seqs,
                enable_chunked_prefill=icfg.enable_chunked_prefill,
                block_size=icfg.block_size,
                num_blocks=plan.kv_blocks,
                num_spec=num_spec,
                log=log,
                rng=Random(seed * 1_000_003 + index),
                prefix=prefix,
                hashes=hashes,
                force_general=force_general,
            )
            inst.tp = icfg.tp
            inst.floor_s = floor_s
            inst.price = price
            (back if plan.role is Role.DECODE else front).append(inst)
            targets.append(target)
    return front, back, targets


def max_request_tokens(config: ServingConfig) -> int:
    """The most prompt + output tokens one request may have on `config` (longer ones
    are rejected, as vLLM rejects them)."""
    return min(_token_limits(config))


def _token_limits(config: ServingConfig) -> list[int]:
    """Per role, the most prompt + output tokens one request may have."""
    k = config.speculation.num_speculative_tokens
    limits = []
    for plan in config.roles():
        inst = plan.instance
        limit = plan.kv_blocks * inst.block_size - k
        if not inst.enable_chunked_prefill:
            limit = min(limit, inst.max_num_batched_tokens)
        if config.max_model_len is not None:
            limit = min(limit, config.max_model_len)
        limits.append(limit)
    return limits


class _Router:
    """Round-robin, or least outstanding tokens (ties to the lowest index)."""

    __slots__ = ("instances", "least", "next")

    def __init__(self, instances: list[Instance], policy: RoutingPolicy) -> None:
        self.instances = instances
        self.least = policy is RoutingPolicy.LEAST_OUTSTANDING_TOKENS and len(instances) > 1
        self.next = 0

    def pick(self) -> Instance:
        if self.least:
            return min(self.instances, key=_outstanding)
        inst = self.instances[self.next]
        self.next = (self.next + 1) % len(self.instances)
        return inst


def _outstanding(inst: Instance) -> int:
    return inst.outstanding


def simulate(
    workload: Workload | ClosedLoopWorkload,
    config: ServingConfig,
    latency: LatencySource,
    *,
    seed: int = 0,
    slo: SLO | None = None,
    draft_latency: LatencySource | None = None,
    force_general: bool = False,
) -> SimulationResult:
    """Replay `workload` on `config`: pure, deterministic for a seed, process-pool safe.

    `latency` prices target-model steps per (accelerator, TP) of each role.
    `draft_latency` prices draft-model steps when speculating; without it one
    draft step costs `speculation.draft_relative_cost` x a target decode step.
    Raises `DecodeFloorError` when a latency model's batch-1 decode beats
    weight_bytes / HBM bandwidth; any other step priced below that floor is
    clamped and counted (`num_floor_clamped_steps`). `force_general` visits
    every request every step (the reference path the fast path must match).
    """
    if not isinstance(workload, (Workload, ClosedLoopWorkload)):
        raise SimulationError(f"workload: expected a Workload, got {type(workload).__name__}")
    if not isinstance(config, ServingConfig):
        raise SimulationError(f"config: expected a ServingConfig, got {type(config).__name__}")
    closed = isinstance(workload, ClosedLoopWorkload)
    n = len(workload)
    log = RunLog(n)
    prompts = workload.input_tokens.tolist()
    outputs = workload.output_tokens.tolist()
    hashes = None
    block_tokens = 16
    if config.enable_prefix_caching and not closed and workload.prefix_hashes is not None:
        hashes = hashes_as_lists(workload.prefix_hashes)
        block_tokens = workload.prefix_block_tokens
    clamped = [0]
    front, back, targets = _build_instances(
        config, latency, draft_latency, log, seed, hashes, block_tokens, force_general, clamped
    )
    instances = front + back
    disagg = config.mode is ServingMode.DISAGGREGATED
    front_router = _Router(front, config.routing)
    back_router = _Router(back, config.routing)
    limits = _token_limits(config)
    front_limit, back_limit = limits[0], limits[-1]
    log_alpha = _log_alphas(workload, config) if config.speculation.enabled else None
    kv_bytes_per_token = config.shape.kv_bytes_per_token(config.prefill.tp if disagg else 1)
    link_bytes_per_s = config.kv_link.bandwidth_gb_s * 1e9
    link_latency_s = config.kv_link.latency_ms * 1e-3
    link_free = [0.0] * len(front)
    num_transfers = 0
    transfer_s = 0.0
    num_rejected = 0

    heap: list[tuple[float, int, int, object]] = []
    seq = itertools.count()
    push = heappush
    arrival_s = None if closed else workload.arrival_s.tolist()
    think_s = workload.think_time_s if closed else 0.0
    next_rid = 0
    if closed:
        for rid in range(min(workload.num_clients, n)):
            push(heap, (0.0, next(seq), ARRIVAL, rid))
        next_rid = min(workload.num_clients, n)
    elif n:
        push(heap, (arrival_s[0], next(seq), ARRIVAL, 0))

    to_wake: list[Instance] = []

    def wake(now: float) -> None:
        for idle in to_wake:
            if not idle.busy:
                start(idle, now)
        to_wake.clear()

    def start(inst: Instance, now: float) -> None:
        load = inst.schedule(now)
        if load is None:
            inst.busy = False
            return
        inst.busy = True
        inst.step_start = now
        push(heap, (now + inst.price(load), next(seq), STEP_END, inst.index))

    while heap:
        now, _, kind, payload = heappop(heap)
        if kind == STEP_END:
            inst = instances[payload]  # type: ignore[index]
            inst.complete(now)
            if inst.done:
                for r in inst.done:
                    if r.stop_at < r.num_output:  # prefill done: ship the KV
                        src = inst.index
                        begin = link_free[src] if link_free[src] > now else now
                        cost = kv_bytes_per_token * r.num_prompt / link_bytes_per_s
                        cost += link_latency_s
                        link_free[src] = begin + cost
                        num_transfers += 1
                        transfer_s += cost
                        push(heap, (begin + cost, next(seq), KV_DONE, (src, r)))
                    elif closed and next_rid < n:
                        push(heap, (now + think_s, next(seq), ARRIVAL, next_rid))
                        next_rid += 1
                inst.done.clear()
            start(inst, now)
        elif kind == ARRIVAL:
            rid: int = payload  # type: ignore[assignment]
            if not closed and rid + 1 < n:
                push(heap, (arrival_s[rid + 1], next(seq), ARRIVAL, rid + 1))
            log.arrival_s[rid] = now
            p, o = prompts[rid], outputs[rid]
            if p + o > back_limit or (disagg and p + 1 > front_limit):
                num_rejected += 1
                if closed and next_rid < n:
                    push(heap, (now + think_s, next(seq), ARRIVAL, next_rid))
                    next_rid += 1
            else:
                r = SimRequest(rid, now, p, o, 1 if disagg and o > 1 else o)
                if log_alpha is not None:
                    r.log_alpha = log_alpha[rid]
                inst = front_router.pick()
                r.instance = inst.index
                inst.outstanding += p + o
                inst.waiting.append(r)
                if not inst.busy:
                    # simultaneous arrivals are queued together before the idle instance starts
                    to_wake.append(inst)
            if to_wake and not (heap and heap[0][0] == now and heap[0][2] == ARRIVAL):
                wake(now)
        else:  # KV_DONE: the prefill instance frees the KV; a decode instance takes over
            src, r = payload  # type: ignore[misc]
            prefill = instances[src]
            prefill.free_blocks += r.num_blocks
            r.num_blocks = 0
            if not prefill.busy and prefill.waiting:
                start(prefill, now)
            r.stop_at = r.num_output
            r.num_computed = r.num_prompt
            dst = back_router.pick()
            r.instance = dst.index
            dst.outstanding += r.num_prompt + r.num_output
            dst.waiting.append(r)
            if not dst.busy:
                start(dst, now)

    records = []
    for inst, target in zip(instances, targets, strict=True):
        prefix = inst.prefix
        ratio = None
        if prefix is not None and prefix.num_lookup_tokens:
            ratio = prefix.num_hit_tokens / prefix.num_lookup_tokens
        records.append(InstanceRecord(
            inst.role, inst.index, inst.tp, inst.num_blocks, inst.steps, inst.num_preemptions,
            ratio, _decode_only(target), inst.num_blocks - inst.free_blocks,
        ))  # fmt: skip
    return build_result(
        log,
        records,
        input_tokens=workload.input_tokens,
        output_tokens=workload.output_tokens,
        num_gpus=config.num_gpus,
        num_floor_clamped_steps=clamped[0],
        slo=slo,
        num_rejected=num_rejected,
        num_kv_transfers=num_transfers,
        kv_transfer_s=transfer_s,
        latency_is_estimate=any(getattr(t, "is_estimate", True) for t in targets),
    )
