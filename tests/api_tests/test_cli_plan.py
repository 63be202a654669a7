"""`servetune plan` end to end on small trace files: JSON output and the files it writes,
the stored recommendation taken as the unit, and bad input refused with nothing stored."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from api.cli import app
from optimizer.plan import FleetKind, FleetPlan

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "examples" / "colocated-h100.yaml"
COMMON = [
    "--model",
    "llama-3.1-8b",
    "--gpu",
    "h100",
    "--slo-ttft-ms",
    "1000",
    "--slo-tpot-ms",
    "50",
]


def _trace(path: Path, n: int, rate: float, prompt: int = 600, *, swing: bool = True) -> Path:
    """`n` Poisson arrivals at `rate` req/s (the middle third at 3x the rate)."""
    rng = np.random.default_rng(1)
    gaps = rng.exponential(1 / rate, size=n)
    if swing:
        gaps[n // 3 : 2 * n // 3] /= 3
    arrival = np.cumsum(gaps) - gaps[0]
    rows = ["arrival_s,input_tokens,output_tokens"]
    rows += [f"{a:.4f},{prompt + i % 200},{40 + i % 60}" for i, a in enumerate(arrival)]
    path.write_text("\n".join(rows) + "\n")
    return path


def _counts(url: str) -> tuple[int, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            names = sa.inspect(conn).get_table_names()
            if "plans" not in names:
                return 0, 0
            traces = conn.execute(sa.text("select count(*) from traces")).scalar_one()
            plans = conn.execute(sa.text("select count(*) from plans")).scalar_one()
            return traces, plans
    finally:
        engine.dispose()


def test_plan_json_and_files_end_to_end(cli_db: str, runner: CliRunner, tmp_path: Path) -> None:
    trace = _trace(tmp_path / "day.csv", 3000, 4.0, prompt=2000)
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "plan",
            "--trace",
            str(trace),
            *COMMON,
            "--unit",
            str(UNIT),
            "--window",
            "2m",
            "--cold-start-s",
            "20",
            "--price-per-gpu-hour",
            "2.5",
            "--json",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["id"] == 1 and doc["request"]["trace_id"] == 1
    plan = FleetPlan.from_dict({k: v for k, v in doc.items() if k != "id"})
    assert plan.unit.source.value == "given" and plan.request.window_s == 120
    assert sum(w.num_requests for w in plan.windows) == 3000
    static, scheduled, reactive = plan.fleets
    assert [f.kind for f in plan.fleets] == [
        FleetKind.STATIC,
        FleetKind.SCHEDULED,
        FleetKind.REACTIVE,
    ]
    for f in plan.fleets:  # all three replayed on the whole trace
        assert f.dollars == pytest.approx(f.gpu_hours * 2.5)
        assert 0 < f.attainment <= 1 and f.worst_window is not None
        assert len(f.window_attainment) == len(plan.windows)
    assert scheduled.num_cold_starts > 0 and reactive.num_cold_starts > 0
    assert plan.lower_bound.gpu_hours <= scheduled.gpu_hours <= static.gpu_hours
    assert "not yet simulated" not in result.output
    assert max(plan.lower_bound.units) > min(plan.lower_bound.units)  # the swing shows
    assert sorted(p.name for p in out.iterdir()) == [
        "keda.yaml",
        "plan.html",
        "plan.json",
        "plan.png",
    ]
    assert json.loads((out / "plan.json").read_text())["id"] == 1
    assert "kind: ScaledObject" in (out / "keda.yaml").read_text()
    assert _counts(cli_db) == (1, 1)
    # the same file again: its stored trace, a second plan
    again = runner.invoke(
        app,
        [
            "plan",
            "--trace",
            str(trace),
            *COMMON,
            "--unit",
            str(UNIT),
            "--window",
            "2m",
            "--cold-start-s",
            "20",
        ],
    )
    assert again.exit_code == 0, again.output
    assert "(a) The unit's SLO-bounded capacity" in again.output and "plan 2 stored" in again.output
    for kind in ("static", "scheduled", "reactive"):
        assert kind in again.output
    assert _counts(cli_db) == (1, 2)


def test_plan_takes_the_newest_stored_recommendation(
    cli_db: str, runner: CliRunner, tmp_path: Path
) -> None:
    from api.cli.common import session
    from optimizer.search import TuneRequest
    from storage.tuning import TuningStatus, finish_tuning_run, start_tuning_run
    from tests.api_tests.fakes import fake_outcome

    trace = _trace(tmp_path / "t.csv", 2000, 2.0, swing=False)
    assert runner.invoke(app, ["traces", "import", str(trace)]).exit_code == 0
    request = TuneRequest(
        trace_id=1,
        model="llama-3.1-8b",
        gpu_types=("h100",),
        gpu_budget=8,
        slo_ttft_ms=1000,
        slo_tpot_ms=50,
        num_trials=3,
    )
    with session() as s:
        start_tuning_run(
            s,
            study_name="tuned",
            trace_id=1,
            model="llama-3.1-8b",
            request=request.to_dict(),
            search_space={},
            latency_label="fake",
        )
        finish_tuning_run(s, "tuned", fake_outcome(request, 3).to_dict(), TuningStatus.DONE)
    result = runner.invoke(app, ["plan", "--trace", "1", *COMMON, "--window", "4m", "--json"])
    assert result.exit_code == 0, result.output
    unit = json.loads(result.output)["unit"]
    assert unit["source"] == "recommendation" and "tuning run 'tuned'" in unit["reason"]
    # the recommended fleet is 2 units of 1 replica with a 2048-token budget: one unit
    assert unit["config"]["num_replicas"] == 1
    assert unit["config"]["replica"]["max_num_batched_tokens"] == 2048


@pytest.mark.parametrize(
    ("trace_args", "extra", "message"),
    [
        ((600, 2.0), ["--window", "15m"], "--window 900 s is longer than trace"),
        ((600, 2.0), ["--window", "4m"], "is shorter than two windows of 240 s"),
        ((3000, 2.0), ["--window", "1m"], "cold start (68 s, the default) is longer than a window"),
        (
            (3000, 20.0, 4000),
            ["--window", "1m", "--cold-start-s", "10", "--gpus", "1"],
            "the peak needs more than --gpus 1: window",
        ),
        ((3000, 2.0), ["--window", "ten"], "--window 'ten': expected a duration"),
    ],
)
def test_bad_input_is_one_error_and_stores_nothing(
    cli_db: str, runner: CliRunner, tmp_path: Path, trace_args, extra, message
) -> None:
    trace = _trace(tmp_path / "t.csv", *trace_args, swing=False)
    result = runner.invoke(
        app, ["plan", "--trace", str(trace), *COMMON, "--unit", str(UNIT), *extra]
    )
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and message in " ".join(result.output.split())
    assert _counts(cli_db) == (0, 0)


def test_a_plan_on_a_synthesized_trace_says_it_is_synthetic(
    cli_db: str, runner: CliRunner, tmp_path: Path
) -> None:
    sample = _trace(tmp_path / "sample.csv", 200, 2.0)
    assert runner.invoke(app, ["traces", "import", str(sample)]).exit_code == 0
    made = runner.invoke(app, [
        "traces", "synthesize", "--from", "1", "--days", "0.05", "--mean-rate", "0.5",
        "--rate-curve", "diurnal", "--seed", "3",
    ])  # fmt: skip
    assert made.exit_code == 0, made.output
    res = runner.invoke(
        app, ["plan", "--trace", "2", *COMMON, "--unit", str(UNIT), "--window", "15m", "--json"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    plan = FleetPlan.from_dict({k: v for k, v in doc.items() if k != "id"})
    assert plan.trace.synthetic and plan.request.trace_id == 2
