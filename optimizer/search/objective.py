"""Scoring one config on a trace: the numbers a trial reports.

For a config the evaluator (1) simulates a prefix of the evaluation window at
the trace's own rate and prunes the config when SLO attainment is hopeless
there; (2) simulates the whole window at the trace's rate (attainment, TTFT/TPOT
percentiles, request goodput, interactivity); (3) finds the max sustainable
rate (DistServe capacity, `optimizer.sim.max_sustainable_rate`: capped by the
saturation throughput, bracketed and bisected on a log scale), reusing the run
at scale 1.

Why pruning is safe: a config that misses the attainment target at the
trace's rate has a max sustainable rate below that rate, so every config that
meets it (and can be recommended) has a higher per-GPU goodput on the same
GPU budget. Pruned configs are kept as constraint-violating trials so the
sampler still learns from them.

Evaluations are cached per config within a run (`EvaluationCache`): samplers
re-propose configs, and the grid benchmark revisits them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum

import numpy as np

from optimizer.config import RoutingPolicy, ServingConfig, ServingMode
from optimizer.latency.base import LatencySource
from optimizer.search.space import config_key
from optimizer.sim import (
    SLO,
    SimulationResult,
    max_request_tokens,
    max_sustainable_rate,
    simulate,
)
from optimizer.workload import Workload


class EvalStatus(StrEnum):
    FEASIBLE = "feasible"  # meets the attainment target at the trace's rate
    INFEASIBLE = "infeasible"  # simulated in full, misses the target at the trace's rate
    PRUNED = "pruned"  # stopped after the prefix: hopeless at the trace's rate
    INVALID = "invalid"  # the config breaks a rule, does not fit, or the simulator refused it


@dataclass(frozen=True, slots=True)
class EvalSettings:
    """How a config is scored. `max_requests` bounds the evaluation window (the first
    requests of the trace, at the trace's own rate) so that trials stay cheap."""

    slo: SLO
    attainment: float = 0.9
    max_requests: int = 1000
    prefix_fraction: float = 0.3
    prune_margin: float = 0.25  # prune when prefix attainment < target - margin
    rel_tol: float = 0.05  # capacity bisection stops when hi / lo <= 1 + rel_tol
    max_simulations: int = 12  # capacity probes per config
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.attainment <= 1:
            raise ValueError(f"attainment: expected a share in (0, 1], got {self.attainment}")
        if self.max_requests < 10:
            raise ValueError(f"max_requests: expected at least 10, got {self.max_requests}")
        if not 0 < self.prefix_fraction <= 1:
            raise ValueError(f"prefix_fraction: expected (0, 1], got {self.prefix_fraction}")


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One config's predicted metrics (rates in requests/s; latencies in ms)."""

    status: EvalStatus
    num_gpus: int
    price_per_hour: float | None = None
    max_rate: float = 0.0  # fleet requests/s at the attainment target
    goodput_per_gpu: float = 0.0
    goodput_per_dollar: float | None = None  # requests/s per USD/hour
    interactivity_tok_s: float = 0.0  # median output tokens/s per user, at the trace's rate
    attainment: float = 0.0  # at the trace's rate
    request_goodput: float = 0.0  # requests/s meeting the SLOs, at the trace's rate
    ttft_p50_ms: float = math.nan
    ttft_p90_ms: float = math.nan
    ttft_p99_ms: float = math.nan
    tpot_p50_ms: float = math.nan
    tpot_p90_ms: float = math.nan
    tpot_p99_ms: float = math.nan
    itl_p99_ms: float = math.nan
    num_simulations: int = 0
    bounded: bool = True  # False when the capacity search hit its scale limit
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


@dataclass(frozen=True, slots=True)
class TraceEvaluator:
    """Scores configs on one workload with one latency source (pure apart from its cache)."""

    workload: Workload
    latency: LatencySource
    settings: EvalSettings
    cache: EvaluationCache = field(default_factory=EvaluationCache)
    longest_request_tokens: int = 0  # over the whole trace, not just the window

    @classmethod
    def for_trace(
        cls, trace: Workload, latency: LatencySource, settings: EvalSettings
    ) -> TraceEvaluator:
        """Evaluate on the trace's first `settings.max_requests` requests."""
        window = trace.head(settings.max_requests) if len(trace) > settings.max_requests else trace
        longest = int((trace.input_tokens + trace.output_tokens).max())
        return cls(window, latency, settings, longest_request_tokens=longest)

    @property
    def trace_rate(self) -> float:
        return self.workload.mean_rate

    def evaluate(self, config: ServingConfig) -> Evaluation:
        key = config_key(config)
        hit = self.cache.entries.get(key)
        if hit is not None:
            self.cache.hits += 1
            return hit
        self.cache.misses += 1
        try:
            result = self._evaluate(config)
        except (ValueError, LookupError) as exc:  # SimulationError, floor errors, no latency model
            result = Evaluation(EvalStatus.INVALID, config.num_gpus, error=str(exc))
        self.cache.entries[key] = result
        return result

    def simulate(self, config: ServingConfig, scale: float = 1.0) -> SimulationResult:
        """Simulate `config` on the evaluation window at `scale` x the trace's rate."""
        unit, workload, _ = self._unit(config)
        if scale != 1.0:
            workload = workload.rate_scaled(scale)
        return simulate(
            workload, unit, self.latency, seed=self.settings.seed, slo=self.settings.slo
        )

    def _unit(self, config: ServingConfig) -> tuple[ServingConfig, Workload, int]:
        """What is simulated: round-robin colocated replicas are independent, so one replica
        at 1/N of the rate stands for N (N times more requests per replica for the same
        cost); other fleets are simulated whole. Returns (unit, workload, N)."""
        if (
            config.mode is ServingMode.COLOCATED
            and config.routing is RoutingPolicy.ROUND_ROBIN
            and config.num_replicas > 1
        ):
            n = config.num_replicas
            return replace(config, num_replicas=1), self.workload.time_scaled(float(n)), n
        return config, self.workload, 1

    def _evaluate(self, config: ServingConfig) -> Evaluation:
        s = self.settings
        limit = max_request_tokens(config)
        if limit < self.longest_request_tokens:
            # A deployment that rejects some of the user's requests is never recommended.
            return Evaluation(
                EvalStatus.INVALID,
                config.num_gpus,
                error=f"rejects the trace's longest requests ({self.longest_request_tokens} "
                f"prompt + output tokens; this config holds at most {limit})",
            )
        unit, workload, copies = self._unit(config)

        def run(wl: Workload) -> SimulationResult:
            return simulate(wl, unit, self.latency, seed=s.seed, slo=s.slo)

        n_prefix = int(len(workload) * s.prefix_fraction)
        sims = 0
        if 10 <= n_prefix < len(workload):
            head = run(workload.head(n_prefix))
            sims += 1
            if head.attainment(s.slo) < s.attainment - s.prune_margin:
                return _metrics(EvalStatus.PRUNED, config, head, 0.0, sims, True)
        base = run(workload)
        sims += 1
        att = base.attainment(s.slo)
        cap = max_sustainable_rate(
            workload,
            unit,
            self.latency,
            s.slo,
            attainment=s.attainment,
            seed=s.seed,
            rel_tol=s.rel_tol,
            max_simulations=s.max_simulations,
            at_trace_rate=base,
        )
        rate = cap.request_rate * copies
        status = EvalStatus.FEASIBLE if att >= s.attainment else EvalStatus.INFEASIBLE
        return _metrics(status, config, base, rate, sims + cap.num_simulations, cap.bounded)


def _ms(value: float) -> float:
    return value * 1e3


def _metrics(
    status: EvalStatus,
    config: ServingConfig,
    res: SimulationResult,
    max_rate: float,
    sims: int,
    bounded: bool,
) -> Evaluation:
    slo = res.slo
    assert slo is not None
    tpot = res.tpot_s[~np.isnan(res.tpot_s)]
    tpot = tpot[tpot > 0]
    interactivity = float(np.median(1.0 / tpot)) if tpot.size else 0.0
    price = config.price_per_hour()
    gpus = config.num_gpus
    return Evaluation(
        status=status,
        num_gpus=gpus,
        price_per_hour=price,
        max_rate=max_rate,
        goodput_per_gpu=max_rate / gpus,
        goodput_per_dollar=(max_rate / price) if price else None,
        interactivity_tok_s=interactivity,
        attainment=res.attainment(slo),
        request_goodput=res.request_goodput(slo),
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
