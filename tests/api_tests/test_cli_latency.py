"""`servetune latency fit/list/show` on a quick CPU profile of the tiny shape, then
`servetune simulate --latency-model` priced by it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from api.cli import app

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "tiny-cpu.yaml"

# Every modelled op gets >= 10 points (8 to fit, plus a hold-out); seconds on CPU.
GRID = """
num_tokens: [1, 2, 4, 8, 16, 24, 32, 48, 64, 96]
tp_degrees: [1]
lm_head_rows: [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
prefill_batch_sizes: [1]
prefill_chunk_lens: [8, 16]
prefill_context_lens: [0, 8, 16, 32, 64]
decode_batch_sizes: [1, 2]
decode_kv_lens: [8, 16, 32, 64, 128]
verify_batch_sizes: [1]
verify_k_values: [1, 2]
verify_kv_lens: [8, 16, 32, 64, 128]
mixed_chunk_lens: [0, 8, 16]
mixed_num_decodes: [0, 1, 2]
mixed_decode_kv_lens: [16]
warmup: 1
repeats: 3
min_repeats: 1
max_case_s: 0.01
cold_cache_mb: 0
"""


def _trace(path: Path, n: int = 20) -> Path:
    rows = ["arrival_s,input_tokens,output_tokens"]
    rows += [f"{i * 0.05},{40 + 5 * i},{4 + i}" for i in range(n)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_fit_list_show_and_simulate(cli_db: str, runner: CliRunner, tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    out = runner.invoke(
        app, ["profile", "run", "--model", "tiny", "--device", "cpu", "--grid", str(grid)]
    )
    assert out.exit_code == 0, out.output
    assert "stored profile run 1" in out.output

    out = runner.invoke(
        app, ["latency", "fit", "--profile", "1", "--name", "tiny-cpu", "--max-iter", "20"]
    )
    assert out.exit_code == 0, out.output
    assert "stored latency model 1 (tiny-cpu v1, cpu" in out.output
    for op in ("qkv_proj", "mlp_down", "decode_attn", "prefill_attn", "lm_head"):
        assert op in out.output

    out = runner.invoke(app, ["latency", "list"])
    assert out.exit_code == 0 and "tiny-cpu" in out.output and "cpu" in out.output

    out = runner.invoke(app, ["latency", "show", "1"])
    assert out.exit_code == 0, out.output
    assert "fitted on 8 mixed iterations" in out.output  # (0,1),(0,2),(8|16 x 0,1,2)
    assert "their time alone" in out.output
    assert "schema_version 3" in out.output and "hold-out APE" in out.output

    trace = _trace(tmp_path / "t.csv")
    out = runner.invoke(
        app,
        ["simulate", "--trace", str(trace), "--config", str(CONFIG), "--latency-model", "1",
         "--json"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["latency_is_estimate"] is False and data["num_completed"] == 20
    assert data["config"]["model"] == "tiny"

    # A refit is the next version of the same name.
    out = runner.invoke(
        app, ["latency", "fit", "--profile", "1", "--name", "tiny-cpu", "--max-iter", "5"]
    )
    assert out.exit_code == 0 and "tiny-cpu v2" in out.output


def test_errors_store_nothing(cli_db: str, runner: CliRunner) -> None:
    out = runner.invoke(app, ["latency", "fit", "--profile", "99"])
    assert out.exit_code == 2 and "profile run 99 not found" in out.output
    assert "nothing stored" in out.output
    out = runner.invoke(app, ["latency", "list"])
    assert out.exit_code == 0 and "no latency models stored yet" in out.output
    out = runner.invoke(app, ["latency", "show", "42"])
    assert out.exit_code == 2 and "latency model id 42 not found" in out.output


def test_show_a_table_model_names_the_engine_pricing_on_its_chip(
    cli_db: str, runner: CliRunner
) -> None:
    """A model of kernel tables alone (no whole-step measurements, e.g. an AIConfigurator
    import) is priced by the deployed engine's constants: `show` states them, with the
    kernel scale of the model's own chip (B300's is measured, H100's is 1)."""
    from api.cli.common import session
    from optimizer.engines import DEFAULT_RELEASE
    from optimizer.latency.model import LatencyModel
    from optimizer.latency.persist import PAYLOAD_SCHEMA_VERSION, dump_model
    from storage.latency_models import save_latency_model

    with session() as s:
        for gpu in ("b300", "h100"):
            payload = dump_model(LatencyModel(gpu, "aiconfigurator"))
            save_latency_model(s, name=f"tables-{gpu}", accelerator=gpu, payload=payload,
                               schema_version=PAYLOAD_SCHEMA_VERSION)  # fmt: skip
    scale = DEFAULT_RELEASE.generation.kernel_scale("b300")
    assert scale != 1.0
    for model_id, expected in (("1", scale), ("2", 1.0)):
        out = runner.invoke(app, ["latency", "show", model_id])
        assert out.exit_code == 0, out.output
        # the table wraps its cells at the terminal's width: compare without layout
        text = re.sub(r"[\s\u2500-\u257f]", "", out.output)
        assert re.sub(r"\s", "", f"{DEFAULT_RELEASE.label}: kernels x {expected:g},") in text
        assert "notfitted(nowhole-stepmeasurements)" in text
