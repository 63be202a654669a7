"""`tune` and `explain` print the outcome's own sentences (one figure per claim), name the
run's GPUs in hints, leave no empty progress bar behind an error, and refuse an outcome
they cannot read with a reason."""

from __future__ import annotations

import json

from api.cli import app
from api.cli.tune import _price_hint
from optimizer.search import TuneRequest
from tests.api_tests.fakes import fake_outcome


def test_the_price_hint_names_the_gpus_of_the_run():
    request = TuneRequest(
        trace_id=1, model="llama-3.1-8b", gpu_types=("h200",), gpu_budget=4,
        slo_ttft_ms=2000, slo_tpot_ms=50,
    )  # fmt: skip
    assert '[["h200", 2.5]]' in _price_hint(fake_outcome(request, 3))


def test_an_unknown_trace_leaves_no_progress_bar_behind(cli_db, runner):
    res = runner.invoke(app, [
        "tune", "--trace", "999", "--model", "llama-3.1-8b", "--gpu", "h100", "--gpus", "4",
        "--slo-ttft-ms", "2000", "--slo-tpot-ms", "50", "--trials", "5",
    ])  # fmt: skip
    assert res.exit_code == 2 and "error: trace 999 not found" in res.output
    assert "0/5" not in res.output and "tuning" not in res.output


def test_explain_prints_the_outcomes_own_sentences(cli_db, runner, tmp_path):
    from api.cli.quickstart import write_sample_trace

    trace = write_sample_trace(tmp_path / "t.csv", num_requests=150)
    space = json.dumps({"tp": [1], "max_num_batched_tokens": [256, 4096], "max_num_seqs": [512]})
    res = runner.invoke(app, [
        "tune", "--trace", str(trace), "--model", "llama-3.1-8b", "--gpu", "h100", "--gpus", "2",
        "--slo-ttft-ms", "2000", "--slo-tpot-ms", "50", "--trials", "4", "--study", "ans",
        "--space", space, "--workers", "1", "--out", str(tmp_path / "out"),
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    tuned = " ".join(res.output.split())
    outcome = json.loads((tmp_path / "out" / "outcome.json").read_text())
    verdict = outcome["verdict"]
    res = runner.invoke(app, ["explain", "ans"])
    assert res.exit_code == 0, res.output
    explained = " ".join(res.output.split())
    # tune and explain state the same verdict and baseline, word for word.
    for sentence in (verdict["headline"], verdict["baseline"]):
        assert sentence in tuned and sentence in explained
    for sentence in verdict["what_ifs"]:
        assert sentence in explained
    # The trials, and those that lost counted by reason.
    trials = outcome["trials"]
    assert "Trials: 4 finished" in explained and trials["lost"]
    for g in trials["lost"]:
        why = g["fate"] + (f" ({g['reason']})" if g["reason"] else "")
        listed = ", ".join(str(n) for n in g["trials"])
        assert f"{g['count']} {why}: trials {listed}" in explained
    # The same from the outcome.json file.
    again = runner.invoke(app, ["explain", str(tmp_path / "out" / "outcome.json")])
    assert again.exit_code == 0 and " ".join(again.output.split()) == explained


def test_explain_refuses_an_outcome_of_another_version_with_a_reason(cli_db, runner, tmp_path):
    old = tmp_path / "outcome.json"
    old.write_text(json.dumps({"schema_version": 4, "diagnosis": {}}), encoding="utf-8")
    res = runner.invoke(app, ["explain", str(old)])
    assert res.exit_code == 2
    assert "schema_version 4" in res.output and "run the study again" in res.output
