"""`servetune simulate` on a tiny hand-made trace."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from api.cli import app

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "colocated-h100.yaml"


def _trace(path: Path, n: int = 20) -> Path:
    rows = ["arrival_s,input_tokens,output_tokens"]
    rows += [f"{i * 0.5},{200 + 10 * i},{20 + i}" for i in range(n)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_simulate_json_from_file(cli_db: str, runner: CliRunner, tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.csv")
    result = runner.invoke(
        app,
        ["simulate", "--trace", str(trace), "--config", str(CONFIG),
         "--slo-ttft-ms", "2000", "--slo-tpot-ms", "50", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["num_requests"] == 20 and data["num_completed"] == 20
    assert data["config"]["model"] == "llama-3.1-8b"
    assert data["num_gpus"] == 1
    # A light load on an H100: everyone meets a 2 s / 50 ms SLO.
    assert data["slo_attainment"] == 1.0
    assert data["ttft_s"]["p50"] <= data["ttft_s"]["p99"]
    assert data["latency_is_estimate"] is True


def test_simulate_stored_trace_table_and_overrides(
    cli_db: str, runner: CliRunner, tmp_path: Path
) -> None:
    trace = _trace(tmp_path / "t.csv")
    assert runner.invoke(app, ["traces", "import", str(trace)]).exit_code == 0
    result = runner.invoke(
        app, ["simulate", "--trace", "1", "--config", str(CONFIG), "--gpu", "a100"]
    )
    assert result.exit_code == 0, result.output
    assert "TTFT ms" in result.output and "roofline" in result.output


def test_simulate_rejects_bad_inputs(cli_db: str, runner: CliRunner, tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.csv")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: llama-3.1-8b\nmode: colocated\nreplica: {max_num_seqs: -1}\n")
    out = runner.invoke(app, ["simulate", "--trace", str(trace), "--config", str(bad)])
    assert out.exit_code == 2 and "max_num_seqs" in out.output
    out = runner.invoke(app, ["simulate", "--trace", "99", "--config", str(CONFIG)])
    assert out.exit_code == 2 and "trace 99 not found" in out.output
    out = runner.invoke(
        app, ["simulate", "--trace", str(trace), "--config", str(CONFIG), "--slo-ttft-ms", "5"]
    )
    assert out.exit_code == 2 and "both --slo-ttft-ms and --slo-tpot-ms" in out.output
    out = runner.invoke(
        app, ["simulate", "--trace", str(trace), "--config", str(CONFIG), "--gpu", "tpu9"]
    )
    assert out.exit_code == 2 and "tpu9" in out.output


def _closed_loop(runner: CliRunner, path: Path, prompt: int) -> tuple[dict, str]:
    """`simulate --workload` of 8 equal clients: (its JSON, its table as one line)."""
    path.write_text(f"random_input_len: {prompt}\nrandom_output_len: 64\nnum_prompts: 64\n"
                    "max_concurrency: 8\n")  # fmt: skip
    args = ["simulate", "--workload", str(path), "--config", str(CONFIG)]
    out, table = runner.invoke(app, [*args, "--json"]), runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    assert table.exit_code == 0, table.output
    return json.loads(out.output), " ".join(table.output.split())


def test_simulate_a_closed_loop_claims_no_out_of_step_range(
    cli_db: str, runner: CliRunner, tmp_path: Path
) -> None:
    """Equal clients whose 2,048-token steps hold 8 of their prompts: the replay's figures
    alone, no note that real runs would be faster out of step (measured closed loops,
    replayed under their own protocol, match the replay: docs/closed-loop.md)."""
    data, text = _closed_loop(runner, tmp_path / "short.yaml", 256)
    assert "out_of_step" not in data and data["ttft_s"]["mean"] > 0
    assert "note:" not in text and "out of step" not in text


def test_simulate_jobs_gives_the_serial_figures(
    cli_db: str, runner: CliRunner, tmp_path: Path
) -> None:
    """Three round-robin replicas in two processes print the serial run's figures; a
    fleet that cannot be split says why and runs in one process."""
    trace = _trace(tmp_path / "t.csv", n=60)
    config = tmp_path / "three.yaml"
    config.write_text(CONFIG.read_text().replace("num_replicas: 1", "num_replicas: 3"))
    base = ["simulate", "--trace", str(trace), "--config", str(config), "--json",
            "--slo-ttft-ms", "200", "--slo-tpot-ms", "20"]  # fmt: skip
    serial = runner.invoke(app, base)
    parallel = runner.invoke(app, [*base, "--jobs", "2"])
    assert serial.exit_code == 0 and parallel.exit_code == 0, parallel.output
    one, two = json.loads(serial.output), json.loads(parallel.output)
    assert (one["processes"], two["processes"]) == (1, 2)
    for key in ("ttft_s", "tpot_s", "e2e_s", "slo_attainment", "num_completed"):
        assert two[key] == one[key], key
    alone = runner.invoke(app, ["simulate", "--trace", str(trace), "--config", str(CONFIG),
                                "--jobs", "2", "--json"])  # fmt: skip
    assert alone.exit_code == 0, alone.output
    assert json.loads(alone.stdout)["one_process_because"] == "one replica"
    bad = runner.invoke(app, [*base, "--jobs", "0"])
    assert bad.exit_code != 0 and "--jobs: expected a whole number" in bad.output
