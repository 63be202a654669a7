"""`simulate`: replay a workload on a `ServingConfig` with a discrete-event loop.

The heap holds `(time_s, seq, handler, payload)` tuples; `seq` comes from
`itertools.count`, so ties resolve in insertion order (the only ordering rule).
Three kinds of event, each a handler of `_EventLoop` (as Vidur's events): a
request ARRIVES (`arrive`: routed to a front instance), an instance's STEP ENDS
(`end_step`: tokens are emitted, the next step is planned and priced), a KV
transfer LANDS (`land_kv`: the prefill instance frees the KV, a decode instance
takes the request over). One event per instance iteration, never per token.

A fleet that changes size (`optimizer.sim.dynamic.simulate_fleet`) adds its own events to
the same heap: a unit's cold start ENDS (it joins the routers), a schedule's step or an
autoscaler's TICK (units start or begin to drain). The loop asks it through
`ScalingHooks`: with no unit ready a request waits at the front (`hold`), an instance
that runs out of work may let its draining unit stop (`went_idle`).

Disaggregated serving, as vLLM's PD proxy deploys it: a prefill instance
computes the prompt and keeps its KV; the request is routed at once to a decode
instance (the routing policy), where it waits to be admitted like any request.
Admission allocates its blocks there and pulls the KV across the prefill
instance's link (bytes / bandwidth + latency, transfers on one link serialised;
bytes = the prefill GPU's KV shard, the TP shards moving in parallel over their
own links); when it lands, the prefill instance frees the KV, and the decode
instance's next step recomputes the last prompt token and delivers the first
token. So TTFT = prefill queueing + prefill + decode admission + transfer + one
decode step, and a saturated decode side backpressures the prefill side, whose
KV stays held.

A decode stretch takes one event (`end_run`): when an instance of the aggregate-decode path
plans a decode-only step with nothing else to admit, the steps up to the next change of
its decode set (a finish, a step that would preempt, at most `RUN_STEPS`) are priced at
once, each step's end the previous end plus its price as the loop would add them, and one
event ends the last. Whatever touches the instance before that (a request routed to it,
a KV landing, an autoscaler reading its gauges) cuts the run short (`_interrupt`): the
steps ended by then are applied, the step under way ends with an event of its own, and
the instance goes on step by step. The results are the step-by-step loop's
(`simulate(..., jump=False)`).

A MoE instance with dp ranks steps them in lockstep (`optimizer.sim.ranks`): one STEP
ENDS event per group step, lasting the slowest rank's priced step.

Requests a deployment cannot hold (prompt + output beyond `max_model_len`, the
KV capacity, or the token budget when chunked prefill is off) are rejected as
vLLM rejects them: no latencies (NaN), counted as SLO misses and in
`SimulationResult.num_rejected`.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any, Protocol

import numpy as np

from optimizer.closed_loop_workload import ClosedLoopWorkload
from optimizer.config import ServingConfig, ServingMode
from optimizer.latency.base import LatencySource, StepLatency
from optimizer.sim.fleet import (
    Fleet,
    Router,
    SimulationError,
    build_fleet,
    log_alphas,
    max_request_tokens,
    rejection_note,
)
from optimizer.sim.kv_cache import hashes_as_lists
from optimizer.sim.metrics import SLO, InstanceRecord, RunLog, SimulationResult, build_result
from optimizer.sim.ranks import RankGroup
from optimizer.sim.request import SimRequest
from optimizer.sim.scheduler import BaseScheduler
from optimizer.workload import Workload

__all__ = ["SimulationError", "max_request_tokens", "rejection_note", "simulate"]

RUN_STEPS = 4096  # the most steps one decode stretch advances at once
# The fewest steps worth a jump: a shorter stretch is stepped (its arrays cost more), as is
# any on an instance whose requests come less than `ARRIVAL_GAP_STEPS` steps apart on
# average (its stretches would mostly be cut short).
MIN_RUN_STEPS = 8
ARRIVAL_GAP_STEPS = 32


class ScalingHooks(Protocol):
    """What the loop asks of a fleet that changes size (`optimizer.sim.dynamic`); its
    routers see only the ready units."""

    def hold(self, rid: int) -> None:
        """No unit is ready: request `rid` waits at the front until one is."""

    def went_idle(self, inst: BaseScheduler, now: float) -> None:
        """`inst` has nothing left to run (a draining unit may now stop)."""

    def decode_for(self, prefill: BaseScheduler) -> BaseScheduler:
        """A decode instance of `prefill`'s own unit (no unit is ready)."""
        ...


class _EventLoop:
    """The state of one run and a handler per event kind."""

    __slots__ = (
        "arrival_s", "back_router", "burst", "check", "closed", "disagg", "fe_cost", "fe_free",
        "fleet", "front_router", "heap", "instances", "kv_bytes_per_token", "link_bytes_per_s",
        "link_free", "link_latency_s", "log", "log_alpha", "n", "next_rid", "num_rejected",
        "num_transfers", "num_warmups", "on_arrival", "on_enter", "on_kv", "on_run_end",
        "on_step_end", "outputs", "prompts", "release", "scaler", "seq", "think_s", "to_wake",
        "transfer_s", "turnaround_per_token_s", "unmeasured", "warmups_left",
    )  # fmt: skip

    def __init__(
        self,
        workload: Workload | ClosedLoopWorkload,
        config: ServingConfig,
        fleet: Fleet,
        log: RunLog,
        check: bool,
    ) -> None:
        self.fleet = fleet
        self.instances = fleet.instances
        self.log = log
        self.check = check
        self.closed = isinstance(workload, ClosedLoopWorkload)
        self.n = len(workload)
        self.prompts = _ints(workload.input_tokens)
        self.outputs = _ints(workload.output_tokens)
        self.disagg = config.mode is ServingMode.DISAGGREGATED
        self.front_router = Router(fleet.front_units, config.routing)
        self.back_router = Router(fleet.back_units, config.routing)
        self.log_alpha = (
            _floats(log_alphas(workload, config)) if config.speculation.enabled else None
        )
        self.kv_bytes_per_token = config.shape.kv_bytes_per_token(
            config.prefill.tp if self.disagg and config.prefill else 1
        )
        self.link_bytes_per_s = config.kv_link.bandwidth_gb_s * 1e9
        self.link_latency_s = config.kv_link.latency_ms * 1e-3
        self.link_free = [0.0] * len(fleet.front)
        self.num_transfers = 0
        self.transfer_s = 0.0
        self.num_rejected = 0
        self.heap: list[tuple[float, int, Callable[[float, Any], None], Any]] = []
        self.seq = itertools.count()
        self.to_wake: list[BaseScheduler] = []
        self.scaler: ScalingHooks | None = None  # a fleet that changes size (sim.dynamic)
        # The handlers, bound once: heap entries carry them (and `arrive` compares by identity).
        self.on_arrival = self.arrive
        self.on_enter = self.enter
        self.on_step_end = self.end_step
        self.on_kv = self.land_kv
        self.on_run_end = self.end_run
        self.fe_cost: list[float] | None = None
        self.fe_free = 0.0
        self.release: list[float] | None = None
        self.num_warmups = self.warmups_left = self.burst = 0
        self.unmeasured = False
        self.turnaround_per_token_s = 0.0
        if self.closed:
            assert isinstance(workload, ClosedLoopWorkload)
            self.arrival_s = None
            self.think_s = workload.think_time_s
            self.turnaround_per_token_s = workload.turnaround_per_output_token_s
            if workload.release_s is not None:
                self.release = _floats(workload.release_s)
            if not workload.frontend.is_zero:
                self.fe_cost = workload.frontend.costs_s(workload.input_tokens)
            self.num_warmups = self.warmups_left = workload.num_warmups
            if self.num_warmups:  # nothing measured until the first measured request is sent
                self._measure_from(math.inf)
            self.burst = min(workload.num_clients, self.n - self.num_warmups)
            first = self.num_warmups or self.n
            self.next_rid = min(workload.num_clients, first)
            for rid in range(self.next_rid):
                start = self.release[rid] if self.release is not None else 0.0
                heappush(self.heap, (start, next(self.seq), self.on_arrival, rid))
        else:
            self.arrival_s = _floats(workload.arrival_s)
            self.think_s = 0.0
            self.next_rid = 0
            if self.n:
                heappush(self.heap, (self.arrival_s[0], next(self.seq), self.on_arrival, 0))

    def run(self) -> None:
        heap = self.heap
        pop = heappop
        while heap:
            now, _, handle, payload = pop(heap)
            handle(now, payload)

    # ------------------------------------------------------------------ handlers

    def arrive(self, now: float, rid: int) -> None:
        """A request is sent (its TTFT counts from here); it reaches the engine at once, or
        through the API server (`FrontendDelay`, closed loops)."""
        heap = self.heap
        if not self.closed and rid + 1 < self.n:
            heappush(heap, (self.arrival_s[rid + 1], next(self.seq), self.on_arrival, rid + 1))
        self.log.arrival_s[rid] = now
        if self.unmeasured and rid >= self.num_warmups:
            self._measure_from(now)
        if self.fe_cost is not None:
            t = (now if now > self.fe_free else self.fe_free) + self.fe_cost[rid]
            self.fe_free = t
            heappush(heap, (t, next(self.seq), self.on_enter, rid))
            return
        self.enter(now, rid)

    def enter(self, now: float, rid: int) -> None:
        """A request reaches the engine: admit it to a front instance, or reject it."""
        heap = self.heap
        p, o = self.prompts[rid], self.outputs[rid]
        fleet = self.fleet
        if p + o > fleet.back_limit or (self.disagg and p + 1 > fleet.front_limit):
            self.num_rejected += 1
            self._next_client(now, rid)
        elif not self.front_router.instances:  # a dynamic fleet with no unit ready
            self.scaler.hold(rid)
        else:
            r = SimRequest(rid, now, p, o, 1 if self.disagg and o > 1 else o)
            if self.log_alpha is not None:
                r.log_alpha = self.log_alpha[rid]
            inst = self.front_router.pick()
            r.instance = inst.index
            self._interrupt(inst, now)
            inst.add_request(r)
            if inst.run_ends is not None:  # begun by the step that ended at this instant
                self._interrupt(inst, now)
            if not inst.busy:
                # simultaneous arrivals are queued together before the idle instance starts
                self.to_wake.append(inst)
        if self.to_wake and not (
            heap
            and heap[0][0] == now
            and (heap[0][2] is self.on_arrival or heap[0][2] is self.on_enter)
        ):
            for idle in self.to_wake:
                if not idle.busy:
                    self._start(idle, now)
            self.to_wake.clear()

    def end_step(self, now: float, index: int) -> None:
        """An instance's step ends: emit its tokens, hand off or finish, plan the next (a
        MoE instance's dp ranks: every rank that stepped, then the group's next step)."""
        inst = self.instances[index]
        group = inst.group
        if group is None:
            inst.complete(now)
            if inst.done:
                self._emit(inst, now)
            self._start(inst, now)
            return
        for rank in group.stepping:
            rank.complete(now)
            if rank.done:
                self._emit(rank, now)
        self._start_group(group, now)

    def end_run(self, now: float, payload: tuple[BaseScheduler, int]) -> None:
        """A decode stretch's last step ends: its earlier steps are applied at once, the
        last one as any step (`end_step`); a run cut short since has nothing to do."""
        inst, gen = payload
        if gen != inst.run_gen:
            return
        ends = inst.run_ends
        inst.run_ends = None
        self._apply_run(inst, ends, len(ends) - 2)
        self.end_step(now, inst.index)

    def _emit(self, inst: BaseScheduler, now: float) -> None:
        """Requests `inst` finished in its step: handed off (PD prefill), or their client
        sends its next (closed loop)."""
        done = inst.done
        for r in done:
            if r.stop_at < r.num_output:  # prefill done: on to a decode instance
                self._hand_off(inst, r, now)
            elif self.closed:
                self._next_client(now, r.rid)
        done.clear()

    def land_kv(self, now: float, r: SimRequest) -> None:
        """A KV pull lands: the prefill instance frees it, the decode instance computes."""
        prefill = self.instances[r.source]
        decode = self.instances[r.instance]
        self._interrupt(prefill, now)
        self._interrupt(decode, now)
        prefill.release_handoff(r)
        if not prefill.busy:
            if prefill.has_work():
                self._start(prefill, now)
            elif self.scaler is not None:
                self.scaler.went_idle(prefill, now)
        decode.kv_landed(r)
        if not decode.busy:
            self._start(decode, now)

    # ------------------------------------------------------------------ helpers

    def _start(self, inst: BaseScheduler, now: float) -> None:
        """Plan and price `inst`'s next step (or mark it idle)."""
        if inst.group is not None:
            self._start_group(inst.group, now)
            return
        t = self._plan(inst, now, not inst.busy)
        if t is None:
            inst.busy = False
            if self.scaler is not None:
                self.scaler.went_idle(inst, now)
            return
        inst.busy = True
        inst.step_start = now
        if inst.price_run is not None and inst.add_gap_s > ARRIVAL_GAP_STEPS * t:
            k = inst.plan_run(RUN_STEPS, MIN_RUN_STEPS)
            if k > 1:
                self._begin_run(inst, now, t, k)
                return
        heappush(self.heap, (now + t, next(self.seq), self.on_step_end, inst.index))

    def _begin_run(self, inst: BaseScheduler, now: float, t: float, k: int) -> None:
        """`inst` runs a decode stretch of `k` steps from `now`, the first (just planned)
        priced `t`: price the others at once (clamped at the floor as any step), time them
        as the loop adds them (each end = the previous end + its price), and end the last
        with one event."""
        n = len(inst.decodes)
        times = np.empty(k + 1)
        times[0] = now
        times[1] = t
        raw = times[2:]
        raw[:] = inst.price_run(n, inst.kv_sum + n, k - 1)
        low = raw < inst.floor_s
        if low.any():
            raw[low] = inst.floor_s
            inst.run_clamp = np.cumsum(low)
        else:
            inst.run_clamp = None
        ends = np.cumsum(times)  # sequential sums: the floats `now + t` would give
        inst.run_ends = ends
        inst.run_gen += 1
        heappush(self.heap, (float(ends[k]), next(self.seq), self.on_run_end, (inst, inst.run_gen)))

    def _apply_run(self, inst: BaseScheduler, ends: np.ndarray, j: int) -> None:
        """Apply the first `j` steps of `inst`'s run (`ends`: its start, then its steps'
        ends), and count those priced below the floor up to the one under way."""
        if not j:
            return
        done = ends[1 : j + 1]
        inst.apply_run(j, done, done - ends[:j], float(ends[j]))
        clamp = inst.run_clamp
        if clamp is not None:
            inst.clamped[0] += int(clamp[j - 1])

    def _interrupt(self, inst: BaseScheduler, now: float) -> None:
        """Something is about to touch `inst` at `now`: cut its decode stretch (if any)
        short. The steps ended by `now` are applied, the one under way ends with an event
        of its own and `inst` goes on step by step; a run whose last step ends at `now`
        ends here, as its event would have (a step ending at the instant the touch comes
        counts as ended)."""
        ends = inst.run_ends
        if ends is None:
            return
        inst.run_ends = None
        inst.run_gen += 1
        k = len(ends) - 1
        ended = int(np.searchsorted(ends, now, side="right")) - 1
        if ended >= k:
            self._apply_run(inst, ends, k - 1)
            self.end_step(now, inst.index)
            return
        self._apply_run(inst, ends, ended)
        heappush(self.heap, (float(ends[ended + 1]), next(self.seq), self.on_step_end, inst.index))

    def interrupt_all(self, now: float) -> None:
        """Bring every instance's state up to `now` (cutting decode stretches short)."""
        for inst in self.instances:
            if inst.run_ends is not None:
                self._interrupt(inst, now)

    def _plan(self, inst: BaseScheduler, now: float, idle: bool) -> float | None:
        """`inst`'s next step, with the KV pulls it starts: its price in seconds (as a step
        on an idle engine when `idle`), None when there is nothing to run."""
        if inst.async_admission:  # planned while the step that just ended ran
            inst.admit_cutoff = inst.step_start if inst.busy else now
        load = inst.schedule(now)
        if load is None and inst.async_admission and inst.waiting:
            # Nothing was planned for the next step: the engine plans one as soon as the
            # step ends, with what has arrived meanwhile.
            inst.admit_cutoff = now
            load = inst.schedule(now)
        if inst.pulls:
            self._pull(inst, now)
        if load is None:
            return None
        if self.check:
            inst.check_invariants(load)
        return inst.price_idle(load) if idle else inst.price(load)

    def _start_group(self, group: RankGroup, now: float) -> None:
        """The next lockstep step of a MoE instance's dp ranks: it lasts the longest of the
        ranks' priced steps; ranks with nothing to run take dummy steps (not priced, not
        logged); no rank with work: the group is idle (`optimizer.sim.ranks`)."""
        stepping = group.stepping
        stepping.clear()
        longest = 0.0
        was_idle = not group.ranks[0].busy
        for rank in group.ranks:
            t = self._plan(rank, now, was_idle)
            rank.step_start = now
            if t is not None:
                stepping.append(rank)
                if t > longest:
                    longest = t
        busy = bool(stepping)
        for rank in group.ranks:
            rank.busy = busy
        if busy:
            leader = group.ranks[0].index
            heappush(self.heap, (now + longest, next(self.seq), self.on_step_end, leader))
        elif self.scaler is not None:
            self.scaler.went_idle(group.ranks[0], now)

    def _hand_off(self, prefill: BaseScheduler, r: SimRequest, now: float) -> None:
        """Route a prefilled request to a decode instance (its KV stays where it is); in
        a dynamic fleet with no unit ready, one of its own unit's, which is draining."""
        router = self.back_router
        dst = router.pick() if router.instances else self.scaler.decode_for(prefill)
        r.source = prefill.index
        r.instance = dst.index
        r.remote = True
        self._interrupt(dst, now)
        dst.add_request(r)
        if dst.run_ends is not None:
            self._interrupt(dst, now)
        if not dst.busy:
            self._start(dst, now)

    def _pull(self, decode: BaseScheduler, now: float) -> None:
        """Transfers of the KV `decode` just admitted, each on its prefill instance's link
        (transfers on one link serialise)."""
        for r in decode.pulls:
            src = r.source
            begin = self.link_free[src] if self.link_free[src] > now else now
            cost = self.kv_bytes_per_token * r.num_prompt / self.link_bytes_per_s
            cost += self.link_latency_s
            self.link_free[src] = begin + cost
            self.num_transfers += 1
            self.transfer_s += cost
            heappush(self.heap, (begin + cost, next(self.seq), self.on_kv, r))
        decode.pulls.clear()

    def _next_client(self, now: float, rid: int) -> None:
        """Closed loop: a client whose request `rid` ended (or was rejected) sends its next.
        The warm-up requests go first; the client waits for all of them to end and then
        sends its measured requests as a fresh burst (as aiperf and vllm bench serve do)."""
        if not self.closed:
            return
        t = now + self.think_s + self.turnaround_per_token_s * self.outputs[rid]
        if rid < self.num_warmups:
            self.warmups_left -= 1
            if self.next_rid == self.num_warmups:
                if self.warmups_left == 0:  # the last warm-up: the measured burst
                    for _ in range(self.burst):
                        self._send(t)
                return
        if self.next_rid < self.n:
            self._send(t)

    def _measure_from(self, t: float) -> None:
        """Closed loop with warm-ups: steps and ITL gaps count only when they end after
        `t` (inf until the first measured request is sent, then its send time)."""
        self.unmeasured = t == math.inf
        self.log.measure_from(t)
        for inst in self.instances:
            inst.steps.measure_from(t)

    def _send(self, t: float) -> None:
        if self.release is not None and self.release[self.next_rid] > t:
            t = self.release[self.next_rid]
        heappush(self.heap, (t, next(self.seq), self.on_arrival, self.next_rid))
        self.next_rid += 1


def simulate(
    workload: Workload | ClosedLoopWorkload,
    config: ServingConfig,
    latency: LatencySource,
    *,
    seed: int = 0,
    slo: SLO | None = None,
    draft_latency: LatencySource | None = None,
    force_general: bool = False,
    check_invariants: bool = False,
    jump: bool = True,
) -> SimulationResult:
    """Replay `workload` on `config`: pure, deterministic for a seed, process-pool safe.

    `latency` prices target-model steps per (accelerator, TP) of each role.
    `draft_latency` prices draft-model steps when speculating; without it one
    draft step costs `speculation.draft_relative_cost` x a target decode step.
    Raises `DecodeFloorError` when a latency model's batch-1 decode beats
    weight_bytes / HBM bandwidth; any other step priced below that floor is
    clamped and counted (`num_floor_clamped_steps`). `force_general` visits
    every request every step (the reference path the fast path must match);
    `check_invariants` verifies each planned step's limits and KV block
    accounting (slower; raises `optimizer.sim.scheduler.InvariantError`). `jump`
    advances decode stretches at once (the module docstring; the same results as
    without, which steps one engine iteration per event).
    """
    if not isinstance(workload, (Workload, ClosedLoopWorkload)):
        raise SimulationError(f"workload: expected a Workload, got {type(workload).__name__}")
    if not isinstance(config, ServingConfig):
        raise SimulationError(f"config: expected a ServingConfig, got {type(config).__name__}")
    log = RunLog(len(workload))
    hashes, block_tokens = prefix_hashes(workload, config)
    clamped = [0]
    fleet = build_fleet(
        config, latency, draft_latency, log, seed=seed, longest_request=longest_request(workload),
        hashes=hashes, block_tokens=block_tokens, force_general=force_general, clamped=clamped,
        jump=jump,
    )  # fmt: skip
    loop = _EventLoop(workload, config, fleet, log, check_invariants)
    loop.run()
    return run_result(workload, config, loop, fleet.targets, config.num_gpus, clamped[0], slo)


def _ints(values: np.ndarray) -> array:
    """Per-request integers as a compact array (fast indexing, 8 bytes a value)."""
    return array("q", np.ascontiguousarray(values, dtype=np.int64).tobytes())


def _floats(values: np.ndarray | list[float]) -> array:
    """Per-request floats as a compact array (fast indexing, 8 bytes a value)."""
    return array("d", np.ascontiguousarray(values, dtype=np.float64).tobytes())


def prefix_hashes(
    workload: Workload | ClosedLoopWorkload, config: ServingConfig
) -> tuple[list[list[int]] | None, int]:
    """The requests' prefix hashes as lists when the config caches prefixes (else None),
    and the tokens of one hash block."""
    if config.enable_prefix_caching and workload.prefix_hashes is not None:
        return hashes_as_lists(workload.prefix_hashes), workload.prefix_block_tokens
    return None, 16


def longest_request(workload: Workload | ClosedLoopWorkload) -> int:
    return int((workload.input_tokens + workload.output_tokens).max())


def instance_records(loop: _EventLoop) -> list[InstanceRecord]:
    """What the result needs of each instance of a finished run (plain, picklable data)."""
    records = []
    for inst in loop.instances:
        prefix = inst.prefix
        ratio = None
        if prefix is not None and prefix.num_lookup_tokens:
            ratio = prefix.num_hit_tokens / prefix.num_lookup_tokens
        records.append(InstanceRecord(
            inst.role, inst.index, inst.tp, inst.pool.num_blocks, inst.steps.summary(),
            inst.num_preemptions, ratio, inst.pool.num_used,
        ))  # fmt: skip
    return records


def run_result(
    workload: Workload | ClosedLoopWorkload,
    config: ServingConfig,
    loop: _EventLoop,
    targets: list[StepLatency],
    num_gpus: int,
    num_clamped: int,
    slo: SLO | None,
) -> SimulationResult:
    """The result of a finished run: each instance's record (`targets[i]`: instance i's
    target-model latency) and the requests' figures."""
    return build_result(
        loop.log,
        instance_records(loop),
        first_measured=workload.num_warmups if isinstance(workload, ClosedLoopWorkload) else 0,
        input_tokens=workload.input_tokens,
        output_tokens=workload.output_tokens,
        num_gpus=num_gpus,
        num_floor_clamped_steps=num_clamped,
        slo=slo,
        num_rejected=loop.num_rejected,
        num_kv_transfers=loop.num_transfers,
        kv_transfer_s=loop.transfer_s,
        latency_is_estimate=any(getattr(t, "is_estimate", True) for t in targets),
    )
