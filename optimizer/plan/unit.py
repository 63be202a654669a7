"""The unit a plan sizes: the user's (`--unit`), the newest stored recommendation for
this trace, model, GPU and SLOs (the service looks it up), or a short screening of the
default search space on the trace's busiest window, as tune's trials screen
(`TraceEvaluator.evaluate`: the unit's capacity on the window's busiest requests and the
units its peak needs): vLLM's defaults and `screen_trials` seeded draws of the space;
the feasible unit with the highest capacity per GPU wins."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from optimizer.config import ConfigError, ServingConfig, ServingMode
from optimizer.latency.base import LatencySource
from optimizer.plan.errors import PlanError
from optimizer.plan.request import PlanRequest
from optimizer.plan.windows import PlanWindow
from optimizer.search.evaluation import Evaluation
from optimizer.search.recommend import baseline_config
from optimizer.search.sizing import unit_of
from optimizer.search.space import build_config, config_key
from optimizer.search.trace_evaluator import TraceEvaluator
from optimizer.workload import Workload


class UnitSource(StrEnum):
    GIVEN = "given"  # --unit
    RECOMMENDATION = "recommendation"  # the newest stored for this trace, model, GPU, SLOs
    SCREENED = "screened"  # the plan's own short screening


@dataclass(frozen=True, slots=True)
class UnitChoice:
    """The unit and why it was taken."""

    config: ServingConfig
    source: UnitSource
    reason: str


@dataclass(slots=True)
class SeededChooser:
    """Uniform seeded choices for `build_config` (a trial without Optuna)."""

    rng: np.random.Generator
    params: dict[str, int] = field(default_factory=dict)

    def index(self, name: str, num_choices: int) -> int:
        i = int(self.rng.integers(num_choices)) if num_choices > 1 else 0
        self.params[name] = i
        return i


def fleet_unit(fleet: ServingConfig) -> ServingConfig:
    """The unit a running fleet repeats: one replica, or the smallest P:D group (a 4P:2D
    fleet is two 2P:1D units)."""
    if fleet.mode is ServingMode.COLOCATED:
        return unit_of(fleet, fleet.num_replicas)
    return unit_of(fleet, math.gcd(fleet.num_prefill, fleet.num_decode))


def describe_unit(unit: ServingConfig) -> str:
    """One line: mode, instances and their knobs."""
    parts = []
    for p in unit.roles():
        inst = p.instance
        parts.append(
            f"{p.count} x {p.role.value} {inst.accelerator} tp={inst.tp}"
            f"{f' dp={inst.dp}' if inst.dp > 1 else ''} "
            f"max_num_batched_tokens={inst.max_num_batched_tokens} "
            f"max_num_seqs={inst.max_num_seqs}"
        )
    spec = unit.speculation.num_speculative_tokens
    extra = f", speculation K={spec}" if spec else ""
    return f"{unit.mode.value}: {'; '.join(parts)}{extra} ({unit.num_gpus} GPUs)"


def screen_unit(
    request: PlanRequest,
    workload: Workload,
    busiest: PlanWindow,
    latency: LatencySource,
) -> UnitChoice:
    """The screened unit (see the module docstring); `PlanError` when none screened is
    feasible on the busiest window within the GPU budget."""
    window = workload.slice(busiest.first, busiest.stop)
    settings = request.eval_settings()
    evaluator = TraceEvaluator.for_trace(window, latency, settings)
    space = request.space(trace_has_prefix_hashes=workload.prefix_hashes is not None)
    candidates: list[tuple[str, ServingConfig]] = []
    with contextlib.suppress(ConfigError):
        candidates.append(("vLLM's defaults", baseline_config(space)))
    rng = np.random.default_rng(request.seed)
    for i in range(request.screen_trials):
        try:
            candidates.append((f"draw {i + 1}", build_config(space, SeededChooser(rng))))
        except ConfigError:
            continue
    seen: set[str] = set()
    scored: list[tuple[str, ServingConfig, Evaluation]] = []
    for name, unit in candidates:
        key = config_key(unit)
        if key in seen:
            continue
        seen.add(key)
        scored.append((name, unit, evaluator.evaluate(unit)))
    feasible = [s for s in scored if s[2].feasible]
    if not feasible:
        raise PlanError(
            f"no unit screened ({len(scored)} of the default space, vLLM's defaults among "
            f"them) meets the SLOs on the busiest {busiest.label()} within --gpus "
            f"{request.gpu_budget}; expected looser SLOs or more GPUs, or give --unit (e.g. "
            "the recommended.yaml of `servetune tune`)"
        )
    name, unit, ev = max(feasible, key=lambda s: (s[2].goodput_per_gpu, -s[1].num_gpus))
    return UnitChoice(
        unit,
        UnitSource.SCREENED,
        f"no stored recommendation for this trace, model, GPU and SLOs: screened "
        f"{len(scored)} units of the default space (vLLM's defaults and "
        f"{request.screen_trials} seeded draws) on the busiest {busiest.label()}; {name} "
        f"has the highest capacity per GPU among the {len(feasible)} feasible "
        f"({ev.goodput_per_gpu:,.2f} req/s per GPU): {describe_unit(unit)}",
    )
