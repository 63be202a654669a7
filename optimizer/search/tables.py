"""The answer's tables as plain text cells: the Pareto front, the capacity plan, the
trials and the trials that lost. `servetune tune` / `explain` draw them with rich and the
result page as HTML; both take their cells from here, so the two show the same figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.search.attainment import Attainment
from optimizer.search.outcome import TuneOutcome
from optimizer.search.trials import LostGroup, TrialRow


@dataclass(frozen=True, slots=True)
class TextTable:
    title: str
    head: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""  # what the columns mean, under the table


def attain_cell(att: Attainment | None) -> str:
    """The share and the rate it was measured at: "91.2% @ 12.05"."""
    return "-" if att is None else f"{att.share:.1%} @ {att.rate:,.2f}"


def money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}/h"


def _num(value: float, fmt: str) -> str:
    return format(value, fmt) if math.isfinite(value) else "-"


def priced(outcome: TuneOutcome) -> bool:
    return bool(outcome.request.space().prices)


def pareto_table(outcome: TuneOutcome) -> TextTable:
    """The verified fleets of the front, the recommendation starred."""
    rec = outcome.recommendation
    with_price = priced(outcome)
    head = ("trial", "mode", "GPUs", *(("$/h",) if with_price else ()), "tp", "tokens", "seqs")
    head += ("chunked", "K", "attain @ req/s", "tok/s/user", "TTFT p90 ms", "TPOT p90 ms")
    rows = []
    for p in outcome.pareto:
        ev, cfg = p.predicted, p.config
        front, back = cfg.roles()[0].instance, cfg.roles()[-1].instance
        count = (
            f"{cfg.num_prefill}P:{cfg.num_decode}D" if cfg.num_prefill else (f"x{cfg.num_replicas}")
        )
        chosen = rec is not None and p.trial == rec.trial and p.defaults == rec.defaults
        name = ("defaults" if p.defaults else str(p.trial)) + ("*" if chosen else "")
        row = [name, f"{cfg.mode.value} {count}", str(ev.num_gpus)]
        if with_price:
            row.append(money(ev.price_per_hour))
        row += [
            f"{front.tp}/{back.tp}" if front is not back else str(front.tp),
            str(front.max_num_batched_tokens),
            str(back.max_num_seqs),
            "on" if front.enable_chunked_prefill else "off",
            str(cfg.speculation.num_speculative_tokens),
            attain_cell(ev.attainment),
            _num(ev.interactivity_tok_s, ".1f"),
            _num(ev.ttft_p90_ms, ",.0f"),
            _num(ev.tpot_p90_ms, ".1f"),
        ]
        rows.append(tuple(row))
    return TextTable(
        "Pareto front: fleets verified on the whole workload (cost vs tokens/s per user)",
        head,
        tuple(rows),
        "*: the recommendation. attain: the lowest attainment measured, @ the req/s it was "
        "measured at; latencies at the workload's own load.",
    )


def capacity_table(outcome: TuneOutcome) -> TextTable:
    """GPUs the recommended unit needs at 1x, 2x and 4x the traffic."""
    clients = outcome.evaluated.clients
    if clients:
        load_head: tuple[str, ...] = ("traffic", "clients", "req/s served")
    else:
        load_head = ("traffic", "mean req/s", "sized for req/s")
    rows = []
    for c in outcome.capacity:
        if clients:
            load = (f"{max(1, round(clients * c.traffic)):,}", f"{c.mean_rate:.2f}")
        else:
            load = (f"{c.mean_rate:.2f}", f"{c.sizing_rate:.2f}")
        gpus = str(c.num_gpus) if c.feasible else f"> {c.num_gpus}"
        rows.append(
            (f"{c.traffic:g}x", *load, gpus, money(c.price_per_hour), attain_cell(c.attainment))
        )
    return TextTable(
        "Capacity plan: GPUs the recommended unit needs as traffic grows",
        (*load_head, "GPUs", "$/h", "attain @ req/s"),
        tuple(rows),
    )


def trial_name(row: TrialRow) -> str:
    """ "7", "defaults", "defaults (trial 7)", with "(+2)" for later trials of its config."""
    name = "defaults" if row.defaults else str(row.trial)
    if row.defaults and row.trial is not None:
        name = f"defaults (trial {row.trial})"
    return name + (f" (+{len(row.also)})" if row.also else "")


def trials_table(outcome: TuneOutcome) -> TextTable:
    t = outcome.trials
    rows = tuple(
        (
            trial_name(r),
            r.knobs,
            r.stage.value,
            str(r.num_gpus) if r.num_gpus else "-",
            r.fate.value,
            r.deciding,
            r.detail,
        )
        for r in t.rows
    )
    return TextTable(
        f"Trials: {t.num_trials} finished; the verified fleets first, then the best screens "
        "(GPUs of a screen: its estimate)",
        ("trial", "config", "stage", "GPUs", "fate", "deciding", "why"),
        rows,
    )


def lost_line(group: LostGroup) -> str:
    """ "3 invalid (memory): trials 7, 12, 15; e.g. ..."."""
    why = group.fate.value + (f" ({group.reason.value})" if group.reason else "")
    more = ", ..." if group.count > len(group.trials) else ""
    listed = ", ".join(str(n) for n in group.trials) + more
    return f"{group.count} {why}: trials {listed}; e.g. {group.example}"
