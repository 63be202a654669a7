"""Fleets of units: a candidate is a unit (one replica, or one group of prefill and
decode instances, with its engine knobs) and the fleet is the unit times N.

N is not searched but sized: `size_fleet` finds the fewest units that meet the
SLOs for `attainment` of the requests, from an estimate (the screen's) up to
what the GPU budget allows; each evaluator says what load it sizes for
(`optimizer.search.trace_evaluator`: the trace's sizing rate;
`optimizer.search.closed_loop`: the benchmark's clients).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from optimizer.config import ServingConfig, ServingMode
from optimizer.search.evaluation import EvalSettings
from optimizer.sim import SimulationResult


def fleet_of(unit: ServingConfig, num_units: int) -> ServingConfig:
    """`num_units` copies of a unit (replicas, or groups of prefill and decode instances)."""
    if unit.mode is ServingMode.COLOCATED:
        return replace(unit, num_replicas=unit.num_replicas * num_units)
    return replace(
        unit, num_prefill=unit.num_prefill * num_units, num_decode=unit.num_decode * num_units
    )


def unit_of(fleet: ServingConfig, num_units: int) -> ServingConfig:
    """One unit of a fleet of `num_units` units (the inverse of `fleet_of`)."""
    counts = (fleet.num_replicas,) if fleet.mode is ServingMode.COLOCATED else (
        fleet.num_prefill, fleet.num_decode)  # fmt: skip
    if num_units < 1 or any(c % num_units for c in counts):
        raise ValueError(f"a fleet of {counts} instances is not {num_units} equal units")
    if fleet.mode is ServingMode.COLOCATED:
        return replace(fleet, num_replicas=fleet.num_replicas // num_units)
    return replace(
        fleet, num_prefill=fleet.num_prefill // num_units, num_decode=fleet.num_decode // num_units
    )


def size_fleet(
    run: Callable[[int], SimulationResult], settings: EvalSettings, start: int, most: int
) -> tuple[int, bool, dict[int, SimulationResult]]:
    """The fewest units that meet the SLOs for the target share, searched from `start`
    (an estimate) up to `most`: grown one at a time while they miss, shrunk at most
    `max_shrink_steps` while they still meet. `run(n)` simulates a fleet of n units.
    Returns the size, whether it meets them (False: `most` units do not) and every run."""
    s = settings
    runs: dict[int, SimulationResult] = {}

    def meets(n: int) -> bool:
        runs[n] = run(n)
        return runs[n].attainment(s.slo) >= s.attainment

    n = min(max(1, start), most)
    ok = meets(n)
    if ok:
        steps = 0
        while n > 1 and steps < s.max_shrink_steps and meets(n - 1):
            n, steps = n - 1, steps + 1
    else:
        while n < most and not ok:
            n += 1
            ok = meets(n)
    return n, ok, runs
