"""A plan's fleet replays as `PlanPart` documents: a part read back from its JSON
replays to the same fleet, so a plan whose parts ran from their documents (as workers
run them) equals the plan made in one process; a part names exactly its own fleet."""

from __future__ import annotations

import json

import pytest

from optimizer.plan import (
    FleetKind,
    FleetReplay,
    PlanError,
    PlanPart,
    build_plan,
    check_inputs,
    run_fleet_part,
)
from optimizer.plan.unit import UnitChoice, UnitSource
from optimizer.search.outcome import LatencyInfo
from optimizer.sim.dynamic import simulate_fleet
from optimizer.sim.scaling import ReplicaSchedule
from tests.optimizer_tests.test_plan_build import LAT, UNIT, _request, _trace


def test_parts_run_from_their_documents_make_the_in_process_plan() -> None:
    trace, request = _trace(), _request(trace_id=7)
    checked = check_inputs(request, trace)
    unit = UnitChoice(UNIT, UnitSource.GIVEN, "given")
    info = LatencyInfo("linear", True)
    seen: list[PlanPart] = []

    def from_documents(parts: tuple[PlanPart, ...]) -> tuple[FleetReplay, ...]:
        out = []
        for part in parts:
            read = PlanPart.from_dict(json.loads(json.dumps(part.to_dict())))
            assert read == part
            seen.append(read)
            out.append(
                run_fleet_part(
                    read,
                    trace,
                    checked.windows,
                    checked.cold_start,
                    LAT,
                    request.eval_settings(),
                    simulate_fleet,
                )
            )
        return tuple(out)

    here = build_plan(request, trace, checked, unit, LAT, info)
    apart = build_plan(request, trace, checked, unit, LAT, info, run_fleets=from_documents)
    assert apart.to_dict() == here.to_dict()
    assert [p.kind for p in seen] == [FleetKind.STATIC, FleetKind.SCHEDULED, FleetKind.REACTIVE]
    assert {p.latency for p in seen} == {"linear"} and all(p.request == request for p in seen)
    assert seen[0].static_units == here.fleets[0].peak_units


def test_a_runner_that_loses_a_fleet_is_refused() -> None:
    trace, request = _trace(), _request()
    checked = check_inputs(request, trace)
    unit = UnitChoice(UNIT, UnitSource.GIVEN, "given")
    here = build_plan(request, trace, checked, unit, LAT, LatencyInfo("linear", True))
    with pytest.raises(ValueError, match=r"returned \['static', 'static'\], expected"):
        build_plan(
            request,
            trace,
            checked,
            unit,
            LAT,
            LatencyInfo("linear", True),
            run_fleets=lambda _parts: (here.fleets[0], here.fleets[0]),
        )


def test_a_part_names_exactly_its_own_fleet() -> None:
    request = _request()
    with pytest.raises(PlanError, match="a static fleet's part gives only its own fleet"):
        PlanPart(request, UNIT, "l", FleetKind.STATIC, "n", schedule=ReplicaSchedule.constant(1))
    with pytest.raises(PlanError, match=r"got \['static', 'scheduled'\]"):
        PlanPart(
            request,
            UNIT,
            "l",
            FleetKind.SCHEDULED,
            "n",
            static_units=1,
            schedule=ReplicaSchedule.constant(1),
        )
    with pytest.raises(PlanError, match="static_units 0, expected >= 1"):
        PlanPart(request, UNIT, "l", FleetKind.STATIC, "n", static_units=0)
    doc = PlanPart(request, UNIT, "l", FleetKind.STATIC, "n", static_units=1).to_dict()
    assert doc["schema_version"] == 1
    with pytest.raises(PlanError, match=r"plan part\.schema_version: 2 is not supported"):
        PlanPart.from_dict({**doc, "schema_version": 2})
    with pytest.raises(PlanError, match="part: unknown keys"):
        PlanPart.from_dict({**doc, "units": 3})
