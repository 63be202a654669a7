"""A plan's pieces as `PlanPart` documents: a part read back from its JSON runs to the
same result, so a plan whose parts ran from their documents (as workers run them) equals
the plan made in one process; a part names exactly its own piece."""

from __future__ import annotations

import json

import pytest

from optimizer.plan import (
    FleetKind,
    FleetPart,
    PartInputs,
    PartResult,
    PlanError,
    PlanPart,
    build_plan,
    check_inputs,
    run_plan_part,
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

    def from_documents(parts: tuple[PlanPart, ...]) -> tuple[PartResult, ...]:
        out = []
        for part in parts:
            read = PlanPart.from_dict(json.loads(json.dumps(part.to_dict())))
            assert read == part
            seen.append(read)
            inputs = PartInputs(
                trace, checked.windows, checked.cold_start, LAT, request.eval_settings(),
                simulate_fleet,
            )  # fmt: skip
            out.append(run_plan_part(read, inputs))
        return tuple(out)

    here = build_plan(request, trace, checked, unit, LAT, info)
    apart = build_plan(request, trace, checked, unit, LAT, info, run_parts=from_documents)
    assert apart.to_dict() == here.to_dict()
    buckets = [p.capacity for p in seen if p.capacity is not None]
    fleets = [p.fleet for p in seen if p.fleet is not None]
    # Two length mixes: two capacity searches, then the three fleets.
    assert [c.bucket for c in buckets] == [0, 1] == [b.index for b in here.bucketing.buckets]
    assert [f.kind for f in fleets] == [FleetKind.STATIC, FleetKind.SCHEDULED, FleetKind.REACTIVE]
    assert seen[: len(buckets)] == [p for p in seen if p.capacity is not None]
    assert {p.latency for p in seen} == {"linear"} and all(p.request == request for p in seen)
    assert fleets[0].static_units == here.fleets[0].peak_units


def test_a_runner_that_answers_other_parts_is_refused() -> None:
    trace, request = _trace(), _request()
    checked = check_inputs(request, trace)
    unit = UnitChoice(UNIT, UnitSource.GIVEN, "given")
    here = build_plan(request, trace, checked, unit, LAT, LatencyInfo("linear", True))
    first = PartResult(bucket=here.bucketing.buckets[0])
    with pytest.raises(ValueError, match="did not answer \\[\"length-mix bucket 1's capacity"):
        build_plan(
            request,
            trace,
            checked,
            unit,
            LAT,
            LatencyInfo("linear", True),
            run_parts=lambda parts: (first,) * len(parts),
        )


def test_a_part_names_exactly_its_own_piece() -> None:
    request = _request()
    one = ReplicaSchedule.constant(1)
    with pytest.raises(PlanError, match="a static fleet's part gives only its own fleet"):
        FleetPart(FleetKind.STATIC, "n", schedule=one)
    with pytest.raises(PlanError, match=r"got \['static', 'scheduled'\]"):
        FleetPart(FleetKind.SCHEDULED, "n", static_units=1, schedule=one)
    with pytest.raises(PlanError, match="static_units 0, expected >= 1"):
        FleetPart(FleetKind.STATIC, "n", static_units=0)
    with pytest.raises(PlanError, match="expected exactly one of capacity and fleet"):
        PlanPart(request, UNIT, "l")
    fleet = FleetPart(FleetKind.STATIC, "n", static_units=1)
    doc = PlanPart(request, UNIT, "l", fleet=fleet).to_dict()
    assert doc["schema_version"] == 1
    with pytest.raises(PlanError, match=r"plan part\.schema_version: 2 is not supported"):
        PlanPart.from_dict({**doc, "schema_version": 2})
    with pytest.raises(PlanError, match="part: unknown keys"):
        PlanPart.from_dict({**doc, "units": 3})
