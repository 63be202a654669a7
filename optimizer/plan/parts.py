"""A plan's fleet replays as parts any process can run: `PlanPart`, one fleet replayed
on the whole trace, and `run_fleet_part`, which replays it.

The three fleets of a plan (static, scheduled, reactive) are sized in order, but once
sized each replay is an independent simulation over the whole trace. `build_plan` hands
the three parts to a `FleetRunner`: by default `run_fleet_part` in this process, one
after the other; the service's worker pool instead queues them as jobs that any worker
sharing the database may run (`api.worker.plan_parts`). A part is a JSON document
(`to_dict` / `from_dict`, with a `schema_version`) carrying what a process holding only
the stored trace and the stored latency models needs to replay it: the plan's request
(its trace pinned), the unit as priced, the latency source's label (a part priced by
another source must not be mixed in) and the fleet. The replay from a part equals the
replay in process: the same simulation on the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from optimizer.config import ServingConfig
from optimizer.latency.base import LatencySource
from optimizer.plain import PlainDataError, from_plain, to_plain
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
from optimizer.sim.scaling import AutoscalerPolicy, ColdStart, FleetRun, ReplicaSchedule
from optimizer.workload import Workload

PLAN_PART_SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class PlanPart:
    """One fleet of a plan, to be replayed on the whole trace. Exactly one of
    `static_units` (a static fleet of that many units), `schedule` (the scheduled fleet)
    and `policy` (the reactive fleet's autoscaler) is set, as `kind` says."""

    request: PlanRequest  # the plan's request, its trace pinned (`trace_id`)
    unit: ServingConfig  # as priced by the plan (`PlanRequest.priced`)
    latency: str  # the label of the latency source the plan is priced with
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


# Replays a plan's parts, in their order: in process (`run_fleet_part` on each) or on
# the worker pool.
FleetRunner = Callable[[tuple[PlanPart, ...]], tuple[FleetReplay, ...]]


def run_fleet_part(
    part: PlanPart,
    workload: Workload,
    windows: tuple[PlanWindow, ...],
    cold_start: ColdStart,
    latency: LatencySource,
    settings: EvalSettings,
    dynamic: DynamicReplay,
) -> FleetReplay:
    """The part's fleet replayed on `workload` (the plan's whole trace, cut into
    `windows`): a static fleet by `optimizer.sim.simulate`, the others by `dynamic`."""
    unit = part.unit
    if part.static_units is not None:
        n = part.static_units
        seed, slo = settings.seed, settings.slo
        result = simulate(workload, fleet_of(unit, n), latency, seed=seed, slo=slo)
        run = FleetRun(result, ReplicaSchedule.constant(n), ReplicaSchedule.constant(n), 0)
        return fleet_from_run(FleetKind.STATIC, run, windows, unit, settings, part.note)
    fleet = part.schedule if part.schedule is not None else part.policy
    assert fleet is not None
    return replay_dynamic(
        part.kind, dynamic, workload, windows, unit, fleet, cold_start, latency, settings, part.note
    )
