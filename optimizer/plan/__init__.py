"""Fleet plans over time (DOMAIN.md §11): a trace cut into windows, one unit's
SLO-bounded capacity per length mix, the perfect-system lower bound per window, the
static, scheduled and reactive fleets, and the reactive policy as a KEDA ScaledObject.

`check_inputs(request, trace)` refuses bad input before any simulation;
`build_plan(request, trace, checked, unit, latency, ...)` makes the `FleetPlan`; its
capacity searches and fleet replays are `PlanPart`s, run in process or as jobs
(`run_parts`). The unit comes from `--unit`, a stored recommendation
(`api.services.planning` looks it up) or `screen_unit`. Pure: no storage, api or torch.
"""

from optimizer.plan.build import CheckedInput, build_plan, check_inputs
from optimizer.plan.errors import PlanError
from optimizer.plan.fleets import DynamicReplay, FleetKind, FleetReplay
from optimizer.plan.keda import keda_yaml
from optimizer.plan.outcome import FleetPlan
from optimizer.plan.parts import (
    CapacityPart,
    FleetPart,
    PartInputs,
    PartResult,
    PartRunner,
    PlanPart,
    run_plan_part,
)
from optimizer.plan.request import PlanProgress, PlanRequest
from optimizer.plan.unit import UnitChoice, UnitSource, screen_unit

__all__ = [
    "CapacityPart",
    "CheckedInput",
    "DynamicReplay",
    "FleetKind",
    "FleetPart",
    "FleetPlan",
    "FleetReplay",
    "PartInputs",
    "PartResult",
    "PartRunner",
    "PlanError",
    "PlanPart",
    "PlanProgress",
    "PlanRequest",
    "UnitChoice",
    "UnitSource",
    "build_plan",
    "check_inputs",
    "keda_yaml",
    "run_plan_part",
    "screen_unit",
]
