"""From finished trials to answers: the Pareto front, the recommendation, the baseline.

The recommendation is the config with the highest per-GPU (or per-dollar)
goodput among those that meet the attainment target at the trace's own rate;
goodputs within `tie_tol` of the best count as ties, which go to fewer GPUs
(then to higher interactivity). The baseline is the engine's untuned defaults
(DOMAIN.md §5): vLLM's 8192 batched tokens / 1024 seqs on H100/H200, 2048 /
256 elsewhere, chunked prefill on, no speculation, colocated, TP 1 (or the
smallest TP the model fits at).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from optimizer.config import ConfigError, InstanceConfig, ServingConfig
from optimizer.search.objective import EvalStatus, Evaluation
from optimizer.search.space import SearchSpace, config_key

_BIG_GPUS = ("h100", "h200")


@dataclass(frozen=True, slots=True)
class TrialOutcome:
    """A finished trial as the recommender sees it."""

    number: int
    config: ServingConfig
    evaluation: Evaluation


@dataclass(frozen=True, slots=True)
class ParetoRow:
    trial: int
    config: ServingConfig
    predicted: Evaluation

    @property
    def meets_slo(self) -> bool:
        return self.predicted.feasible


def _objective(ev: Evaluation, per_dollar: bool) -> float:
    return (ev.goodput_per_dollar or 0.0) if per_dollar else ev.goodput_per_gpu


def pareto_front(outcomes: Sequence[TrialOutcome], *, per_dollar: bool = False) -> list[ParetoRow]:
    """Non-dominated (goodput, interactivity) configs among those meeting the SLOs at the
    trace's rate (all fully simulated ones when none does), best goodput first; one row
    per distinct config."""
    pool = [o for o in outcomes if o.evaluation.feasible]
    if not pool:
        pool = [o for o in outcomes if o.evaluation.status is EvalStatus.INFEASIBLE]
    seen: dict[str, TrialOutcome] = {}
    for o in pool:
        seen.setdefault(config_key(o.config), o)
    rows = list(seen.values())
    pts = [(_objective(o.evaluation, per_dollar), o.evaluation.interactivity_tok_s) for o in rows]
    front = []
    for i, (g, t) in enumerate(pts):
        dominated = any(
            (g2 >= g and t2 >= t) and (g2 > g or t2 > t) for j, (g2, t2) in enumerate(pts) if j != i
        )
        if not dominated:
            front.append(ParetoRow(rows[i].number, rows[i].config, rows[i].evaluation))
    front.sort(key=lambda r: (-_objective(r.predicted, per_dollar), r.trial))
    return front


def recommend(
    outcomes: Sequence[TrialOutcome], *, per_dollar: bool = False, tie_tol: float = 0.02
) -> TrialOutcome | None:
    """The best feasible config (None when no config meets the SLOs at the trace's rate)."""
    feasible = [o for o in outcomes if o.evaluation.feasible]
    if not feasible:
        return None
    best = max(_objective(o.evaluation, per_dollar) for o in feasible)
    ties = [o for o in feasible if _objective(o.evaluation, per_dollar) >= best * (1 - tie_tol)]
    return min(
        ties,
        key=lambda o: (
            o.evaluation.num_gpus,
            -_objective(o.evaluation, per_dollar),
            -o.evaluation.interactivity_tok_s,
            o.number,
        ),
    )


def hypervolume_2d(
    points: Sequence[tuple[float, float]], ref: tuple[float, float] = (0, 0)
) -> float:
    """Area dominated by `points` (both axes maximised) above the reference point."""
    pts = sorted(((x, y) for x, y in points if x > ref[0] and y > ref[1]), reverse=True)
    area, best_y = 0.0, ref[1]
    for x, y in pts:
        if y > best_y:
            area += (x - ref[0]) * (y - best_y)
            best_y = y
    return area


def baseline_config(space: SearchSpace) -> ServingConfig:
    """vLLM's untuned defaults on the first offered GPU type, filling the GPU budget."""
    acc = space.accelerators[0]
    big = acc.lower().replace("_sxm", "").replace("-sxm", "") in _BIG_GPUS
    tokens, seqs = (8192, 1024) if big else (2048, 256)
    last: ConfigError | None = None
    for tp in (1, 2, 4, 8):
        if tp > space.gpu_budget:
            break
        inst = InstanceConfig(
            accelerator=acc,
            tp=tp,
            max_num_batched_tokens=tokens,
            max_num_seqs=seqs,
            enable_chunked_prefill=True,
            price_per_gpu_hour=space.price_of(acc),
        )
        try:
            return ServingConfig.colocated(
                space.model,
                inst,
                num_replicas=space.gpu_budget // tp,
                max_model_len=space.max_model_len,
                enable_prefix_caching=space.enable_prefix_caching,
            )
        except ConfigError as exc:
            last = exc
    raise ConfigError(f"baseline: vLLM's defaults do not fit within the GPU budget: {last}")


def describe_baseline(config: ServingConfig) -> str:
    inst = config.replica
    assert inst is not None
    return (
        f"vLLM defaults: {config.num_replicas} x {inst.accelerator} tp={inst.tp}, "
        f"max_num_batched_tokens={inst.max_num_batched_tokens}, max_num_seqs={inst.max_num_seqs}, "
        "chunked prefill on, no speculation, colocated"
    )


@dataclass(frozen=True, slots=True)
class BaselineComparison:
    description: str
    config: ServingConfig
    predicted: Evaluation
    gain: float | None  # recommendation goodput / baseline goodput (None: baseline has 0)


def compare(
    baseline: ServingConfig, base_eval: Evaluation, rec: Evaluation | None, *, per_dollar: bool
) -> BaselineComparison:
    b = _objective(base_eval, per_dollar)
    gain = None
    if rec is not None and b > 0:
        gain = _objective(rec, per_dollar) / b
    return BaselineComparison(describe_baseline(baseline), baseline, base_eval, gain)
