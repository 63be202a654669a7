"""The Pareto front (cost against tokens/s per user) and the capacity plan as a PNG
(matplotlib), and the front as a self-contained interactive HTML page (inline SVG with
hover details and a click-to-show launch command; no CDN)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from optimizer.search.evaluation import EvalStatus, Evaluation
from optimizer.search.outcome import TuneOutcome
from optimizer.search.verdict import who

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.text import Text


@dataclass(frozen=True, slots=True)
class _Point:
    x: float  # GPUs, or USD per hour when priced
    y: float  # median output tokens/s per user
    gpus: int
    price: str
    attainment: str  # the deciding attainment with the traffic it was measured at
    ttft: float
    tpot: float
    label: str
    recommended: bool


def _priced(outcome: TuneOutcome) -> bool:
    return bool(outcome.request.space().prices)


def _point(outcome: TuneOutcome, ev: Evaluation, label: str, recommended: bool) -> _Point:
    price = ev.price_per_hour
    x = price if _priced(outcome) and price is not None else float(ev.num_gpus)
    shown = f" (${price:,.2f}/h)" if price is not None else ""
    att = "-" if ev.attainment is None else outcome.evaluated.attainment_text(ev.attainment)
    return _Point(
        x,
        ev.interactivity_tok_s,
        ev.num_gpus,
        shown,
        att,
        ev.ttft_p90_ms,
        ev.tpot_p90_ms,
        label,
        recommended,
    )


def _points(outcome: TuneOutcome) -> list[_Point]:
    rec = outcome.recommendation
    pts = []
    for p in outcome.pareto:
        cfg = p.config
        inst = cfg.roles()[0].instance
        name = who(p.trial, p.defaults)
        split = f" {inst.layout.key}" if inst.layout.key else ""  # "dp4-ep" for a MoE split
        label = (
            f"{name}: {cfg.mode.value} tp={inst.tp}{split} tokens={inst.max_num_batched_tokens} "
            f"seqs={cfg.roles()[-1].instance.max_num_seqs} "
            f"K={cfg.speculation.num_speculative_tokens}"
        )
        chosen = rec is not None and p.trial == rec.trial and p.defaults == rec.defaults
        pts.append(_point(outcome, p.predicted, label, chosen))
    return pts


def _base(outcome: TuneOutcome) -> _Point | None:
    b = outcome.baseline
    if b.predicted.status is EvalStatus.INVALID:
        return None
    kept = outcome.recommendation is not None and outcome.recommendation.defaults
    return _point(outcome, b.predicted, b.description, kept)


def _xlabel(outcome: TuneOutcome) -> str:
    return "fleet cost, USD per hour" if _priced(outcome) else "GPUs in the fleet"


def write_png(outcome: TuneOutcome, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = sorted(_points(outcome), key=lambda p: p.x)
    panels = 2 if outcome.capacity else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.5), dpi=120, squeeze=False)
    ax = axes[0][0]
    ax.plot([p.x for p in pts], [p.y for p in pts], "o-", color="#3366aa", label="Pareto front")
    for p in pts:
        if p.recommended:
            ax.plot([p.x], [p.y], "*", ms=16, color="#cc3311", label="recommended")
    base = _base(outcome)
    if base is not None:
        label = "vLLM defaults (recommended)" if base.recommended else "vLLM defaults"
        ax.plot([base.x], [base.y], "s", color="#777777", label=label)
    ax.set_xlabel(_xlabel(outcome))
    ax.set_ylabel("median output tokens/s per user")
    est = " (roofline estimate)" if outcome.latency.is_estimate else ""
    titles = [(ax, f"{outcome.request.model}, budget {outcome.request.gpu_budget} GPUs{est}")]
    ax.grid(alpha=0.3)
    ax.legend()
    if outcome.capacity:
        cap = axes[0][1]
        rows = outcome.capacity
        cap.plot([c.mean_rate for c in rows], [c.num_gpus for c in rows], "o-", color="#228833")
        for c in rows:
            mark = "" if c.feasible else " (not met)"
            cap.annotate(f"{c.traffic:g}x{mark}", (c.mean_rate, c.num_gpus),
                         textcoords="offset points", xytext=(4, 4))  # fmt: skip
        cap.set_xlabel("trace traffic, mean requests/s")
        cap.set_ylabel("GPUs needed")
        titles.append((cap, "Capacity plan (the recommended unit)"))
        cap.grid(alpha=0.3)
    fig.tight_layout()
    set_titles(fig, titles)
    fig.savefig(path)
    plt.close(fig)
    return path


def set_titles(fig: Figure, titles: list[tuple[Axes, str]]) -> None:
    """Each axes' title, wrapped to the axes' width as laid out, then the layout again to
    make room for the lines (a title wider than its panel is cut at the figure's edge)."""
    renderer = fig.canvas.get_renderer()
    for ax, text in titles:
        width = ax.get_window_extent(renderer).width
        title = ax.set_title(text)

        def fits(line: str, title: Text = title, width: float = width) -> bool:
            title.set_text(line)
            return title.get_window_extent(renderer).width <= width

        title.set_text(wrap_to_fit(text, fits))
    fig.tight_layout()


def wrap_to_fit(text: str, fits: Callable[[str], bool]) -> str:
    """`text` in lines that each `fits`: words joined while they fit, and a word that fits
    no line alone cut where it stops fitting (a long model path has no spaces)."""
    lines: list[str] = []
    for word in text.split():
        if lines and fits(f"{lines[-1]} {word}"):
            lines[-1] += f" {word}"
            continue
        while len(word) > 1 and not fits(word):
            cut = next((k for k in range(len(word) - 1, 0, -1) if fits(word[:k])), 1)
            lines.append(word[:cut])
            word = word[cut:]
        lines.append(word)
    return "\n".join(lines)


_PAGE = Path(__file__).with_name("pareto.html")


def write_html(outcome: TuneOutcome, path: Path) -> Path:
    launch = ""
    if outcome.recommendation and outcome.recommendation.launch:
        priced = outcome.recommendation.launch[0].engine  # the priced engine's come first
        launch = "\n".join(c.command for c in outcome.recommendation.launch if c.engine == priced)
    title = f"{outcome.request.model}: Pareto front ({outcome.latency.label})"

    def js(value: object) -> str:
        return json.dumps(value).replace("</", "<\\/")

    base = _base(outcome)
    fill = {
        "__TITLE__": html.escape(title),
        "__SUBTITLE__": html.escape(outcome.evaluated.describe()),
        "__XLABEL__": js(_xlabel(outcome)),
        "__DATA__": js([_plain(p) for p in _points(outcome)]),
        "__BASE__": js(_plain(base) if base else None),
        "__LAUNCH__": js(launch),
    }
    page = re.sub("__[A-Z]+__", lambda m: fill[m.group(0)], _PAGE.read_text(encoding="utf-8"))
    path.write_text(page, encoding="utf-8")
    return path


def _plain(p: _Point) -> dict[str, object]:
    return {f: getattr(p, f) for f in _Point.__dataclass_fields__}
