"""A plan's independent pieces as parts any process can run: `PlanPart`, one length-mix
bucket's capacity search or one fleet replayed on the whole trace, and `run_plan_part`,
which runs it.

A plan has two stages of independent work: the unit's capacity per length-mix bucket
(one search each), then, once the lower bound and the fleets are sized from those, the
three fleets' replays (static, scheduled, reactive), each a simulation of the whole
trace. `build_plan` hands each stage's parts to a `PartRunner`: by default
`run_plan_part` in this process, one after the other; the service's worker pool instead
queues them as jobs that any worker sharing the database may run
(`api.worker.plan_parts`). A part is a JSON document (`to_dict` / `from_dict`, with a
`schema_version`) carrying what a process holding only the stored trace and the stored
latency models needs to run it: the plan's request (its trace pinned), the unit as
priced, the latency source's label (a part priced by another source must not be mixed
in) and its piece. Its result (`PartResult`) equals the in-process one: the same
simulations on the same inputs.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from optimizer.config import ServingConfig
from optimizer.latency.base import LatencySource
from optimizer.plain import PlainDataError, from_plain, to_plain
from optimizer.plan.capacity import CapacityGroups, LengthBucket, measure_bucket
from optimizer.plan.errors import PlanError
from optimizer.plan.fleets import (
    DynamicReplay,
    FleetKind,
    FleetReplay,
    fleet_from_run,
    replay_dynamic,
)
from optimizer.plan.request import PlanRequest
from optimizer.plan.windows import PlanWindow
from optimizer.search.evaluation import EvalSettings
from optimizer.search.sizing import fleet_of
from optimizer.sim import simulate
from optimizer.sim.parallel import serial_reason, simulate_parallel
from optimizer.sim.scaling import AutoscalerPolicy, ColdStart, FleetRun, ReplicaSchedule
from optimizer.workload import Workload

PLAN_PART_SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class CapacityPart:
    """One length-mix bucket's capacity search: bucket `bucket` of the plan's
    `CapacityGroups` (which give its windows and the sample it is searched on)."""

    bucket: int
    groups: CapacityGroups


@dataclass(frozen=True, slots=True)
class FleetPart:
    """One fleet to replay on the whole trace. Exactly one of `static_units` (a static
    fleet of that many units), `schedule` (the scheduled fleet) and `policy` (the
    reactive fleet's autoscaler) is set, as `kind` says."""

    kind: FleetKind
    note: str  # how the fleet was sized
    static_units: int | None = None
    schedule: ReplicaSchedule | None = None
    policy: AutoscalerPolicy | None = None

    def __post_init__(self) -> None:
        given = {
            FleetKind.STATIC: self.static_units is not None,
            FleetKind.SCHEDULED: self.schedule is not None,
            FleetKind.REACTIVE: self.policy is not None,
        }
        if not given[self.kind] or sum(given.values()) != 1:
            raise PlanError(
                f"plan part: a {self.kind.value} fleet's part gives only its own fleet "
                "(static_units, schedule or policy), got "
                f"{[k.value for k, v in given.items() if v]}"
            )
        if self.static_units is not None and self.static_units < 1:
            raise PlanError(f"plan part: static_units {self.static_units}, expected >= 1")

    @property
    def fixed_units(self) -> int | None:
        """The units of a fleet that can never change size (a static fleet, a schedule of
        one count, an autoscaler whose min equals its max), else None. Such a fleet is
        the static fleet of that many units, replayed alike (`simulate_fleet` replays a
        constant fleet as `simulate` replays the static one)."""
        if self.static_units is not None:
            return self.static_units
        if self.schedule is not None:
            counts = set(self.schedule.counts)
            return counts.pop() if len(counts) == 1 else None
        assert self.policy is not None
        p = self.policy
        return p.min_replicas if p.min_replicas == p.max_replicas else None


@dataclass(frozen=True, slots=True)
class PlanPart:
    """One piece of a plan: exactly one of `capacity` and `fleet`."""

    request: PlanRequest  # the plan's request, its trace pinned (`trace_id`)
    unit: ServingConfig  # as priced by the plan (`PlanRequest.priced`)
    latency: str  # the label of the latency source the plan is priced with
    capacity: CapacityPart | None = None
    fleet: FleetPart | None = None

    def __post_init__(self) -> None:
        if (self.capacity is None) == (self.fleet is None):
            raise PlanError("plan part: expected exactly one of capacity and fleet")

    def describe(self) -> str:
        """What the part computes, for people ("the static fleet's replay")."""
        if self.fleet is not None:
            return f"the {self.fleet.kind.value} fleet's replay"
        assert self.capacity is not None
        return f"length-mix bucket {self.capacity.bucket + 1}'s capacity"

    def to_dict(self) -> dict[str, Any]:
        out = to_plain(self)
        assert isinstance(out, dict)
        return {"schema_version": PLAN_PART_SCHEMA_VERSION, **out}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanPart:
        if not isinstance(data, Mapping):
            raise PlanError(f"plan part: expected a mapping, got {type(data).__name__}")
        data = dict(data)
        version = data.pop("schema_version", None)
        if version != PLAN_PART_SCHEMA_VERSION:
            raise PlanError(
                f"plan part.schema_version: {version!r} is not supported (this build reads "
                f"{PLAN_PART_SCHEMA_VERSION})"
            )
        try:
            built = from_plain(cls, data, "part")
        except (PlainDataError, ValueError) as exc:
            raise PlanError(str(exc)) from None
        assert isinstance(built, PlanPart)
        return built


@dataclass(frozen=True, slots=True)
class PartResult:
    """What a part computed: its bucket's capacity or its fleet's replay."""

    bucket: LengthBucket | None = None
    fleet: FleetReplay | None = None

    def __post_init__(self) -> None:
        if (self.bucket is None) == (self.fleet is None):
            raise PlanError("plan part result: expected exactly one of bucket and fleet")


# Runs a stage's parts, returning their results in order: in process (`run_plan_part` on
# each) or on the worker pool.
PartRunner = Callable[[tuple[PlanPart, ...]], tuple[PartResult, ...]]


@dataclass(frozen=True, slots=True)
class PartInputs:
    """What every part of one plan runs on: the plan's whole trace cut into `windows`,
    the cold start, the latency source, the evaluation settings, and the replay of the
    fleets that change size."""

    workload: Workload
    windows: tuple[PlanWindow, ...]
    cold_start: ColdStart
    latency: LatencySource
    settings: EvalSettings
    dynamic: DynamicReplay


def run_plan_part(part: PlanPart, inputs: PartInputs, *, jobs: int = 1) -> PartResult:
    """The part run on `inputs`: a bucket's capacity by `measure_bucket`, a static
    fleet by `optimizer.sim.simulate` (its replicas over `jobs` forked processes when
    its router allows it: `optimizer.sim.parallel`, the same per-request results), the
    fleets that change size by `inputs.dynamic`."""
    workload, windows = inputs.workload, inputs.windows
    latency, settings = inputs.latency, inputs.settings
    unit = part.unit
    if part.capacity is not None:
        c = part.capacity
        return PartResult(
            bucket=measure_bucket(workload, windows, c.groups, c.bucket, unit, latency, settings)
        )
    fleet = part.fleet
    assert fleet is not None
    if fleet.static_units is not None:
        n = fleet.static_units
        seed, slo = settings.seed, settings.slo
        config = fleet_of(unit, n)
        if jobs > 1 and serial_reason(workload, config) is None:
            result = simulate_parallel(workload, config, latency, jobs=jobs, seed=seed, slo=slo)
        else:
            result = simulate(workload, config, latency, seed=seed, slo=slo)
        run = FleetRun(result, ReplicaSchedule.constant(n), ReplicaSchedule.constant(n), 0)
        return PartResult(
            fleet=fleet_from_run(FleetKind.STATIC, run, windows, unit, settings, fleet.note)
        )
    sized = fleet.schedule if fleet.schedule is not None else fleet.policy
    assert sized is not None
    replay = replay_dynamic(
        fleet.kind,
        inputs.dynamic,
        workload,
        windows,
        unit,
        sized,
        inputs.cold_start,
        latency,
        settings,
        fleet.note,
    )
    return PartResult(fleet=replay)


# Set in the parent before forking; the workers read it (never pickled).
_STAGE: tuple | None = None


def _run_forked(i: int) -> PartResult:
    assert _STAGE is not None
    parts, inputs = _STAGE
    return run_plan_part(parts[i], inputs)


def run_plan_parts(
    parts: tuple[PlanPart, ...], inputs: PartInputs, *, jobs: int = 1
) -> tuple[PartResult, ...]:
    """`run_plan_part` on each of a stage's `parts`, their results in order: over up to
    `jobs` forked processes (Linux; each inherits the trace and the latency tables
    instead of pickling them, and takes the next part when it is done), in this process
    when `jobs` is 1 or the stage has one part (which then spreads its own replicas over
    `jobs`)."""
    global _STAGE
    if not (isinstance(jobs, int) and jobs >= 1):
        raise PlanError(f"--jobs: expected a whole number of processes >= 1, got {jobs!r}")
    if jobs == 1 or len(parts) == 1:
        return tuple(run_plan_part(p, inputs, jobs=jobs) for p in parts)
    _STAGE = (parts, inputs)
    try:
        with multiprocessing.get_context("fork").Pool(min(jobs, len(parts))) as pool:
            return tuple(pool.map(_run_forked, range(len(parts)), chunksize=1))
    finally:
        _STAGE = None
