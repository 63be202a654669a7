"""`servetune simulate` of a workload the deployment rejects whole: no infinite rates, the
reason with its figures, and JSON that strict parsers read."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from api.cli import app


def _files(tmp_path: Path) -> tuple[Path, Path]:
    trace = tmp_path / "long.csv"
    rows = ["arrival_s,input_tokens,output_tokens"]
    rows += [f"{i * 0.5},{2000 + 10 * i},20" for i in range(10)]
    trace.write_text("\n".join(rows) + "\n")
    config = tmp_path / "short.yaml"
    config.write_text("model: llama-3.1-8b\nmax_model_len: 1024\nreplica: {accelerator: h100}\n")
    return trace, config


def _strict(text: str) -> dict:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_an_all_rejected_workload_says_why(cli_db: str, runner: CliRunner, tmp_path: Path) -> None:
    trace, config = _files(tmp_path)
    args = ["simulate", "--trace", str(trace), "--config", str(config),
            "--slo-ttft-ms", "2000", "--slo-tpot-ms", "100"]  # fmt: skip
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    text = " ".join(table.output.split())
    assert "inf" not in text.replace("infer", "")
    assert "0 / 10" in text and "0.000 req/s" in text
    assert (
        "every request rejected, as vLLM rejects them: 10 with more prompt + output tokens "
        "than the 1,024 one request may hold (max_model_len 1,024); the longest has 2,090 + "
        "20 = 2,110" in text
    )
    out = runner.invoke(app, [*args, "--json"])
    assert out.exit_code == 0, out.output
    data = _strict(out.output)
    assert data["num_completed"] == 0 and data["num_rejected"] == 10
    assert data["request_throughput"] == data["output_token_throughput"] == 0.0
    assert data["goodput"] == 0.0 and data["slo_attainment"] == 0.0
    assert data["rejected_because"].startswith("every request rejected")
