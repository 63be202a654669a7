"""`servetune validate`, `observations import/list` and `calibrate` end to end on SQLite."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from api.cli import app
from optimizer.config import InstanceConfig, ServingConfig
from optimizer.latency.base import StepLoad


def write_config(path: Path, config: ServingConfig) -> Path:
    path.write_text(yaml.safe_dump(config.to_dict()))
    return path


def vllm_json(path: Path, scale: float = 1.0) -> Path:
    n = 12
    data = {
        "backend": "vllm",
        "request_rate": 2.0,
        "input_lens": [200 + 50 * i for i in range(n)],
        "output_lens": [20 + i for i in range(n)],
        "ttfts": [0.05 * scale] * n,
        "latencies": [0.05 * scale + 0.012 * scale * (19 + i) for i in range(n)],
        "start_times": [0.5 * i for i in range(n)],
        "errors": [""] * n,
        "mean_ttft_ms": 50.0 * scale,
    }
    path.write_text(json.dumps(data))
    return path


H100 = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(accelerator="h100"))


def test_observations_import_list_and_calibrate(
    cli_db: str, runner: CliRunner, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "deploy.yaml", H100)
    first = runner.invoke(
        app, ["observations", "import", str(vllm_json(tmp_path / "a.json")), "--config", str(cfg)]
    )
    assert first.exit_code == 0, first.output
    assert "stored observation 1" in first.output and "mean_ttft_s" in first.output
    second = runner.invoke(
        app,
        ["observations", "import", str(vllm_json(tmp_path / "b.json", 1.2)), "--config", str(cfg)],
    )
    assert second.exit_code == 0, second.output
    listed = runner.invoke(app, ["observations", "list"])
    assert "a" in listed.output and "12" in listed.output
    cal = runner.invoke(app, ["calibrate", "--observations", "1", "--holdout", "2"])
    assert cal.exit_code == 0, cal.output
    assert "stored calibration 1 for llama-3.1-8b on h100 tp=1" in cal.output
    assert "->" in cal.output  # hold-out error before -> after
    again = runner.invoke(
        app, ["observations", "import", str(tmp_path / "a.json"), "--config", str(cfg)]
    )
    assert "calibration 1" in again.output  # later comparisons apply it


def test_bad_inputs_fail_cleanly_and_store_nothing(
    cli_db: str, runner: CliRunner, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "deploy.yaml", H100)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"input_lens": [10], "output_lens": [2]}))
    out = runner.invoke(app, ["observations", "import", str(bad), "--config", str(cfg)])
    assert out.exit_code == 2 and "missing key 'ttfts'" in out.output
    bad_cfg = tmp_path / "bad.yaml"
    bad_cfg.write_text("model: tiny\nreplica: {tp: 3}\n")
    out = runner.invoke(
        app,
        ["observations", "import", str(vllm_json(tmp_path / "a.json")), "--config", str(bad_cfg)],
    )
    assert out.exit_code == 2 and "tp" in out.output
    assert "a.json" not in runner.invoke(app, ["observations", "list"]).output
    out = runner.invoke(app, ["calibrate", "--observations", "7"])
    assert out.exit_code == 2 and "observation 7 not found" in out.output


@dataclass(frozen=True, slots=True)
class _Linear:
    is_estimate: bool = False

    def step_time_s(self, load: StepLoad) -> float:
        return 2e-3 + 5e-5 * load.num_tokens

    def for_instance(
        self, accelerator: str, tp: int, reach=None, precision=None, engine=None, layout=None
    ) -> _Linear:
        return self


def test_validate_replays_and_stores(
    cli_db: str, runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.services import validation

    fitted = validation.EngineLatency(_Linear(), _Linear(), 0.0, "linear stand-in")
    monkeypatch.setattr(validation, "profile_or_load_samples", lambda *a, **k: ([], 1))
    monkeypatch.setattr(validation, "fit_engine_latency", lambda *a: fitted)
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens\n0,40,4\n0.1,60,3\n0.2,30,5\n"
    )
    cfg = ServingConfig.colocated(
        "tiny", InstanceConfig(accelerator="cpu", max_num_batched_tokens=64, max_num_seqs=4,
                               gpu_memory_utilization=0.05)
    )  # fmt: skip
    out = runner.invoke(
        app,
        ["validate", "--trace", str(trace), "--config", str(write_config(tmp_path / "c.yaml", cfg)),
         "--max-requests", "3", "--slo-ttft-ms", "500", "--slo-tpot-ms", "100"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "p99_ttft_s" in out.output and "goodput_rps" in out.output
    assert "stored validation run 1" in out.output
    assert "engine self-calibration (synthetic batches, not the trace)" in out.output
    assert "stored the engine self-calibration as calibration 1" in out.output
    from storage.db import make_engine, session_scope
    from storage.validation import get_validation_run, latest_calibrations

    with session_scope(make_engine(cli_db)) as s:
        run = get_validation_run(s, 1)
        (cal,) = latest_calibrations(s, shape_name="tiny")
    assert run.kind == "replay" and run.comparison["num_requests"] == 3
    assert "self-calibration" in run.details["self_calibration"]
    assert cal.details["source"] == "engine-steps" and cal.details["kv_token_s"] >= 0
    assert cal.details["seq_s"] >= 0


def test_validate_rejects_half_an_slo(cli_db: str, runner: CliRunner, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", H100)
    out = runner.invoke(
        app, ["validate", "--trace", "1", "--config", str(cfg), "--slo-ttft-ms", "100"]
    )
    assert out.exit_code == 2 and "both --slo-ttft-ms and --slo-tpot-ms" in out.output
