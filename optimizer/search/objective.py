"""Scoring a deployment on a trace: a cheap screen for the search, an exact verification
for the answer.

A candidate is a *unit*: one replica (colocated) or one group of prefill and
decode instances (disaggregated), with its engine knobs. The fleet is the unit
times N, and N is not searched but sized: the fewest units that meet the SLOs at
the trace's sizing rate, its busiest `peak_window_s` rate x `headroom` (at least
its mean rate).

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

Only a config's own invalidity (`ConfigError`: a vLLM rule broken, the model not
fitting, the trace's longest request rejected) makes an `INVALID` evaluation;
any other error propagates (a simulator bug or a missing latency model must not
pass for a bad config). Evaluations are cached per unit within a run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol

import numpy as np

from optimizer.config import ConfigError, ServingConfig, ServingMode
from optimizer.latency.base import LatencySource
from optimizer.search.space import config_key
from optimizer.search.windows import EvaluatedTrace, busiest_start, peak_rate, trace_window
from optimizer.sim import (
    SLO,
    SimulationResult,
    max_request_tokens,
    max_sustainable_rate,
    simulate,
)
from optimizer.workload import Workload


class EvalStatus(StrEnum):
    FEASIBLE = "feasible"  # meets the SLOs at the sizing rate within the GPU budget
    INFEASIBLE = "infeasible"  # needs more GPUs than the budget (or none can meet the SLOs)
    INVALID = "invalid"  # the config breaks a rule, does not fit, or rejects requests


class EvalStage(StrEnum):
    SCREENED = "screened"  # one unit on the screening window: an estimate
    VERIFIED = "verified"  # the whole fleet on the whole trace: what `simulate` gives


class TrialError(RuntimeError):
    """A trial failed for another reason than its config's own invalidity (a simulator bug,
    a missing latency model): the run stops and shows the traceback."""

    def __init__(self, number: int, traceback_text: str) -> None:
        last = traceback_text.strip().splitlines()[-1] if traceback_text.strip() else "?"
        super().__init__(f"trial {number} failed: {last}")
        self.number = number
        self.traceback = traceback_text

    def details(self) -> str:
        return f"{self}\n\n{self.traceback}"


@dataclass(frozen=True, slots=True)
class EvalSettings:
    """How configs are scored.

    `max_requests` cuts the trace to its first requests for everything (None: the
    whole trace, the default); `screen_requests` sizes the screening window (0 or
    at least the trace: trials run on the whole trace too).
    """

    slo: SLO
    attainment: float = 0.9
    gpu_budget: int = 8
    screen_requests: int = 2000
    max_requests: int | None = None
    headroom: float = 1.0
    peak_window_s: float = 60.0
    rel_tol: float = 0.05  # capacity bisection stops when hi / lo <= 1 + rel_tol
    max_simulations: int = 12  # capacity probes per screened unit
    max_shrink_steps: int = 4  # verification: fewer units tried after the estimate holds
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.attainment <= 1:
            raise ValueError(f"attainment: expected a share in (0, 1], got {self.attainment}")
        if self.max_requests is not None and self.max_requests < 10:
            raise ValueError(f"max_requests: expected at least 10, got {self.max_requests}")
        if self.screen_requests < 0:
            raise ValueError(f"screen_requests: expected >= 0, got {self.screen_requests}")
        if not (math.isfinite(self.headroom) and self.headroom >= 1):
            raise ValueError(f"headroom: expected a factor >= 1, got {self.headroom}")
        if not self.peak_window_s > 0:
            raise ValueError(f"peak_window_s: expected > 0, got {self.peak_window_s}")
        if self.gpu_budget < 1:
            raise ValueError(f"gpu_budget: expected >= 1, got {self.gpu_budget}")


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One deployment's figures (rates in requests/s; latencies in ms).

    Screened: `num_units`/`num_gpus` are the estimate for the sizing rate and the
    latencies those of one unit at its share of it on the window. Verified: the
    sized fleet's, on the whole trace at the trace's own rate (`attainment`) and at
    the sizing rate (`sizing_attainment`).
    """

    status: EvalStatus
    stage: EvalStage
    num_gpus: int  # of the sized fleet
    num_units: int = 0
    unit_gpus: int = 0
    price_per_hour: float | None = None  # of the sized fleet (USD), None without prices
    unit_rate: float = 0.0  # one unit's capacity on the screening window
    goodput_per_gpu: float = 0.0  # unit_rate / unit_gpus
    goodput_per_dollar: float | None = None  # unit_rate / the unit's USD per hour
    interactivity_tok_s: float = 0.0  # median output tokens/s per user
    attainment: float = 0.0  # share of requests meeting every SLO
    ttft_attainment: float = 0.0  # share meeting the TTFT SLO alone
    tpot_attainment: float = 0.0  # share meeting the TPOT SLO alone
    sizing_attainment: float = 0.0
    request_goodput: float = 0.0  # requests/s meeting the SLOs
    output_tokens_per_s: float = 0.0
    cost_per_million_output_tokens: float | None = None  # USD, at the trace's rate
    ttft_p50_ms: float = math.nan
    ttft_p90_ms: float = math.nan
    ttft_p99_ms: float = math.nan
    tpot_p50_ms: float = math.nan
    tpot_p90_ms: float = math.nan
    tpot_p99_ms: float = math.nan
    itl_p99_ms: float = math.nan
    num_simulations: int = 0
    bounded: bool = True  # False when a capacity search hit its probe limit
    error: str = ""

    @property
    def feasible(self) -> bool:
        return self.status is EvalStatus.FEASIBLE


@dataclass(slots=True)
class EvaluationCache:
    """Evaluations by canonical config key, for one run (not shared across processes)."""

    entries: dict[str, Evaluation] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0

    def screened(
        self, unit: ServingConfig, screen: Callable[[ServingConfig], Evaluation]
    ) -> Evaluation:
        """`screen(unit)` once per canonical config; a `ConfigError` it raises (the
        config's own invalidity) is an INVALID evaluation, any other error propagates."""
        key = config_key(unit)
        hit = self.entries.get(key)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        try:
            result = screen(unit)
        except ConfigError as exc:
            result = Evaluation(EvalStatus.INVALID, EvalStage.SCREENED, unit.num_gpus,
                                unit_gpus=unit.num_gpus, error=str(exc))  # fmt: skip
        self.entries[key] = result
        return result


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


@dataclass(frozen=True, slots=True)
class TraceEvaluator:
    """Scores units and fleets on one trace with one latency source (pure apart from its
    cache)."""

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

    def _run(self, workload: Workload, config: ServingConfig) -> SimulationResult:
        s = self.settings
        return simulate(workload, config, self.latency, seed=s.seed, slo=s.slo)

    def simulate(self, config: ServingConfig, scale: float = 1.0) -> SimulationResult:
        """`config` on the whole evaluated trace at `scale` x its rate."""
        wl = self.workload if scale == 1.0 else self.workload.rate_scaled(scale)
        return self._run(wl, config)

    def _check_fits(self, unit: ServingConfig) -> None:
        limit = max_request_tokens(unit)
        if limit < self.longest_request_tokens:
            # A deployment that rejects some of the user's requests is never recommended.
            raise ConfigError(
                f"rejects the trace's longest requests ({self.longest_request_tokens} prompt + "
                f"output tokens; this config holds at most {limit})"
            )

    # -- screening ---------------------------------------------------------------------
    def evaluate(self, unit: ServingConfig) -> Evaluation:
        """The screen of `unit`, cached (see the module docstring)."""

        def screen(unit: ServingConfig) -> Evaluation:
            self._check_fits(unit)
            return self._screen(unit)

        return self.cache.screened(unit, screen)

    def _screen(self, unit: ServingConfig) -> Evaluation:
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
            return figures_of(
                EvalStatus.INFEASIBLE, EvalStage.SCREENED, unit, 0, cap.result, rate,
                sims, cap.bounded,
            )  # fmt: skip
        units = max(1, math.ceil(self.evaluated.sizing_rate / rate - 1e-9))
        at = window.rate_scaled(self.evaluated.sizing_rate / units / window.mean_rate)
        share = self._run(at, unit)
        status = EvalStatus.FEASIBLE if units * gpus <= s.gpu_budget else EvalStatus.INFEASIBLE
        return figures_of(status, EvalStage.SCREENED, unit, units, share, rate, sims + 1,
                          cap.bounded)  # fmt: skip

    # -- verification ------------------------------------------------------------------
    def verify(
        self,
        unit: ServingConfig,
        num_units: int = 1,
        *,
        rate_factor: float = 1.0,
        max_gpus: int | None = None,
        screened: Evaluation | None = None,
    ) -> Verified:
        """Size and verify a fleet of `unit` on the whole trace (see the module docstring).

        `num_units` is where the search for the fleet size starts (the screen's
        estimate); `rate_factor` sizes for a multiple of the traffic (capacity
        planning: figures are then those at that multiple); `max_gpus` caps the fleet
        (default: the GPU budget). INFEASIBLE when the cap does not reach; the figures
        are then those of the largest fleet it allows. `screened` carries the unit's
        screened capacity (`unit_rate`, per-GPU and per-dollar goodput) over.
        Raises `ConfigError` when the unit rejects the trace's longest requests.
        """
        self._check_fits(unit)
        s = self.settings
        scale = self.sizing_scale * rate_factor
        cap = s.gpu_budget if max_gpus is None else max_gpus
        most = max(1, cap // unit.num_gpus)
        n, ok, runs = size_fleet(
            lambda units: self.simulate(fleet_of(unit, units), scale), s, num_units, most
        )
        fleet = fleet_of(unit, n)
        sized = runs[n]
        report = sized
        if rate_factor == 1.0 and scale != 1.0:
            report = self.simulate(fleet)  # the trace's own rate: what `simulate` prints
            ok = ok and report.attainment(s.slo) >= s.attainment
        status = EvalStatus.FEASIBLE if ok else EvalStatus.INFEASIBLE
        sims = len(runs) + (report is not sized)
        ev = figures_of(status, EvalStage.VERIFIED, unit, n, report, 0.0, sims, True)
        ev = replace(ev, sizing_attainment=sized.attainment(s.slo))
        if screened is not None:
            ev = replace(
                ev,
                unit_rate=screened.unit_rate,
                goodput_per_gpu=screened.goodput_per_gpu,
                goodput_per_dollar=screened.goodput_per_dollar,
                bounded=screened.bounded,
            )
        return Verified(fleet, ev, report)


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


@dataclass(frozen=True, slots=True)
class Verified:
    """A sized fleet, its verified figures and the simulation they come from."""

    fleet: ServingConfig
    evaluation: Evaluation
    result: SimulationResult


class Evaluator(Protocol):
    """What the search scores with: a trace (`TraceEvaluator`), or a closed-loop benchmark
    (`optimizer.search.closed_loop.ClosedLoopEvaluator`)."""

    settings: EvalSettings
    evaluated: EvaluatedTrace
    cache: EvaluationCache

    def rates(self, result: SimulationResult, factor: float = 1.0) -> tuple[float, float]:
        """The request rates (per second) `result`, a run at `factor` x the traffic, was
        offered and its fleet sized for."""
        ...

    def evaluate(self, unit: ServingConfig) -> Evaluation: ...

    def verify(
        self,
        unit: ServingConfig,
        num_units: int = 1,
        *,
        rate_factor: float = 1.0,
        max_gpus: int | None = None,
        screened: Evaluation | None = None,
    ) -> Verified: ...


def _ms(value: float) -> float:
    return value * 1e3


def figures_of(
    status: EvalStatus,
    stage: EvalStage,
    unit: ServingConfig,
    num_units: int,
    res: SimulationResult,
    unit_rate: float,
    sims: int,
    bounded: bool,
) -> Evaluation:
    slo = res.slo
    assert slo is not None
    tpot = res.tpot_s[~np.isnan(res.tpot_s)]
    tpot = tpot[tpot > 0]
    interactivity = float(np.median(1.0 / tpot)) if tpot.size else 0.0
    unit_gpus = unit.num_gpus
    unit_price = unit.price_per_hour()
    price = unit_price * num_units if unit_price is not None else None
    out_tok_s = res.output_token_throughput
    cost = None
    if price is not None and out_tok_s > 0:
        cost = price / (out_tok_s * 3600) * 1e6
    return Evaluation(
        status=status,
        stage=stage,
        num_gpus=unit_gpus * num_units,
        num_units=num_units,
        unit_gpus=unit_gpus,
        price_per_hour=price,
        unit_rate=unit_rate,
        goodput_per_gpu=unit_rate / unit_gpus,
        goodput_per_dollar=(unit_rate / unit_price) if unit_price else None,
        interactivity_tok_s=interactivity,
        attainment=res.attainment(slo),
        ttft_attainment=float(np.mean(res.ttft_s <= slo.ttft_s)),
        tpot_attainment=float(np.mean(np.isnan(res.tpot_s) | (res.tpot_s <= slo.tpot_s))),
        sizing_attainment=res.attainment(slo),
        request_goodput=res.request_goodput(slo),
        output_tokens_per_s=out_tok_s,
        cost_per_million_output_tokens=cost,
        ttft_p50_ms=_ms(res.ttft.p50),
        ttft_p90_ms=_ms(res.ttft.p90),
        ttft_p99_ms=_ms(res.ttft.p99),
        tpot_p50_ms=_ms(res.tpot.p50),
        tpot_p90_ms=_ms(res.tpot.p90),
        tpot_p99_ms=_ms(res.tpot.p99),
        itl_p99_ms=_ms(res.itl.p99),
        num_simulations=sims,
        bounded=bounded,
    )
