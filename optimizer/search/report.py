"""Pareto front as a PNG (matplotlib) and as a self-contained interactive HTML page
(inline SVG with hover details and a click-to-show launch command; no CDN)."""

from __future__ import annotations

import html
import json
from pathlib import Path

from optimizer.search.outcome import TuneOutcome


def _points(outcome: TuneOutcome) -> list[dict[str, object]]:
    rec = outcome.recommendation.trial if outcome.recommendation else None
    pts = []
    for p in outcome.pareto:
        ev, cfg = p.predicted, p.config
        inst = cfg.roles()[0].instance
        pts.append({
            "trial": p.trial,
            "x": ev.interactivity_tok_s,
            "y": ev.goodput_per_gpu,
            "mode": cfg.mode.value,
            "gpus": ev.num_gpus,
            "label": f"{cfg.mode.value} tp={inst.tp} tokens={inst.max_num_batched_tokens} "
                     f"seqs={cfg.roles()[-1].instance.max_num_seqs} "
                     f"K={cfg.speculation.num_speculative_tokens}",
            "recommended": p.trial == rec,
        })  # fmt: skip
    return pts


def write_png(outcome: TuneOutcome, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = sorted(_points(outcome), key=lambda p: p["x"])
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.plot(
        [p["x"] for p in pts], [p["y"] for p in pts], "o-", color="#3366aa", label="Pareto front"
    )
    for p in pts:
        if p["recommended"]:
            ax.plot([p["x"]], [p["y"]], "*", ms=16, color="#cc3311", label="recommended")
    b = outcome.baseline.predicted
    kept = outcome.recommendation is not None and outcome.recommendation.trial is None
    label = "vLLM defaults (recommended)" if kept else "vLLM defaults"
    ax.plot([b.interactivity_tok_s], [b.goodput_per_gpu], "s", color="#777777", label=label)
    ax.set_xlabel("interactivity: median output tokens/s per user")
    ax.set_ylabel("goodput per GPU (req/s at attainment target)")
    est = " (roofline estimate)" if outcome.latency.is_estimate else ""
    ax.set_title(f"{outcome.request.model} on {outcome.request.gpu_budget} GPUs{est}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


_PAGE = Path(__file__).with_name("pareto.html")


def write_html(outcome: TuneOutcome, path: Path) -> Path:
    b = outcome.baseline.predicted
    kept = outcome.recommendation is not None and outcome.recommendation.trial is None
    base = {"x": b.interactivity_tok_s, "y": b.goodput_per_gpu, "gpus": b.num_gpus,
            "label": outcome.baseline.description, "recommended": kept}  # fmt: skip
    launch = ""
    if outcome.recommendation:
        launch = "\n".join(c.command for c in outcome.recommendation.launch if c.engine == "vllm")
    title = f"{outcome.request.model}: Pareto front ({outcome.latency.label})"

    def js(value: object) -> str:
        return json.dumps(value).replace("</", "<\\/")

    page = (
        _PAGE.read_text(encoding="utf-8")
        .replace("TITLE", html.escape(title))
        .replace("DATA", js(_points(outcome)))
        .replace("BASE", js(base))
        .replace("LAUNCH", js(launch))
    )
    path.write_text(page, encoding="utf-8")
    return path
