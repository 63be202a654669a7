"""Scoring a deployment on a closed loop: `vllm bench serve --max-concurrency C`.

A closed loop's load is set by its clients, not by an arrival rate: C clients,
each sending its next prompt when its previous one finishes (docs/closed-loop.md).
So a fleet is sized for the clients, not for a rate: the fewest units (replicas,
or groups of prefill and decode instances) whose fleet, with the C clients spread
over it by the router, meets the SLOs for `attainment` of the requests. More
units than clients are never tried (a unit with no client is idle).

- `evaluate(unit)` (every trial): that sizing on the screening run, the first
  `screen_requests` prompts (at least four per client; 0: all of them).
- `verify(unit, n)` (the answer's candidates): the same sizing on every prompt,
  starting from the screen's estimate; the figures are those of the sized fleet,
  exactly what `servetune simulate --workload` prints for it (same simulator,
  seed and latency). `rate_factor` scales the clients and the prompts together
  (the capacity plan: GPUs for 2x and 4x the clients).

Per-GPU goodput is the sized fleet's requests/s meeting the SLOs over its GPUs
(`unit_rate`: that goodput per unit): with the clients fixed, a fleet larger than
needed serves the same clients on more GPUs, so the search prefers the smallest
fleet that meets the SLOs and, among those, the fastest.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from optimizer.bench_serve import BenchServeSpec
from optimizer.closed_loop_workload import ClosedLoopWorkload
from optimizer.config import ConfigError, RejectReason, ServingConfig
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
from optimizer.search.windows import EvaluatedTrace, TraceWindow
from optimizer.sim import SimulationResult

MIN_SCREEN_PROMPTS_PER_CLIENT = 4


@dataclass(frozen=True, slots=True)
class ClosedLoopEvaluator(BaseEvaluator):
    """Scores units and fleets on one closed-loop benchmark with one latency source (pure
    apart from its cache); the interface of `TraceEvaluator`."""

    _workload_name: ClassVar[str] = "benchmark"
    spec: BenchServeSpec  # the benchmark as the user runs it (num_prompts cut by max_requests)
    workload: ClosedLoopWorkload  # verified on: every prompt
    screen: ClosedLoopWorkload  # the screening run: its first prompts
    latency: LatencySource
    settings: EvalSettings
    evaluated: EvaluatedTrace
    cache: EvaluationCache = field(default_factory=EvaluationCache)
    longest_request_tokens: int = 0

    @classmethod
    def for_spec(
        cls, spec: BenchServeSpec, latency: LatencySource, settings: EvalSettings
    ) -> ClosedLoopEvaluator:
        if spec.is_open_loop:
            raise ValueError("an open-loop workload is a trace: use TraceEvaluator.for_trace")
        s = settings
        if s.max_requests and s.max_requests < spec.num_prompts:
            spec = replace(spec, num_prompts=s.max_requests)
        whole = spec.build()
        clients = whole.num_clients
        count = len(whole.input_tokens)
        if s.screen_requests:
            count = min(count, max(s.screen_requests, MIN_SCREEN_PROMPTS_PER_CLIENT * clients))
        screen = whole.head(count)
        total = len(whole.input_tokens)
        evaluated = EvaluatedTrace(
            trace=TraceWindow(total, 0.0, 0.0, 0.0),
            screened=TraceWindow(len(screen.input_tokens), 0.0, 0.0, 0.0),
            peak_rate=0.0,
            peak_window_s=s.peak_window_s,
            headroom=1.0,
            sizing_rate=0.0,
            clients=clients,
        )
        longest = int((whole.input_tokens + whole.output_tokens).max())
        return cls(
            spec, whole, screen, latency, settings, evaluated, longest_request_tokens=longest
        )

    @property
    def clients(self) -> int:
        return self.workload.num_clients

    def rates(self, result: SimulationResult, factor: float = 1.0) -> tuple[float, float]:
        """No arrival rate sets a closed loop's load: both are the rate `result`'s fleet
        sustained with `factor` x the clients."""
        del factor  # the run was made with that many clients already
        return result.request_throughput, result.request_throughput

    def scaled(self, factor: float) -> ClosedLoopWorkload:
        """The benchmark with `factor` x the clients and the prompts."""
        if factor == 1.0:
            return self.workload
        clients = max(1, round(self.clients * factor))
        prompts = max(clients, round(self.spec.num_prompts * factor))
        return replace(self.spec, max_concurrency=clients, num_prompts=prompts).build()

    def _size(
        self, unit: ServingConfig, workload: ClosedLoopWorkload, start: int, most: int
    ) -> tuple[int, bool, dict[int, SimulationResult]]:
        """`size_fleet` on `workload`, never more units than its clients."""
        s = self.settings

        def run(n: int) -> SimulationResult:
            return self._run(workload, fleet_of(unit, n))

        return size_fleet(run, s, start, max(1, min(most, workload.num_clients)))

    def _figures(
        self, ok: bool, stage: EvalStage, unit: ServingConfig, n: int, res: SimulationResult,
        sims: int,
    ) -> Evaluation:  # fmt: skip
        s = self.settings
        status = EvalStatus.FEASIBLE if ok else EvalStatus.INFEASIBLE
        unit_rate = res.request_goodput(s.slo) / n
        attained = (attainment_of(res, s.slo, Load.CLIENTS, res.request_throughput),)
        return figures_of(status, stage, unit, n, res, unit_rate, sims, True, attained)

    # -- screening ---------------------------------------------------------------------
    def _screen(self, unit: ServingConfig) -> Evaluation:
        """The unit's fleet sized on the screening run (see the module docstring)."""
        most = self.settings.gpu_budget // unit.num_gpus
        if most < 1:
            raise ConfigError(
                f"needs {unit.num_gpus} GPUs, more than the budget of {self.settings.gpu_budget}",
                RejectReason.BUDGET,
            )
        n, ok, runs = self._size(unit, self.screen, 1, most)
        return self._with_limit(
            self._figures(ok, EvalStage.SCREENED, unit, n, runs[n], len(runs)), ok, n, runs
        )

    # -- verification ------------------------------------------------------------------
    def _verify(
        self, unit: ServingConfig, start: int, rate_factor: float, most: int,
        screened: Evaluation | None,
    ) -> Verified:  # fmt: skip
        """The fleet sized on every prompt (`rate_factor` x the clients and prompts); the
        verified figures are the fleet's own, whatever `screened` says."""
        del screened
        n, ok, runs = self._size(unit, self.scaled(rate_factor), start, most)
        res = runs[n]
        ev = self._figures(ok, EvalStage.VERIFIED, unit, n, res, len(runs))
        return Verified(fleet_of(unit, n), self._with_limit(ev, ok, n, runs), res, res)

    def _with_limit(
        self, ev: Evaluation, ok: bool, n: int, runs: dict[int, SimulationResult]
    ) -> Evaluation:
        """`ev` with its nearest failing point: the fleet with one unit fewer, when tried."""
        if not ok or n - 1 not in runs:
            return ev
        fewer = runs[n - 1]
        rate = fewer.request_throughput
        return replace(ev, limit=attainment_of(fewer, self.settings.slo, Load.CLIENTS, rate))
