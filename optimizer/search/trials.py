"""Every trial's fate, for `servetune explain`: the best ones in a table with the constraint
that decided each, the rest counted by why they lost.

A trial screens one unit (`optimizer.search.evaluation`); the most promising are
verified as sized fleets on the whole workload (`optimizer.search.outcome`). A trial
ends in one `TrialFate`: recommended; verified and meeting the SLOs but costing more or
less interactive; verified and missing them within the budget; screened within the
budget but not verified (cheaper screens were); over the budget; meeting the SLOs at
no rate; or invalid (its `RejectReason`). Its deciding constraint is the SLO that binds
where it fails: for a screen, at the lowest rate probed above its capacity (or its
saturation throughput when no SLO binds first); for a verified fleet, at its deciding
attainment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from optimizer.config import RejectReason, ServingConfig, ServingMode
from optimizer.search.attainment import Attainment
from optimizer.search.evaluation import EvalStage, EvalStatus
from optimizer.search.recommend import TrialOutcome, cost_of, screen_rank
from optimizer.search.space import config_key
from optimizer.search.windows import EvaluatedTrace

MAX_ROWS = 15  # trials in the table; the rest are counted by fate
MAX_LISTED = 12  # trial numbers listed per group


class TrialFate(StrEnum):
    RECOMMENDED = "recommended"
    MEETS = "meets"  # verified: meets the SLOs, but costs more or is less interactive
    MISSES = "misses"  # verified: the fleet misses the target within the budget
    NOT_VERIFIED = "not verified"  # screened within the budget; cheaper screens were verified
    OVER_BUDGET = "over budget"  # screened: the fleet the traffic needs exceeds the budget
    UNSUSTAINABLE = "unsustainable"  # screened: no arrival rate meets the SLOs
    INVALID = "invalid"  # cannot run: `reject` says why


LOST = (TrialFate.OVER_BUDGET, TrialFate.UNSUSTAINABLE, TrialFate.INVALID)


@dataclass(frozen=True, slots=True)
class RejectedTrial:
    """A trial whose choices make no valid config (it has no config to evaluate)."""

    number: int
    reason: RejectReason
    message: str


@dataclass(frozen=True, slots=True)
class TrialRow:
    """One distinct config tried, with what decided it."""

    trial: int | None  # the first trial that tried it (None: only the defaults' own run)
    defaults: bool  # the engine's defaults
    knobs: str
    stage: EvalStage  # verified (a sized fleet on the whole workload) or screened
    num_gpus: int  # the verified fleet's, or the screen's estimate (0: no rate is sustainable)
    fate: TrialFate
    deciding: str  # the SLO that binds ("TTFT", ...), "throughput", or the reject reason
    detail: str  # why, with its figures
    also: tuple[int, ...] = ()  # later trials of the same config


@dataclass(frozen=True, slots=True)
class LostGroup:
    """Trials that lost for the same reason."""

    fate: TrialFate
    reason: RejectReason | None  # an invalid config's
    count: int
    trials: tuple[int, ...]  # the first `MAX_LISTED`
    example: str  # the first one's detail


@dataclass(frozen=True, slots=True)
class TrialsSummary:
    num_trials: int  # finished trials of the study
    rows: tuple[TrialRow, ...]  # the verified fleets, then the best screens
    lost: tuple[LostGroup, ...]  # trials over the budget, unsustainable or invalid


def knobs(config: ServingConfig) -> str:
    """A config's searched knobs in one line."""
    front, back = config.roles()[0].instance, config.roles()[-1].instance
    if config.mode is ServingMode.COLOCATED:
        shape = f"colocated tp{front.tp}"
    else:
        shape = f"{config.num_prefill}P:{config.num_decode}D tp{front.tp}/{back.tp}"
    if back.dp > 1:
        shape += f" dp{back.dp}" + (" ep" if back.expert_parallel else "")
    parts = [
        shape,
        f"{front.max_num_batched_tokens} tokens",
        f"{back.max_num_seqs} seqs",
        "chunked" if front.enable_chunked_prefill else "unchunked",
    ]
    if config.speculation.enabled:
        parts.append(f"K {config.speculation.num_speculative_tokens}")
    if config.enable_prefix_caching:
        parts.append("prefix cache")
    if config.kv_cache_dtype != "auto":
        parts.append(f"kv {config.kv_cache_dtype}")
    return ", ".join(parts)


def binding(att: Attainment, target: float) -> tuple[str, str]:
    """(the weakest SLO, "TTFT: 84.0% meet it alone") at `att`."""
    name, share = att.alone()[0]
    note = (
        f"{name} binds: {share:.1%} meet it alone"
        if share < target
        else (f"{name} closest to binding: {share:.1%} meet it alone")
    )
    return name, note


def _gpus(n: int) -> str:
    return f"{n} GPU{'' if n == 1 else 's'}"


@dataclass(frozen=True, slots=True)
class _Context:
    evaluated: EvaluatedTrace
    target: float
    budget: int
    per_dollar: bool
    recommended: TrialOutcome | None
    recommended_key: str | None


def _screened_row(o: TrialOutcome, ctx: _Context, also: tuple[int, ...]) -> TrialRow:
    ev = o.evaluation
    common = (o.number, False, knobs(o.config), EvalStage.SCREENED)
    if ev.status is EvalStatus.INVALID:
        reason = ev.reject or RejectReason.RULE
        row = TrialRow(*common, ev.num_gpus, TrialFate.INVALID, reason.value, ev.error, also)
        return row
    att = ev.attainment
    if ev.num_units == 0:
        assert att is not None
        name, note = binding(att, ctx.target)
        detail = (
            f"meets the SLOs at no rate: at {att.rate:.3g} req/s, the lowest tried, "
            f"{att.share:.1%} meet them ({note})"
        )
        return TrialRow(*common, 0, TrialFate.UNSUSTAINABLE, name, detail, also)
    if ev.limit is not None:
        deciding, note = binding(ev.limit, ctx.target)
        capacity = (
            f"one unit serves {ev.unit_rate:.2f} req/s; above it {note} "
            f"(at {ev.limit.rate:.2f} req/s)"
        )
    else:
        deciding = "throughput"
        capacity = f"one unit serves {ev.unit_rate:.2f} req/s, its saturation throughput"
    sizing = ctx.evaluated.sizing_rate
    if ev.status is EvalStatus.INFEASIBLE:
        detail = (
            f"needs ~{_gpus(ev.num_gpus)} ({ev.num_units} x {ev.unit_gpus}) for {sizing:.2f} "
            f"req/s, over the budget of {ctx.budget}: {capacity}"
        )
        if ctx.evaluated.clients:
            detail = (
                f"misses the SLOs on every fleet within the budget of {ctx.budget} GPUs "
                f"(screened): {capacity}"
            )
        return TrialRow(*common, ev.num_gpus, TrialFate.OVER_BUDGET, deciding, detail, also)
    detail = f"screened at ~{_gpus(ev.num_gpus)} ({capacity}); cheaper screens were verified"
    return TrialRow(*common, ev.num_gpus, TrialFate.NOT_VERIFIED, deciding, detail, also)


def _verified_row(
    o: TrialOutcome, screened_as: int | None, ctx: _Context, also: tuple[int, ...]
) -> TrialRow:
    ev = o.evaluation
    att = ev.attainment
    assert att is not None
    name, note = binding(att, ctx.target)
    figure = ctx.evaluated.attainment_text(att)
    defaults = o.number is None
    common = (screened_as, defaults, knobs(o.config), EvalStage.VERIFIED, ev.num_gpus)
    if not ev.feasible:
        detail = f"misses within the budget: {figure} with {_gpus(ev.num_gpus)}; {note}"
        return TrialRow(*common, TrialFate.MISSES, name, detail, also)
    if ctx.recommended is not None and config_key(o.config) == ctx.recommended_key:
        detail = f"meets the SLOs with {_gpus(ev.num_gpus)}: {figure}; {note}"
        return TrialRow(*common, TrialFate.RECOMMENDED, name, detail, also)
    rec = ctx.recommended
    assert rec is not None  # a fleet meets the SLOs, so one is recommended
    mine, theirs = cost_of(ev, ctx.per_dollar), cost_of(rec.evaluation, ctx.per_dollar)
    unit = "$/h" if ctx.per_dollar else "GPUs"
    if mine > theirs:
        why = f"costs more: {mine:,.4g} {unit} against the recommendation's {theirs:,.4g}"
    else:
        why = (
            f"as cheap as the recommendation, at {ev.interactivity_tok_s:.0f} against "
            f"{rec.evaluation.interactivity_tok_s:.0f} tokens/s per user"
        )
    detail = f"meets the SLOs, {figure}, but {why}"
    return TrialRow(*common, TrialFate.MEETS, name, detail, also)


def summarize_trials(
    outcomes: Sequence[TrialOutcome],
    rejected: Sequence[RejectedTrial],
    verified: Mapping[str, TrialOutcome],
    recommended: TrialOutcome | None,
    *,
    num_trials: int,
    evaluated: EvaluatedTrace,
    target: float,
    budget: int,
    per_dollar: bool,
) -> TrialsSummary:
    """The trials' table and their losses by reason. `outcomes`: the completed trials in
    order; `rejected`: those whose choices made no config; `verified`: the verified fleets
    by their unit's `config_key` (the engine's defaults among them, trial None);
    `recommended`: the recommended fleet (None: none meets the SLOs)."""
    rec_key = None if recommended is None else config_key(recommended.config)
    ctx = _Context(evaluated, target, budget, per_dollar, recommended, rec_key)
    first: dict[str, TrialOutcome] = {}
    repeats: dict[str, list[int]] = {}
    for o in outcomes:
        key = config_key(o.config)
        if key in first:
            repeats.setdefault(key, []).append(o.number)  # type: ignore[arg-type]
        else:
            first[key] = o
    order = {fate: i for i, fate in enumerate(TrialFate)}
    ranked: list[tuple[tuple[float, ...], TrialRow]] = []
    for key, v in verified.items():
        screened = first.get(key)
        number = None if screened is None else screened.number
        row = _verified_row(v, number, ctx, tuple(repeats.get(key, ())))
        rank = (order[row.fate], cost_of(v.evaluation, per_dollar), -v.evaluation.share)
        ranked.append((rank, row))
    rows = [row for _, row in sorted(ranked, key=lambda p: p[0])]
    screens = [
        _screened_row(o, ctx, tuple(repeats.get(key, ())))
        for key, o in first.items()
        if key not in verified
    ]
    by_number = {o.number: o for o in first.values()}
    kept = [r for r in screens if r.fate is TrialFate.NOT_VERIFIED]
    kept.sort(key=lambda r: screen_rank(by_number[r.trial].evaluation, per_dollar))
    over = [r for r in screens if r.fate is TrialFate.OVER_BUDGET]
    over.sort(key=lambda r: (r.num_gpus, r.trial))
    table = (rows + kept + over)[: max(MAX_ROWS, len(rows))]
    lost = _groups([r for r in screens if r.fate in LOST], rejected)
    return TrialsSummary(num_trials, tuple(table), lost)


def _groups(rows: Sequence[TrialRow], rejected: Sequence[RejectedTrial]) -> tuple[LostGroup, ...]:
    """Lost trials by fate (invalid ones by reason), the largest group first."""
    members: dict[tuple[TrialFate, RejectReason | None], list[tuple[int, str]]] = {}
    for r in rows:
        reason = RejectReason(r.deciding) if r.fate is TrialFate.INVALID else None
        assert r.trial is not None
        numbers = [r.trial, *r.also]
        for n in numbers:
            members.setdefault((r.fate, reason), []).append((n, r.detail))
    for t in rejected:
        members.setdefault((TrialFate.INVALID, t.reason), []).append((t.number, t.message))
    groups = []
    for (fate, reason), items in members.items():
        items.sort()
        numbers = tuple(n for n, _ in items)
        groups.append(LostGroup(fate, reason, len(items), numbers[:MAX_LISTED], items[0][1]))
    groups.sort(key=lambda g: (-g.count, g.fate.value, g.reason or ""))
    return tuple(groups)
