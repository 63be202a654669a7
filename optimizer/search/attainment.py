"""Attainment with its load: the share of requests that met the SLOs in one run, and the
traffic that run had. Every attainment the outcome states is one of these, so no share
is ever printed without the rate it was measured at."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from optimizer.sim import SLO, SimulationResult


class Load(StrEnum):
    """The traffic an attainment was measured at (`Attainment.rate` says how much)."""

    TRACE = "trace"  # the whole trace at its own arrival rate
    SIZING = "sizing"  # the whole trace, its rate scaled to the sizing rate (peak x headroom)
    CLIENTS = "clients"  # a closed loop: the benchmark's clients
    SCREEN = "screen"  # one unit on the screening window, at `rate`


@dataclass(frozen=True, slots=True)
class Attainment:
    """The share of requests that met the SLOs in one run, and the traffic of that run:
    every attainment the outcome states comes with the load it was measured at."""

    load: Load
    rate: float  # requests/s offered to the deployment evaluated (a closed loop: served)
    share: float  # meeting every SLO
    ttft_share: float  # meeting the TTFT SLO alone
    tpot_share: float  # meeting the TPOT SLO alone (requests without a TPOT count as met)
    e2e_share: float | None = None  # meeting the E2E SLO alone, when one is set

    def alone(self) -> tuple[tuple[str, float], ...]:
        """(SLO name, share meeting it alone) for each SLO, weakest first."""
        pairs = [("TTFT", self.ttft_share), ("TPOT", self.tpot_share)]
        if self.e2e_share is not None:
            pairs.append(("E2E", self.e2e_share))
        return tuple(sorted(pairs, key=lambda p: p[1]))


def attainment_of(res: SimulationResult, slo: SLO, load: Load, rate: float) -> Attainment:
    """`res`'s attainment of `slo`, measured at `load` (`rate` requests/s)."""
    e2e = None if slo.e2e_s is None else float(np.mean(res.e2e_s <= slo.e2e_s))
    return Attainment(
        load=load,
        rate=rate,
        share=res.attainment(slo),
        ttft_share=float(np.mean(res.ttft_s <= slo.ttft_s)),
        tpot_share=float(np.mean(np.isnan(res.tpot_s) | (res.tpot_s <= slo.tpot_s))),
        e2e_share=e2e,
    )


@dataclass(frozen=True, slots=True)
class SLOThreshold:
    """The loosest value of one SLO at which a run stops meeting the target share, the
    others as asked: the run meets the target with this SLO at `value_ms` or above (None:
    no value of this SLO is enough, the others alone leave fewer than the target)."""

    metric: str  # "TTFT", "TPOT" or "E2E"
    value_ms: float | None
    others_share: float  # the share meeting every other SLO


def slo_thresholds(res: SimulationResult, slo: SLO, target: float) -> tuple[SLOThreshold, ...]:
    """For each SLO of `slo`: the smallest value at which `res` still has `target` of its
    requests meeting every SLO, the others as asked (exact for this run: its requests'
    own latencies, no new simulation)."""
    n = len(res.ttft_s)
    need = max(1, math.ceil(target * n - 1e-9))
    ttft_ok = res.ttft_s <= slo.ttft_s
    tpot_ok = np.isnan(res.tpot_s) | (res.tpot_s <= slo.tpot_s)
    e2e_ok = np.ones(n, dtype=bool) if slo.e2e_s is None else res.e2e_s <= slo.e2e_s
    # A request that never finished (NaN) meets no value of any SLO.
    tpot = np.where(np.isnan(res.tpot_s) & ~np.isnan(res.e2e_s), 0.0, res.tpot_s)
    metrics = [("TTFT", res.ttft_s, tpot_ok & e2e_ok), ("TPOT", tpot, ttft_ok & e2e_ok)]
    if slo.e2e_s is not None:
        metrics.append(("E2E", res.e2e_s, ttft_ok & tpot_ok))
    out = []
    for name, values, others in metrics:
        candidates = np.sort(values[others & ~np.isnan(values)])
        value = float(candidates[need - 1]) * 1e3 if candidates.size >= need else None
        out.append(SLOThreshold(name, value, float(others.mean()) if n else 0.0))
    return tuple(out)
