"""From trials to answers: candidates to verify, the recommendation, the Pareto front,
the baseline.

Trials screen one unit each (`optimizer.search.evaluation`); the most promising
distinct units (fewest GPUs, or lowest price, for the sizing rate, then per-GPU
goodput) are verified as whole fleets on the whole trace. The recommendation is
the verified fleet with the fewest GPUs (the lowest price per hour when prices
are given) that meets the SLOs; at equal cost the most interactive, the engine's
defaults unless beaten by more than 3%. The Pareto front of verified fleets trades
GPUs (or price) against tokens/s per user. The baseline is the engine's untuned
defaults (DOMAIN.md §5), sized and verified the same way: vLLM's 8192 batched tokens / 1024 seqs on
H100/H200, 2048 / 256 elsewhere, chunked prefill on, no speculation, colocated,
TP 1 (or the smallest TP the model fits at), prefix caching on when the trace lets it
be simulated (it carries prefix hashes), else off.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from optimizer.config import ConfigError, InstanceConfig, ServingConfig
from optimizer.engines import vllm_server_budget
from optimizer.hardware import HardwareError, get_accelerator
from optimizer.search.evaluation import EvalStatus, Evaluation
from optimizer.search.space import SearchSpace, config_key


@dataclass(frozen=True, slots=True)
class TrialOutcome:
    """A finished trial (its unit and screen), or a verified fleet (trial None: the
    engine's defaults)."""

    number: int | None
    config: ServingConfig
    evaluation: Evaluation


@dataclass(frozen=True, slots=True)
class ParetoRow:
    trial: int | None  # the first trial that screened its unit (None: none did)
    config: ServingConfig
    predicted: Evaluation
    defaults: bool = False  # the engine's defaults (sized like any other unit)

    @property
    def meets_slo(self) -> bool:
        return self.predicted.feasible


def cost_of(ev: Evaluation, per_dollar: bool) -> float:
    """What a fleet costs: USD per hour with prices, else GPUs."""
    if per_dollar:
        return ev.price_per_hour if ev.price_per_hour is not None else math.inf
    return float(ev.num_gpus)


def screen_rank(ev: Evaluation, per_dollar: bool) -> tuple[float, float, float]:
    efficiency = (ev.goodput_per_dollar or 0.0) if per_dollar else ev.goodput_per_gpu
    return (cost_of(ev, per_dollar), -efficiency, -ev.interactivity_tok_s)


def candidates(
    outcomes: Sequence[TrialOutcome], *, per_dollar: bool = False, limit: int = 4
) -> list[TrialOutcome]:
    """The units worth verifying: distinct feasible screens, cheapest sized fleet first,
    then the most interactive of the rest (so the Pareto front has a spread). When no
    screen is feasible, the two valid units with the most capacity per GPU (or per
    dollar), to show how close the budget comes."""
    seen: dict[str, TrialOutcome] = {}
    for o in outcomes:
        if o.evaluation.status is not EvalStatus.INVALID:
            seen.setdefault(config_key(o.config), o)
    feasible = [o for o in seen.values() if o.evaluation.feasible]
    if not feasible:
        return sorted(seen.values(), key=lambda o: screen_rank(o.evaluation, per_dollar)[1:])[:2]
    pool = sorted(feasible, key=lambda o: screen_rank(o.evaluation, per_dollar))
    chosen = pool[: max(1, limit - 1)]
    rest = [o for o in pool if o not in chosen]
    if rest and len(chosen) < limit:
        chosen.append(max(rest, key=lambda o: o.evaluation.interactivity_tok_s))
    return chosen


def rank(o: TrialOutcome, per_dollar: bool) -> tuple[float, float, float, int]:
    """The recommendation's order: cheapest, then most interactive, then the highest
    attainment, then the defaults (trial None), then the earliest trial."""
    ev = o.evaluation
    return (
        cost_of(ev, per_dollar),
        -ev.interactivity_tok_s,
        -ev.share,
        -1 if o.number is None else o.number,
    )


NEAR_DEFAULTS = 1.03  # interactivity within this factor of the defaults' is no reason to move


def recommend(verified: Sequence[TrialOutcome], *, per_dollar: bool = False) -> TrialOutcome | None:
    """The cheapest verified fleet that meets the SLOs (None when none does); at equal cost
    the most interactive, then the highest attainment. The engine's defaults (trial None)
    are kept at equal cost unless the other is more than 3% more interactive: a change of
    knobs that saves nothing measurable is not worth a redeploy."""
    feasible = [o for o in verified if o.evaluation.feasible]
    if not feasible:
        return None
    best = min(feasible, key=lambda o: rank(o, per_dollar))
    cost = cost_of(best.evaluation, per_dollar)
    for o in feasible:
        same = o.number is None and cost_of(o.evaluation, per_dollar) == cost
        if same and o.evaluation.interactivity_tok_s * NEAR_DEFAULTS >= (
            best.evaluation.interactivity_tok_s
        ):
            return o
    return best


def pareto_front(
    verified: Sequence[TrialOutcome],
    *,
    per_dollar: bool = False,
    keep: TrialOutcome | None = None,
) -> list[ParetoRow]:
    """Non-dominated (cost, interactivity) fleets among those meeting the SLOs (all verified
    ones when none does), cheapest first; one row per distinct fleet, and one per point
    (fleets within 0.1% on both axes are one point: the defaults', else the earliest
    trial's, unless `keep` is one of them). `keep` (the recommendation, or the closest
    fleet when none meets the SLOs) is always a row."""
    pool = [o for o in verified if o.evaluation.feasible] or list(verified)
    order = sorted(pool, key=lambda o: (o is not keep, -1 if o.number is None else o.number))
    rows: list[TrialOutcome] = []
    seen: set[str] = set()
    for o in order:
        key = config_key(o.config)
        if key not in seen and not any(_same_point(o, r, per_dollar) for r in rows):
            seen.add(key)
            rows.append(o)
    pts = [(cost_of(o.evaluation, per_dollar), o.evaluation.interactivity_tok_s) for o in rows]
    front = []
    for i, (c, t) in enumerate(pts):
        dominated = any(
            (c2 <= c and t2 >= t) and (c2 < c or t2 > t) for j, (c2, t2) in enumerate(pts) if j != i
        )
        if not dominated or rows[i] is keep:
            front.append(rows[i])
    if keep is not None and not any(o is keep for o in front):
        front.append(keep)
    front.sort(key=lambda o: (cost_of(o.evaluation, per_dollar), -o.evaluation.interactivity_tok_s))
    return [ParetoRow(o.number, o.config, o.evaluation, defaults=o.number is None) for o in front]


def _same_point(a: TrialOutcome, b: TrialOutcome, per_dollar: bool) -> bool:
    ca, cb = cost_of(a.evaluation, per_dollar), cost_of(b.evaluation, per_dollar)
    ta, tb = a.evaluation.interactivity_tok_s, b.evaluation.interactivity_tok_s
    return math.isclose(ca, cb, rel_tol=1e-3) and math.isclose(ta, tb, rel_tol=1e-3)


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
    """One replica of vLLM's untuned defaults on the first offered GPU type (the unit the
    evaluator sizes)."""
    acc = space.accelerators[0]
    try:
        spec = get_accelerator(acc)
        tokens, seqs = vllm_server_budget(spec.memory_gib, spec.family)
    except HardwareError:  # the config names the bad accelerator
        tokens, seqs = vllm_server_budget(0.0, "")
    last: ConfigError | None = None
    tried = 0
    for tp in (1, 2, 4, 8):
        if tp > space.gpu_budget:
            break
        tried = tp
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
                num_replicas=1,
                max_model_len=space.max_model_len,
                enable_prefix_caching=True in space.prefix_caching,  # vLLM's default: on
                engine=space.engine,
                engine_version=space.engine_version,
            )
        except ConfigError as exc:
            last = exc
    if last is None:  # not even tp 1 is within the budget (cannot happen: budget >= 1)
        raise ConfigError(f"vLLM's defaults need more than {space.gpu_budget} GPUs")
    within = f"the budget of {space.gpu_budget} GPUs" if tried < 8 else "one node (tp <= 8)"
    raise ConfigError(
        f"vLLM's defaults do not fit on {acc} within {within}: at tp={tried}, "
        f"{str(last).split(': ', 1)[-1]}",
        last.reason,
    )


def describe_baseline(config: ServingConfig | None, space: SearchSpace | None = None) -> str:
    """The defaults in words (`config` None: they cannot be built; `space` names them)."""
    if config is None:
        acc = space.accelerators[0] if space is not None else "the GPU"
        return f"vLLM defaults: one replica on {acc}, chunked prefill on, no speculation"
    inst = config.replica
    assert inst is not None
    return (
        f"vLLM defaults: {config.num_replicas} x {inst.accelerator} tp={inst.tp}, "
        f"max_num_batched_tokens={inst.max_num_batched_tokens}, max_num_seqs={inst.max_num_seqs}, "
        f"chunked prefill on, prefix caching {'on' if config.enable_prefix_caching else 'off'}, "
        "no speculation, colocated"
    )


@dataclass(frozen=True, slots=True)
class BaselineComparison:
    """The engine's defaults, sized for the same traffic; `gain` is how many times more
    GPUs (or USD per hour) they need than the recommendation (None: they cannot meet
    the SLOs within the budget). `config` is None when the defaults cannot be deployed at
    all (`predicted` is then INVALID and its `error` says why)."""

    description: str
    config: ServingConfig | None
    predicted: Evaluation
    gain: float | None


def compare(
    description: str,
    baseline: ServingConfig | None,
    base_eval: Evaluation,
    rec: Evaluation | None,
    *,
    per_dollar: bool,
) -> BaselineComparison:
    gain = None
    if rec is not None and base_eval.feasible:
        gain = cost_of(base_eval, per_dollar) / cost_of(rec, per_dollar)
    return BaselineComparison(description, baseline, base_eval, gain)
