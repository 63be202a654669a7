"""`simulate_fleet`: replay a trace on a fleet that changes size (DOMAIN.md §11).

The fleet is made of units of one `ServingConfig` (a replica, or one group of prefill
and decode instances), each in one of four states:

- **starting**: asked for, paid for (provisioned), not serving: it serves after its
  cold start (`ColdStart.total_s`); its instances are built when it is ready (a fresh
  engine: empty KV and prefix caches);
- **ready**: the routers see it (round-robin over the ready units in the order they
  became ready, or the least outstanding tokens among them);
- **draining**: leaving; the routers no longer see it, and it finishes its running and
  waiting requests (vLLM's graceful shutdown), then stops. On a P:D unit a prompt its
  prefill instance finishes goes to a ready unit's decode instance (its own when none
  is ready), and the unit stops once every KV it holds has been pulled;
- **stopped** (or cancelled while starting): no longer paid for.

Asked for fewer units, the fleet removes starting units first (newest first), then
ready ones (the most recently ready first), as a Kubernetes ReplicaSet picks the pods to
delete: not-ready before ready, then the newest. Asked for more, it starts new units
(a draining unit is not taken back).

With no unit ready, an arriving request waits at the front (a gateway's queue, outside
the engines) and goes to the routers, in arrival order, as soon as a unit is ready; its
TTFT counts from its arrival. A request still waiting there when the replay ends (a
schedule that keeps no unit) never gets a token: NaN latencies, an SLO miss.

Two fleets:

- a `ReplicaSchedule`: the desired count set at each of its times (seconds from the
  trace's first arrival); `initial_units` ready at the first arrival, and the schedule's
  own count there applied at once;
- an `AutoscalerPolicy`, as an HPA driven by KEDA's Prometheus trigger (the
  `ScaledObject` of `optimizer.plan.keda`: the gauge summed over the Deployment's pods,
  `metricType: AverageValue`) runs it. Every `sync_period_s` from the first arrival it
  sums the gauge over the units that serve (ready and draining; a starting unit has no
  server to report one) and divides by the units the Deployment counts (starting and
  ready: the HPA's `status.replicas`, terminating pods left out): that mean is the
  `metric` of `AutoscalerPolicy.desired(current, metric)`, which wants
  ceil(sum / target) outside the tolerance. Requests waiting at the front count as
  waiting (the queue of the gateway they wait in; without it a fleet with no unit ready
  would not see its load); with the KV metric they hold no KV and only activate a fleet
  with no unit counted, as KEDA's activation does. A higher
  recommendation is applied at once; a lower one only down to the highest
  recommendation of the last `scale_down_stabilization_s` (the history starts with the
  initial units). The gauge of one unit: running + waiting requests summed over its
  instances (requests whose KV is on its way count as waiting, as vLLM's
  `num_requests_waiting` counts them), or the KV cache's used share averaged over them
  (`kv_cache_usage_perc`). The HPA's default scale-up rate limit (at most double, or
  +4 pods, per 15 s) is not modelled: scale-up is at once. The ticks stop when nothing
  is left to happen.

The run gives back a `FleetRun`: the per-request `SimulationResult` (its `num_gpus` is
the most GPUs the fleet held at once), the units provisioned and ready over time
(`ReplicaSchedule`s from the first arrival), and the cold starts: every unit asked for
after the start, cancelled ones included (they were paid for).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from enum import Enum
from heapq import heappush

from optimizer.config import ServingConfig
from optimizer.latency.base import LatencySource, StepLatency
from optimizer.sim.engine import (
    _EventLoop,
    longest_request,
    prefix_hashes,
    run_result,
)
from optimizer.sim.fleet import Fleet, Router, SimulationError, build_fleet, request_limit
from optimizer.sim.metrics import SLO, RunLog
from optimizer.sim.scaling import (
    AutoscalerPolicy,
    ColdStart,
    FleetRun,
    ReplicaSchedule,
    ScalingError,
    ScalingMetric,
)
from optimizer.sim.scheduler import BaseScheduler
from optimizer.workload import Workload

__all__ = ["simulate_fleet"]


class UnitState(Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


class _Unit:
    """One unit of the fleet; its instances exist once it is ready."""

    __slots__ = ("back_router", "back_units", "front_units", "instances", "state")

    def __init__(self) -> None:
        self.state = UnitState.STARTING
        self.front_units: list[BaseScheduler] = []
        self.back_units: list[BaseScheduler] = []
        self.instances: list[BaseScheduler] = []
        self.back_router: Router | None = None

    def idle(self) -> bool:
        """Nothing left to run, and no KV held for a pull or on its way here."""
        return not any(
            s.busy or s.has_work() or s.in_flight or s.pool.handoff_blocks for s in self.instances
        )


class _DynamicFleet:
    """The units of a replay and their life cycle (the module docstring); the event
    loop's `ScalingHooks`."""

    def __init__(
        self,
        loop: _EventLoop,
        config: ServingConfig,
        build: Callable[[int], Fleet],
        targets: list[StepLatency],
        cold_start_s: float,
        origin_s: float,
    ) -> None:
        self.loop = loop
        self.config = config
        self.build = build
        self.targets = targets
        self.cold_start_s = cold_start_s
        self.origin_s = origin_s
        self.starting: list[_Unit] = []
        self.ready: list[_Unit] = []
        self.draining: list[_Unit] = []
        self.unit_of: list[_Unit] = []  # by instance index
        self.held: list[int] = []  # requests waiting at the front
        self.num_cold_starts = 0
        self.provisioned: list[tuple[float, int]] = [(0.0, 0)]  # (time from origin, units)
        self.ready_counts: list[tuple[float, int]] = [(0.0, 0)]
        self.num_provisioned = 0
        self.peak = 0
        self.on_ready = self.unit_ready
        self.on_count = self.set_count

    # ------------------------------------------------------------------ the loop's hooks

    def hold(self, rid: int) -> None:
        self.held.append(rid)

    def went_idle(self, inst: BaseScheduler, now: float) -> None:
        unit = self.unit_of[inst.index]
        if unit.state is UnitState.DRAINING and unit.idle():
            self._stop(unit, now)

    def decode_for(self, prefill: BaseScheduler) -> BaseScheduler:
        router = self.unit_of[prefill.index].back_router
        assert router is not None
        return router.pick()

    # ------------------------------------------------------------------ life cycle

    def start_ready(self, count: int, now: float) -> None:
        """`count` units ready at `now` (the fleet warm at the trace's start)."""
        for _ in range(count):
            unit = _Unit()
            self._provision(now, +1)
            self._make_ready(unit, now)

    def scale_to(self, count: int, now: float) -> None:
        """Hold `count` units (starting or ready): start or remove the difference."""
        active = len(self.starting) + len(self.ready)
        for _ in range(count - active):
            unit = _Unit()
            self.starting.append(unit)
            self._provision(now, +1)
            self.num_cold_starts += 1
            loop = self.loop
            heappush(loop.heap, (now + self.cold_start_s, next(loop.seq), self.on_ready, unit))
        surplus = active - count
        while surplus > 0 and self.starting:
            self.starting.pop().state = UnitState.STOPPED  # its ready event is ignored
            self._provision(now, -1)
            surplus -= 1
        if surplus > 0:
            for _ in range(surplus):
                unit = self.ready.pop()
                unit.state = UnitState.DRAINING
                self.draining.append(unit)
            self._reroute(now)
            for unit in self.draining[-surplus:]:
                if unit.idle():
                    self._stop(unit, now)

    def set_count(self, now: float, count: int) -> None:
        """A schedule's step (the event's handler)."""
        self.scale_to(count, now)

    def unit_ready(self, now: float, unit: _Unit) -> None:
        """A unit's cold start ends (the event's handler): it joins the routers, and the
        requests waiting at the front go to them."""
        if unit.state is not UnitState.STARTING:
            return  # cancelled while starting
        self.starting.remove(unit)
        self._make_ready(unit, now)
        if self.held:
            loop = self.loop
            for rid in self.held:  # entering together: queued before an idle engine starts
                heappush(loop.heap, (now, next(loop.seq), loop.on_enter, rid))
            self.held.clear()

    def _make_ready(self, unit: _Unit, now: float) -> None:
        loop = self.loop
        first = len(loop.instances)
        fleet = self.build(first)
        unit.front_units, unit.back_units = fleet.front_units, fleet.back_units
        unit.instances = fleet.instances
        unit.back_router = Router(fleet.back_units, self.config.routing)
        unit.state = UnitState.READY
        loop.instances.extend(unit.instances)
        loop.link_free.extend([0.0] * len(unit.instances))
        self.targets.extend(fleet.targets)
        self.unit_of.extend([unit] * len(unit.instances))
        self.ready.append(unit)
        self._reroute(now)

    def _stop(self, unit: _Unit, now: float) -> None:
        unit.state = UnitState.STOPPED
        self.draining.remove(unit)
        self._provision(now, -1)

    def _reroute(self, now: float) -> None:
        self.loop.front_router.route_over([i for u in self.ready for i in u.front_units])
        self.loop.back_router.route_over([i for u in self.ready for i in u.back_units])
        _record(self.ready_counts, now - self.origin_s, len(self.ready))

    def _provision(self, now: float, change: int) -> None:
        self.num_provisioned += change
        self.peak = max(self.peak, self.num_provisioned)
        _record(self.provisioned, now - self.origin_s, self.num_provisioned)

    # ------------------------------------------------------------------ the autoscaler

    def gauge(self, unit: _Unit, metric: ScalingMetric) -> float:
        """`unit`'s vLLM gauge (the module docstring)."""
        if metric is ScalingMetric.RUNNING_WAITING:
            return float(
                sum(
                    s.num_admitted + len(s.waiting) + len(s.ready) + len(s.in_flight)
                    for s in unit.instances
                )
            )
        used = [s.pool.num_used / s.pool.num_blocks for s in unit.instances if s.pool.num_blocks]
        return sum(used) / len(used) if used else 0.0

    def load(self, metric: ScalingMetric) -> tuple[int, float]:
        """(units the Deployment counts, the gauge's mean over them) at this instant (the
        module docstring); with none counted, the gauge's sum."""
        total = sum(self.gauge(u, metric) for u in (*self.ready, *self.draining))
        current = len(self.starting) + len(self.ready)
        if metric is ScalingMetric.RUNNING_WAITING or current == 0:
            total += len(self.held)  # waiting at the front (no KV: for activation only)
        if current == 0:
            return 0, total
        return current, total / current

    def results(self) -> tuple[ReplicaSchedule, ReplicaSchedule]:
        return _schedule(self.provisioned), _schedule(self.ready_counts)


class _Autoscaler:
    """The HPA's loop over a `_DynamicFleet` (the module docstring)."""

    def __init__(self, fleet: _DynamicFleet, policy: AutoscalerPolicy, start_s: float) -> None:
        self.fleet = fleet
        self.policy = policy
        self.history: deque[tuple[float, int]] = deque([(start_s, fleet.num_provisioned)])
        self.on_tick = self.tick

    def recommend(self, now: float) -> int:
        """The count the HPA sets at `now`: its recommendation, scale-downs stabilised."""
        p, fleet = self.policy, self.fleet
        current, metric = fleet.load(p.metric)
        want = p.desired(current, metric)
        self.history.append((now, want))
        cutoff = now - p.scale_down_stabilization_s
        while self.history and self.history[0][0] <= cutoff:
            self.history.popleft()
        if want > current:
            return want
        return min(current, max((r for _, r in self.history), default=want))

    def tick(self, now: float, _payload: object) -> None:
        fleet = self.fleet
        if self.policy.metric is ScalingMetric.KV_USAGE:
            fleet.loop.interrupt_all(now)  # the blocks a decode stretch took by now
        count = self.recommend(now)
        if count != len(fleet.starting) + len(fleet.ready):
            fleet.scale_to(count, now)
        loop = fleet.loop
        if loop.heap:  # something is left to happen
            heappush(loop.heap, (now + self.policy.sync_period_s, next(loop.seq), self.on_tick, 0))


def _record(steps: list[tuple[float, int]], t: float, count: int) -> None:
    """Append a step (a later one at the same time replaces it; an unchanged count is
    not a step)."""
    if steps and steps[-1][0] == t:
        steps.pop()
    if not steps or steps[-1][1] != count:
        steps.append((t, count))


def _schedule(steps: list[tuple[float, int]]) -> ReplicaSchedule:
    return ReplicaSchedule(tuple(t for t, _ in steps), tuple(c for _, c in steps))


def simulate_fleet(
    workload: Workload,
    unit: ServingConfig,
    latency: LatencySource,
    *,
    fleet: ReplicaSchedule | AutoscalerPolicy,
    initial_units: int,
    cold_start: ColdStart,
    seed: int = 0,
    slo: SLO | None = None,
    draft_latency: LatencySource | None = None,
    force_general: bool = False,
    check_invariants: bool = False,
    jump: bool = True,
) -> FleetRun:
    """Replay `workload` on units of `unit` following `fleet` (see the module
    docstring): `initial_units` ready at the first arrival, each unit that joins later
    serving after `cold_start.total_s`. The other arguments are `simulate`'s; with a
    constant schedule and no cold start the per-request results are `simulate`'s on a
    fleet of that many units (`fleet_of`) for round-robin, which routes the same way.
    This is the plan's `DynamicReplay` (`optimizer.plan.fleets`)."""
    if not isinstance(workload, Workload):
        raise SimulationError(
            f"workload: a fleet that changes size replays an open-loop trace (a Workload), "
            f"got {type(workload).__name__}"
        )
    if not isinstance(unit, ServingConfig):
        raise SimulationError(f"unit: expected a ServingConfig, got {type(unit).__name__}")
    if not isinstance(fleet, (ReplicaSchedule, AutoscalerPolicy)):
        raise ScalingError(
            f"fleet: expected a ReplicaSchedule or an AutoscalerPolicy, got {type(fleet).__name__}"
        )
    if not isinstance(cold_start, ColdStart):
        raise ScalingError(f"cold_start: expected a ColdStart, got {type(cold_start).__name__}")
    if not isinstance(initial_units, int) or isinstance(initial_units, bool) or initial_units < 0:
        raise ScalingError(f"initial_units: expected a whole number >= 0, got {initial_units!r}")
    if isinstance(fleet, AutoscalerPolicy) and not (
        fleet.min_replicas <= initial_units <= fleet.max_replicas
    ):
        raise ScalingError(
            f"initial_units: {initial_units} is outside the policy's "
            f"{fleet.min_replicas}-{fleet.max_replicas} units"
        )
    log = RunLog(len(workload))
    hashes, block_tokens = prefix_hashes(workload, unit)
    clamped = [0]
    longest = longest_request(workload)

    def build(first_index: int) -> Fleet:
        return build_fleet(
            unit, latency, draft_latency, log, seed=seed, longest_request=longest, hashes=hashes,
            block_tokens=block_tokens, force_general=force_general, clamped=clamped,
            first_index=first_index, jump=jump,
        )  # fmt: skip

    plans = unit.roles()
    limits = (request_limit(unit, plans[0]), request_limit(unit, plans[-1]))
    empty = Fleet([], [], [], limits[0], limits[1], [], [])
    loop = _EventLoop(workload, unit, empty, log, check_invariants)
    loop.instances = []  # grows as units join
    loop.link_free = []
    targets: list[StepLatency] = []
    origin = float(workload.arrival_s[0]) if len(workload) else 0.0
    dyn = _DynamicFleet(loop, unit, build, targets, cold_start.total_s, origin)
    loop.scaler = dyn
    dyn.start_ready(initial_units, origin)
    if isinstance(fleet, ReplicaSchedule):
        dyn.scale_to(fleet.count_at(0.0), origin)
        for t, count in zip(fleet.times_s, fleet.counts, strict=True):
            if t > 0.0:
                heappush(loop.heap, (origin + t, next(loop.seq), dyn.on_count, count))
    else:
        scaler = _Autoscaler(dyn, fleet, origin)
        heappush(loop.heap, (origin, next(loop.seq), scaler.on_tick, 0))
    loop.run()
    provisioned, ready = dyn.results()
    gpus = unit.num_gpus * max(dyn.peak, 1)
    result = run_result(workload, unit, loop, targets, gpus, clamped[0], slo)
    return FleetRun(result, provisioned, ready, dyn.num_cold_starts)
