from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from api.cli import app


def test_tune_then_explain(cli_db, runner, tmp_path):
    from api.cli.quickstart import write_sample_trace

    trace = write_sample_trace(tmp_path / "t.csv", num_requests=150)
    space = json.dumps({"tp": [1], "max_num_batched_tokens": [1024, 4096],
                        "max_num_seqs": [128], "modes": ["colocated"]})  # fmt: skip
    res = runner.invoke(app, [
        "tune", "--trace", str(trace), "--model", "llama-3.1-8b", "--gpu", "h100", "--gpus", "2",
        "--slo-ttft-ms", "2000", "--slo-tpot-ms", "50", "--trials", "3", "--study", "cli1",
        "--space", space, "--workers", "1", "--out", str(tmp_path / "out"),
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())  # however the terminal wraps it
    # What was tuned comes first: model, GPUs, SLOs, attainment, the evaluated trace.
    assert (
        "Tuned llama-3.1-8b on h100 (budget 2 GPUs) for TTFT <= 2000 ms, TPOT <= 50 ms at "
        "90% attainment" in text
    )
    assert "trace: 150 requests over" in text and "trials on the whole trace" in text
    assert "vllm serve meta-llama/Llama-3.1-8B-Instruct" in res.output
    assert "Baseline" in res.output and "Capacity plan" in res.output
    for name in ("outcome.json", "recommended.yaml", "pareto.png", "pareto.html"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    # `simulate` of the recommended config on the same trace and SLOs gives the outcome's
    # predicted figures.
    outcome = json.loads((tmp_path / "out" / "outcome.json").read_text())
    predicted = outcome["recommendation"]["predicted"]
    sim = runner.invoke(app, [
        "simulate", "--trace", str(trace), "--config", str(tmp_path / "out" / "recommended.yaml"),
        "--slo-ttft-ms", "2000", "--slo-tpot-ms", "50", "--json",
    ])  # fmt: skip
    assert sim.exit_code == 0, sim.output
    got = json.loads(sim.output)
    pairs = [
        (predicted["ttft_p50_ms"], got["ttft_s"]["p50"] * 1e3),
        (predicted["ttft_p90_ms"], got["ttft_s"]["p90"] * 1e3),
        (predicted["ttft_p99_ms"], got["ttft_s"]["p99"] * 1e3),
        (predicted["tpot_p90_ms"], got["tpot_s"]["p90"] * 1e3),
        (predicted["tpot_p99_ms"], got["tpot_s"]["p99"] * 1e3),
        (_at(predicted, "trace")["share"], got["slo_attainment"]),
    ]
    for want, have in pairs:
        assert have == pytest.approx(want, rel=0.005)
    assert got["num_gpus"] == predicted["num_gpus"]
    assert "cdn" not in (tmp_path / "out" / "pareto.html").read_text().lower()
    res = runner.invoke(app, ["explain", "cli1"])
    assert res.exit_code == 0, res.output
    explained = " ".join(res.output.split())
    # The verdict, the trials with what decided each, and where GPU time goes.
    assert outcome["verdict"]["headline"].split(":")[0] in explained
    assert "Trials: 3 finished" in explained and "GPU time in prefill-only steps" in explained


def _at(predicted: dict, load: str) -> dict:
    """The attainment of an outcome's figures measured at `load`."""
    return next(a for a in predicted["attainments"] if a["load"] == load)


def test_tune_rejects_bad_input(cli_db, runner):
    res = runner.invoke(app, ["tune", "--trace", "/no/such.csv", "--model", "llama-3.1-8b",
                              "--gpu", "h100", "--gpus", "2", "--slo-ttft-ms", "2000",
                              "--slo-tpot-ms", "50"])  # fmt: skip
    assert (
        res.exit_code == 2 and "expected a stored trace id or an existing trace file" in res.output
    )
    res = runner.invoke(app, ["explain", "nope"])
    assert res.exit_code == 2 and "no tuning run named 'nope'" in res.output


def test_piped_output_is_wide_unless_columns_says_otherwise():
    """rich assumes 80 columns for a pipe, which cut the Pareto table to 'goo…'."""
    probe = [sys.executable, "-c", "from api.cli.common import console; print(console.width)"]
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    piped = subprocess.run(probe, env=env, capture_output=True, text=True, check=True)
    assert piped.stdout.strip() == "160"
    narrow = subprocess.run(
        probe, env={**env, "COLUMNS": "100"}, capture_output=True, text=True, check=True
    )
    assert narrow.stdout.strip() == "100"


def test_tune_a_vllm_bench_serve_workload(cli_db, runner, tmp_path):
    """A finite-rate `vllm bench serve` file is tuned as the trace its client sends:
    stored once as a trace of its send times and lengths."""
    path = tmp_path / "bench.yaml"
    path.write_text(
        "dataset_name: random\nrandom_input_len: 512\nrandom_output_len: 64\n"
        "num_prompts: 120\nrequest_rate: 4\nseed: 3\n"
    )
    space = json.dumps({"tp": [1], "max_num_batched_tokens": [2048], "max_num_seqs": [64],
                        "modes": ["colocated"]})  # fmt: skip
    args = ["tune", "--workload", str(path), "--model", "llama-3.1-8b", "--gpu", "h100",
            "--gpus", "1", "--slo-ttft-ms", "2000", "--slo-tpot-ms", "60", "--trials", "2",
            "--space", space, "--workers", "1"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "trace: 120 requests over" in text
    from api.cli.common import session
    from storage.traces import list_traces

    with session() as s:
        (stored,) = list_traces(s)
    assert stored.name.startswith("bench-serve random 512/64") and stored.stats.num_requests == 120
    # `simulate --workload` replays exactly the trace tune stored and sized for.
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: llama-3.1-8b\nreplica:\n  accelerator: h100\n")
    by_file = runner.invoke(app, ["simulate", "--workload", str(path), "--config", str(cfg),
                                  "--json"])  # fmt: skip
    by_id = runner.invoke(app, ["simulate", "--trace", str(stored.id), "--config", str(cfg),
                                "--json"])  # fmt: skip
    assert by_file.exit_code == 0 and by_id.exit_code == 0, by_file.output + by_id.output
    assert json.loads(by_file.output)["ttft_s"] == json.loads(by_id.output)["ttft_s"]
    assert json.loads(by_file.output)["tpot_s"] == json.loads(by_id.output)["tpot_s"]
    res = runner.invoke(app, [*args[:1], "--trace", "1", *args[1:]])
    assert res.exit_code == 2 and "exactly one of --trace" in res.output


def test_tune_a_closed_loop_benchmark(cli_db, runner, tmp_path):
    """`max_concurrency` below `num_prompts`: the fleet is sized for the clients, nothing is
    stored as a trace, and `simulate --workload` of the recommended fleet prints exactly
    the outcome's figures."""
    path = tmp_path / "bench.yaml"
    path.write_text(
        "random_input_len: 2048\nrandom_output_len: 64\nnum_prompts: 96\nmax_concurrency: 24\n"
    )
    space = json.dumps({"tp": [1], "max_num_batched_tokens": [2048, 8192], "max_num_seqs": [64],
                        "modes": ["colocated"]})  # fmt: skip
    res = runner.invoke(app, [
        "tune", "--workload", str(path), "--model", "llama-3.1-8b", "--gpu", "h100", "--gpus",
        "4", "--slo-ttft-ms", "400", "--slo-tpot-ms", "40", "--trials", "3", "--space", space,
        "--workers", "1", "--out", str(tmp_path / "out"),
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "closed loop: 24 clients sending 96 prompts" in text
    assert "(served to the benchmark's clients)" in text and "Capacity plan" in text
    from api.cli.common import session
    from storage.traces import list_traces

    with session() as s:
        assert list_traces(s) == []
    outcome = json.loads((tmp_path / "out" / "outcome.json").read_text())
    assert outcome["request"]["workload"] == {
        "random_input_len": 2048, "random_output_len": 64, "num_prompts": 96,
        "max_concurrency": 24,
    }  # fmt: skip
    assert outcome["evaluated"]["clients"] == 24
    predicted = outcome["recommendation"]["predicted"]
    sim = runner.invoke(app, [
        "simulate", "--workload", str(path), "--config", str(tmp_path / "out" / "recommended.yaml"),
        "--slo-ttft-ms", "400", "--slo-tpot-ms", "40", "--json",
    ])  # fmt: skip
    assert sim.exit_code == 0, sim.output
    got = json.loads(sim.output)
    assert got["num_gpus"] == predicted["num_gpus"]
    for want, have in [
        (predicted["ttft_p90_ms"], got["ttft_s"]["p90"] * 1e3),
        (predicted["tpot_p90_ms"], got["tpot_s"]["p90"] * 1e3),
        (_at(predicted, "clients")["share"], got["slo_attainment"]),
        (predicted["request_goodput"], got["goodput"]),
    ]:
        assert have == pytest.approx(want, rel=1e-9)
    # 1x is the recommendation; 2x and 4x the clients need at least as many GPUs.
    gpus = [row["num_gpus"] for row in outcome["capacity"]]
    assert gpus[0] == predicted["num_gpus"] and gpus == sorted(gpus)
    # Its 8,192-token steps hold 4 of these prompts: no out-of-step range claimed either.
    assert "out_of_step" not in outcome["recommendation"] and "out_of_step" not in got
    assert "out of step" not in text
