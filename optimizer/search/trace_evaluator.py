"""Scoring a deployment on a trace: a cheap screen for the search, an exact verification
for the answer.

A candidate is a unit (`optimizer.search.evaluation`); its fleet is sized for the
trace's sizing rate, its busiest `peak_window_s` rate x `headroom` (at least its
mean rate).

- `screen(unit)` (every trial): the unit's capacity (DistServe's max sustainable
  rate, `optimizer.sim.max_sustainable_rate`) on the screening window, the
  busiest `screen_requests` consecutive requests of the trace; from it the units
  needed, N = ceil(sizing rate / capacity), and one run of the unit at its share
  of the sizing rate for latencies and interactivity. An estimate: units sharing
  a fleet see thinned arrivals, and the window is not the whole trace.
- `verify(unit, n)` (the answer's candidates): the whole fleet, every instance
  with its routing, on the whole trace: N grows until the fleet meets the
  attainment target at the sizing rate and at the trace's own rate, then shrinks
  while it still does. The figures reported are those of the run of the sized
  fleet on the whole trace at the trace's own rate, exactly what `servetune
  simulate` prints for the recommended config (same simulator, seed, latency).

A unit that rejects the trace's longest request is `INVALID`; evaluations are
cached per unit within a run (`BaseEvaluator`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import ClassVar

from optimizer.config import ServingConfig
from optimizer.latency.base import LatencySource
from optimizer.search.attainment import Load, attainment_of
from optimizer.search.evaluation import (
    BaseEvaluator,
    EvalSettings,
    EvalStage,
    EvalStatus,
    Evaluation,
    EvaluationCache,
    Verified,
    figures_of,
)
from optimizer.search.sizing import fleet_of, size_fleet
from optimizer.search.windows import (
    EvaluatedTrace,
    busiest_start,
    longer_peak_rates,
    peak_rate,
    trace_window,
)
from optimizer.sim import SimulationResult, max_sustainable_rate
from optimizer.workload import Workload


@dataclass(frozen=True, slots=True)
class TraceEvaluator(BaseEvaluator):
    """Scores units and fleets on one trace with one latency source (pure apart from its
    cache)."""

    _workload_name: ClassVar[str] = "trace"
    workload: Workload  # verified on (the trace, or its first max_requests)
    screen: Workload  # the screening window
    latency: LatencySource
    settings: EvalSettings
    evaluated: EvaluatedTrace
    cache: EvaluationCache = field(default_factory=EvaluationCache)
    longest_request_tokens: int = 0  # over the whole trace, not just the window

    @classmethod
    def for_trace(
        cls, trace: Workload, latency: LatencySource, settings: EvalSettings
    ) -> TraceEvaluator:
        s = settings
        whole = trace.head(s.max_requests) if s.max_requests else trace
        start = busiest_start(whole.arrival_s, s.screen_requests)
        screen, offset = whole, 0.0
        if start is not None:
            screen = whole.slice(start, start + s.screen_requests)
            offset = float(whole.arrival_s[start] - whole.arrival_s[0])
        peak = peak_rate(whole.arrival_s, s.peak_window_s)
        mean = whole.mean_rate
        sizing = max(mean, peak if math.isfinite(peak) else mean) * s.headroom
        evaluated = EvaluatedTrace(
            trace=trace_window(whole, 0.0),
            screened=trace_window(screen, offset),
            peak_rate=peak if math.isfinite(peak) else mean,
            peak_window_s=s.peak_window_s,
            headroom=s.headroom,
            sizing_rate=sizing,
            peak_rates=tuple(
                (w, max(mean, r) * s.headroom)
                for w, r in longer_peak_rates(whole.arrival_s, s.peak_window_s)
            ),
        )
        longest = int((trace.input_tokens + trace.output_tokens).max())
        return cls(whole, screen, latency, settings, evaluated, longest_request_tokens=longest)

    @property
    def trace_rate(self) -> float:
        return self.workload.mean_rate

    def rates(self, result: SimulationResult, factor: float = 1.0) -> tuple[float, float]:
        """The trace's mean rate and the sizing rate, at `factor` x the traffic."""
        del result  # a trace's rates are its own, whatever the fleet did
        return self.trace_rate * factor, self.evaluated.sizing_rate * factor

    @property
    def sizing_scale(self) -> float:
        """The rate multiplier that turns the trace's mean rate into the sizing rate."""
        return self.evaluated.sizing_rate / self.trace_rate

    def simulate(self, config: ServingConfig, scale: float = 1.0) -> SimulationResult:
        """`config` on the whole evaluated trace at `scale` x its rate."""
        wl = self.workload if scale == 1.0 else self.workload.rate_scaled(scale)
        return self._run(wl, config)

    # -- screening ---------------------------------------------------------------------
    def _screen(self, unit: ServingConfig) -> Evaluation:
        """The unit's capacity on the screening window and the units the sizing rate needs
        (see the module docstring)."""
        s = self.settings
        window = self.screen
        cap = max_sustainable_rate(
            window, unit, self.latency, s.slo, attainment=s.attainment, seed=s.seed,
            rel_tol=s.rel_tol, max_simulations=s.max_simulations,
        )  # fmt: skip
        sims = cap.num_simulations
        rate = cap.request_rate
        gpus = unit.num_gpus
        if rate <= 0:
            lowest = attainment_of(cap.result, s.slo, Load.SCREEN, cap.result_rate)
            return figures_of(
                EvalStatus.INFEASIBLE, EvalStage.SCREENED, unit, 0, cap.result, rate,
                sims, cap.bounded, (lowest,),
            )  # fmt: skip
        units = max(1, math.ceil(self.evaluated.sizing_rate / rate - 1e-9))
        share_rate = self.evaluated.sizing_rate / units
        at = window.rate_scaled(share_rate / window.mean_rate)
        share = self._run(at, unit)
        status = EvalStatus.FEASIBLE if units * gpus <= s.gpu_budget else EvalStatus.INFEASIBLE
        attained = (attainment_of(share, s.slo, Load.SCREEN, share_rate),)
        ev = figures_of(status, EvalStage.SCREENED, unit, units, share, rate, sims + 1,
                        cap.bounded, attained)  # fmt: skip
        if cap.limit is None:  # the capacity is the unit's saturation throughput
            return ev
        return replace(ev, limit=attainment_of(cap.limit, s.slo, Load.SCREEN, cap.limit_rate))

    # -- verification ------------------------------------------------------------------
    def _verify(
        self, unit: ServingConfig, start: int, rate_factor: float, most: int,
        screened: Evaluation | None,
    ) -> Verified:  # fmt: skip
        """The fleet sized at the sizing rate (x `rate_factor`) on the whole trace (see the
        module docstring); `screened` carries the unit's screened capacity (`unit_rate`,
        per-GPU and per-dollar goodput) over."""
        s = self.settings
        scale = self.sizing_scale * rate_factor
        n, ok, runs = size_fleet(
            lambda units: self.simulate(fleet_of(unit, units), scale), s, start, most
        )
        fleet = fleet_of(unit, n)
        sized = runs[n]
        report = sized
        sizing_rate = self.evaluated.sizing_rate * rate_factor
        load = Load.TRACE if scale == 1.0 else Load.SIZING
        attained = [attainment_of(sized, s.slo, load, sizing_rate)]
        if rate_factor == 1.0 and scale != 1.0:
            report = self.simulate(fleet)  # the trace's own rate: what `simulate` prints
            ok = ok and report.attainment(s.slo) >= s.attainment
            attained.append(attainment_of(report, s.slo, Load.TRACE, self.trace_rate))
        status = EvalStatus.FEASIBLE if ok else EvalStatus.INFEASIBLE
        sims = len(runs) + (report is not sized)
        ev = figures_of(status, EvalStage.VERIFIED, unit, n, report, 0.0, sims, True,
                        tuple(attained))  # fmt: skip
        if ok and n - 1 in runs:  # the nearest failing point: one unit fewer
            ev = replace(ev, limit=attainment_of(runs[n - 1], s.slo, load, sizing_rate))
        if screened is not None:
            ev = replace(
                ev,
                unit_rate=screened.unit_rate,
                goodput_per_gpu=screened.goodput_per_gpu,
                goodput_per_dollar=screened.goodput_per_dollar,
                bounded=screened.bounded,
            )
        return Verified(fleet, ev, report, sized)
