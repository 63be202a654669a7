"""The vocabulary of scoring a deployment: settings, evaluations, their cache, the
evaluator interface and the base both evaluators share.

A candidate is a *unit*: one replica (colocated) or one group of prefill and
decode instances (disaggregated), with its engine knobs. The fleet is the unit
times N, and N is not searched but sized (`optimizer.search.sizing`). An evaluator
scores units on a workload: `optimizer.search.trace_evaluator.TraceEvaluator` on
an open-loop trace, `optimizer.search.closed_loop.ClosedLoopEvaluator` on a closed
loop. Each has a cheap screen for the search (`evaluate(unit)`, every trial) and
an exact verification for the answer (`verify(unit, n)`, the answer's candidates).

Only a config's own invalidity (`ConfigError`: a vLLM rule broken, the model not
fitting, the trace's longest request rejected) makes an `INVALID` evaluation;
any other error propagates (a simulator bug or a missing latency model must not
pass for a bad config). Evaluations are cached per unit within a run.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar, Protocol

import numpy as np

from optimizer.closed_loop_workload import ClosedLoopWorkload
from optimizer.config import ConfigError, RejectReason, ServingConfig
from optimizer.latency.base import LatencySource
from optimizer.search.attainment import Attainment, Load
from optimizer.search.space import config_key
from optimizer.search.windows import EvaluatedTrace
from optimizer.sim import SLO, SimulationResult, max_request_tokens, simulate
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
    sized fleet's, on the whole trace at the trace's own rate; `attainments` holds
    each run's attainment with its load (a trace's fleet: at the sizing rate, then at
    the trace's own rate), and `attainment` (derived) is the lowest of them, the one
    that decides whether the deployment meets the target. `limit` is the nearest
    failing point: a screen's lowest probed rate above its capacity; a verified fleet
    that meets the target, the same fleet with one unit fewer, when that was tried.
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
    attainments: tuple[Attainment, ...] = ()
    limit: Attainment | None = None
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
    reject: RejectReason | None = None  # INVALID: why
    # derived: the lowest of `attainments` (None: nothing was run, an invalid config)
    attainment: Attainment | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        lowest = min(self.attainments, key=lambda a: a.share, default=None)
        object.__setattr__(self, "attainment", lowest)

    @property
    def feasible(self) -> bool:
        return self.status is EvalStatus.FEASIBLE

    @property
    def share(self) -> float:
        """The deciding attainment's share (0 when nothing was run)."""
        return self.attainment.share if self.attainment is not None else 0.0

    def at(self, load: Load) -> Attainment | None:
        """The attainment measured at `load`, if any."""
        return next((a for a in self.attainments if a.load is load), None)


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
            result = invalid(unit.num_gpus, exc)
        self.entries[key] = result
        return result


def invalid(num_gpus: int, exc: ConfigError) -> Evaluation:
    """The evaluation of a config that cannot run (`exc` says why)."""
    return Evaluation(
        EvalStatus.INVALID,
        EvalStage.SCREENED,
        num_gpus,
        unit_gpus=num_gpus,
        error=str(exc),
        reject=exc.reason,
    )


@dataclass(frozen=True, slots=True)
class Verified:
    """A sized fleet, its verified figures and the simulation they come from (`result`, at
    the workload's own load), and the run it was sized on (`sized`: at the sizing rate; the
    same run when that is the workload's own load)."""

    fleet: ServingConfig
    evaluation: Evaluation
    result: SimulationResult
    sized: SimulationResult

    def deciding_run(self) -> SimulationResult:
        """The run of the evaluation's deciding (lowest) attainment."""
        att = self.evaluation.attainment
        return self.sized if att is not None and att.load is Load.SIZING else self.result


class Evaluator(Protocol):
    """What the search scores with: a trace (`optimizer.search.trace_evaluator.TraceEvaluator`),
    or a closed-loop benchmark (`optimizer.search.closed_loop.ClosedLoopEvaluator`)."""

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


class BaseEvaluator(ABC):
    """What `TraceEvaluator` and `ClosedLoopEvaluator` share: the fit check, the screens'
    cache and the verification's GPU cap.

    Contract: a subclass (a frozen dataclass) has the fields annotated here, names its
    workload in `_workload_name` ("trace", "benchmark": for the error when a unit
    cannot hold its longest request) and implements `rates`, `_screen` (one unit,
    uncached, its fit checked) and `_verify` (a fleet of the unit sized from `start`
    up to `most` units, its fit checked). It is then an `Evaluator`.
    """

    __slots__ = ()
    _workload_name: ClassVar[str]  # whose longest requests a unit may reject: "trace", ...
    latency: LatencySource
    settings: EvalSettings
    evaluated: EvaluatedTrace
    cache: EvaluationCache
    longest_request_tokens: int

    @abstractmethod
    def rates(self, result: SimulationResult, factor: float = 1.0) -> tuple[float, float]:
        """See `Evaluator.rates`."""

    @abstractmethod
    def _screen(self, unit: ServingConfig) -> Evaluation: ...

    @abstractmethod
    def _verify(
        self, unit: ServingConfig, start: int, rate_factor: float, most: int,
        screened: Evaluation | None,
    ) -> Verified: ...  # fmt: skip

    def _run(
        self, workload: Workload | ClosedLoopWorkload, config: ServingConfig
    ) -> SimulationResult:
        s = self.settings
        return simulate(workload, config, self.latency, seed=s.seed, slo=s.slo)

    def _check_fits(self, unit: ServingConfig) -> None:
        limit = max_request_tokens(unit)
        if limit < self.longest_request_tokens:
            # A deployment that rejects some of the user's requests is never recommended.
            raise ConfigError(
                f"rejects the {self._workload_name}'s longest requests "
                f"({self.longest_request_tokens} prompt + output tokens; this config holds at "
                f"most {limit})",
                RejectReason.REQUESTS,
            )

    # -- screening ---------------------------------------------------------------------
    def evaluate(self, unit: ServingConfig) -> Evaluation:
        """The screen of `unit` (`_screen`), cached (see the subclass's module docstring)."""

        def screen(unit: ServingConfig) -> Evaluation:
            self._check_fits(unit)
            return self._screen(unit)

        return self.cache.screened(unit, screen)

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
        """Size and verify a fleet of `unit` on the whole workload (`_verify`).

        `num_units` is where the search for the fleet size starts (the screen's
        estimate); `rate_factor` sizes for a multiple of the traffic (capacity
        planning: figures are then those at that multiple); `max_gpus` caps the fleet
        (default: the GPU budget). INFEASIBLE when the cap does not reach; the figures
        are then those of the largest fleet it allows. `screened` is the unit's screen.
        Raises `ConfigError` when the unit rejects the workload's longest requests.
        """
        self._check_fits(unit)
        cap = self.settings.gpu_budget if max_gpus is None else max_gpus
        return self._verify(unit, num_units, rate_factor, max(1, cap // unit.num_gpus), screened)


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
    attainments: tuple[Attainment, ...],
) -> Evaluation:
    """The figures of `res`, a run of `num_units` x `unit`; `attainments` are the
    attainments that decide `status`, each with its load (`res`'s among them)."""
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
    slo = res.slo
    assert slo is not None
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
        attainments=attainments,
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
