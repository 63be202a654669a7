"""The Pareto PNG's titles fit their figure whatever their length (issue 43: the
infeasible run's "... (roofline estimate)" title was cut at the figure's edge)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import matplotlib
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from optimizer.search import TuneRequest
from optimizer.search.outcome import LatencyInfo
from optimizer.search.report import wrap_to_fit, write_png
from tests.api_tests.fakes import fake_outcome


def _drawn(monkeypatch: pytest.MonkeyPatch, outcome, path: Path) -> Figure:
    """The figure `write_png` saved (kept when it is closed)."""
    saved: list[Figure] = []
    save = Figure.savefig

    def keep(fig: Figure, *args, **kw):
        saved.append(fig)
        return save(fig, *args, **kw)

    monkeypatch.setattr(Figure, "savefig", keep)
    write_png(outcome, path)
    assert path.stat().st_size > 0
    return saved[0]


def _long_model(tmp_path: Path) -> str:
    """A config.json path: one long word of a model name."""
    folder = tmp_path / ("an-organisation-with-a-long-name--" * 3 + "checkpoint")
    folder.mkdir()
    cfg = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000,
           "torch_dtype": "bfloat16"}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder / "config.json")


@pytest.mark.parametrize("long_name", [False, True])
def test_titles_are_whole_and_inside_the_figure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, long_name: bool
) -> None:
    matplotlib.use("Agg")
    model = _long_model(tmp_path) if long_name else "Qwen/Qwen3-235B-A22B-FP8"
    request = TuneRequest(trace_id=1, model=model, gpu_types=("h200",), gpu_budget=16,
                          slo_ttft_ms=2, slo_tpot_ms=0.05)  # fmt: skip
    # The infeasible run: no recommendation, no capacity plan, priced by the roofline.
    outcome = replace(
        fake_outcome(request, 4),
        recommendation=None,
        capacity=(),
        latency=LatencyInfo("roofline estimate (accelerator specs)", True),
    )
    fig = _drawn(monkeypatch, outcome, tmp_path / "pareto.png")
    canvas = FigureCanvasAgg(fig)  # closed: drawn again as it was saved
    canvas.draw()
    title = fig.axes[0].title
    expected = f"{model}, budget 16 GPUs (roofline estimate)"
    text = title.get_text()
    assert "".join(text.split()) == "".join(expected.split())  # every character, in order
    if not long_name:
        assert " ".join(text.split()) == expected  # broken between words only
    box, page = title.get_window_extent(canvas.get_renderer()), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1


def test_wrap_to_fit_keeps_every_character() -> None:
    def fits(line: str) -> bool:
        return len(line) <= 10

    assert wrap_to_fit("a b c", fits) == "a b c"
    assert wrap_to_fit("one two three four", fits) == "one two\nthree four"
    assert wrap_to_fit("abcdefghijklmnopqrstuvwxyz end", fits) == (
        "abcdefghij\nklmnopqrst\nuvwxyz end"
    )
