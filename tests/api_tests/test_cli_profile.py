"""`servetune profile` end to end on a SQLite file (tiny shape, CPU, a very small grid)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli import app
from optimizer.records import DeviceInfo, KernelSample, OpKind
from profiler.importers import ImportedProfile, ImportFormat

SMALL_GRID = {
    "num_tokens": [2, 8],
    "tp_degrees": [1],
    "lm_head_rows": [1],
    "prefill_chunk_lens": [4],
    "prefill_batch_sizes": [1],
    "prefill_context_lens": [0],
    "decode_batch_sizes": [2],
    "decode_kv_lens": [8],
    "verify_batch_sizes": [1],
    "verify_k_values": [1],
    "verify_kv_lens": [8],
    "mixed_chunk_lens": [4],
    "mixed_num_decodes": [2],
    "mixed_decode_kv_lens": [8],
    "warmup": 0,
    "repeats": 2,
    "min_repeats": 1,
    "max_case_s": 0.01,
}


def _grid_file(tmp_path: Path, **overrides: object) -> Path:
    path = tmp_path / "grid.json"
    path.write_text(json.dumps({**SMALL_GRID, **overrides}))
    return path


def test_run_list_show_delete(cli_db: str, runner: CliRunner, tmp_path: Path) -> None:
    grid = _grid_file(tmp_path)
    result = runner.invoke(
        app, ["profile", "run", "--model", "tiny", "--device", "cpu", "--grid", str(grid)]
    )
    assert result.exit_code == 0, result.output
    # 2 token counts x 9 token ops + lm_head + prefill + decode + verify + mixed
    assert "stored profile run 1: 23 samples" in result.output

    listed = runner.invoke(app, ["profile", "list"])
    assert listed.exit_code == 0, listed.output
    assert "tiny@cpu" in listed.output and "profiler" in listed.output

    shown = runner.invoke(app, ["profile", "show", "1"])
    assert shown.exit_code == 0, shown.output
    for text in ("qkv_proj", "mixed_iteration", "prefill_attn", "threads", "torch"):
        assert text in shown.output
    assert "│ 2 " in shown.output.replace("  ", " ")  # two qkv_proj samples

    assert runner.invoke(app, ["profile", "delete", "1"]).exit_code == 0
    missing = runner.invoke(app, ["profile", "show", "1"])
    assert missing.exit_code == 2 and "profile run 1 not found" in missing.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nope"], "unknown model shape 'nope'"),
        (["--model", "tiny", "--device", "tpu"], "not understood"),
        (["--model", "tiny", "--grid", "huge"], "expected quick, default or a JSON/YAML"),
        (["--model", "tiny", "--dtype", "fp8"], "cannot be profiled"),
    ],
)
def test_run_rejects_bad_input(cli_db: str, runner: CliRunner, args: list, message: str) -> None:
    result = runner.invoke(app, ["profile", "run", *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "no profile runs stored" in runner.invoke(app, ["profile", "list"]).output


def test_run_rejects_bad_grid_file(cli_db: str, runner: CliRunner, tmp_path: Path) -> None:
    bad_key = _grid_file(tmp_path, tokens=[1])
    result = runner.invoke(app, ["profile", "run", "--model", "tiny", "--grid", str(bad_key)])
    assert result.exit_code == 2 and "unknown grid keys ['tokens']" in result.output
    bad_tp = _grid_file(tmp_path, tp_degrees=[3])
    result = runner.invoke(app, ["profile", "run", "--model", "tiny", "--grid", str(bad_tp)])
    assert result.exit_code == 2 and "tp degree 3 does not fit shape tiny" in result.output


def test_import_stores_what_the_importer_returns(
    cli_db: str, runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import profiler.importers as importers

    calls = []
    sample = KernelSample(OpKind.GEMM, 0.5, 0.5, 0.5, num_tokens=16, n=4096, k=4096)

    def fake(path: Path, fmt: ImportFormat, gpu: str | None) -> ImportedProfile:
        calls.append((path, fmt, gpu))
        device = DeviceInfo(kind="imported", name="NVIDIA H100")
        return ImportedProfile("aiconfigurator", "h100", device, [sample, sample])

    monkeypatch.setattr(importers, "import_profile", fake)
    folder = tmp_path / "h100_sxm"
    folder.mkdir()
    result = runner.invoke(
        app, ["profile", "import", str(folder), "--format", "aiconfigurator", "--gpu", "h100"]
    )
    assert result.exit_code == 0, result.output
    assert "stored profile run 1 (h100): 2 samples" in result.output
    assert calls == [(folder, ImportFormat.AICONFIGURATOR, "h100")]
    shown = runner.invoke(app, ["profile", "show", "1"])
    assert "gemm" in shown.output and "NVIDIA H100" in shown.output


def test_import_errors(cli_db: str, runner: CliRunner, tmp_path: Path) -> None:
    missing = runner.invoke(app, ["profile", "import", str(tmp_path / "nope"), "--format", "vidur"])
    assert missing.exit_code == 2 and "no such file or folder" in missing.output
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    result = runner.invoke(app, ["profile", "import", str(bad), "--format", "vidur"])
    assert result.exit_code == 2, result.output
    assert "no profile runs stored" in runner.invoke(app, ["profile", "list"]).output


@pytest.mark.shared_data
def test_import_vidur_table(cli_db: str, runner: CliRunner, shared_data: Path) -> None:
    path = shared_data / "profiles/vidur/compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv"
    result = runner.invoke(app, ["profile", "import", str(path), "--format", "vidur"])
    assert result.exit_code == 0, result.output
    assert "stored profile run 1 (h100)" in result.output
    shown = runner.invoke(app, ["profile", "show", "1"])
    assert "qkv_proj" in shown.output and "vidur" in shown.output
