"""`servetune profile import --aiconfigurator`: the installed aiconfigurator-core's tables.

Most tests run on a fake package tree put first on sys.path: its `__init__.py` raises
(the package must be located, never imported), and it holds `silicon_sample.csv`
files of garbage that no code may open (servetune's external check). One test reads
the real package (the `aic` extra): skipped without it, mandatory with
SERVETUNE_REQUIRE_AIC=1.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from api.cli import app
from optimizer.records import OpKind
from profiler.importers import ProfileImportError
from profiler.importers._common import NEVER_READ, read_csv, read_parquet
from profiler.importers.aiconfigurator_package import (
    PACKAGE,
    choose_engine_systems,
    choose_systems,
    import_system,
    locate_package,
)

FAKE_VERSION = "0.12.0.post99"
NEVER_READ_NAME = "silicon_sample.csv"
GARBAGE = b"\x00\xffnot,a\ntable\x01" * 64

# Every path Python opened or polars was asked to read while a test ran (session-wide:
# an audit hook cannot be removed, so it only appends to this list).
_OPENED: list[str] = []


def _audit(event: str, args: tuple) -> None:
    if event == "open" and args and isinstance(args[0], str | bytes | Path):
        _OPENED.append(str(args[0]))


sys.addaudithook(_audit)


@pytest.fixture
def watch_reads(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[str]]:
    """A function listing the paths opened so far in the test (Python's open, polars'
    readers)."""
    start = len(_OPENED)
    asked: list[str] = []
    for fn in ("read_parquet", "read_csv", "scan_parquet", "scan_csv", "read_parquet_schema"):
        original = getattr(pl, fn)

        def wrapped(source, *args, _original=original, **kwargs):
            asked.append(str(source))
            return _original(source, *args, **kwargs)

        monkeypatch.setattr(pl, fn, wrapped)
    return lambda: asked + _OPENED[start:]


def _never_read(watch_reads: Callable[[], list[str]]) -> list[str]:
    return [p for p in watch_reads() if Path(p).name in NEVER_READ]


def _table(path: Path, rows: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = len(next(iter(rows.values())))
    meta = {"device": ["NVIDIA H100 80GB HBM3"] * n, "framework": ["VLLM"] * n}
    pl.DataFrame({**meta, **rows}).write_parquet(path)


def _gemm_rows() -> dict:
    rows: dict[str, list] = {"gemm_dtype": [], "m": [], "n": [], "k": [], "latency": []}
    for n, k in ((4096, 4096), (1024, 4096), (4096, 1024), (8192, 4096), (2048, 2048)):
        for m in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048):
            rows["gemm_dtype"].append("bfloat16")
            rows["m"].append(m)
            rows["n"].append(n)
            rows["k"].append(k)
            rows["latency"].append(0.006 + 2 * m * n * k / 700e12 * 1e3 + n * k * 2 / 3e12 * 1e3)
    return rows


def _attention_rows(phase: str) -> dict:
    cols = ("batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim")
    rows: dict[str, list] = {c: [] for c in (*cols, "latency")}
    grid = (
        [(b, isl, 0) for b in (1, 2, 4) for isl in (128, 256, 512, 1024, 2048, 4096)]
        if phase == "context"
        else [(b, 1, s) for b in (1, 4, 16, 64) for s in (128, 512, 1024, 2048, 4096, 8192)]
    )
    for heads, kv_heads in ((32, 8), (16, 4)):
        for b, isl, step in grid:
            flops = 4 * b * isl * (isl + step) * heads * 128
            bytes_ = 2 * 2 * b * (isl + step) * kv_heads * 128
            for col, value in zip(cols, (b, isl, step, heads, kv_heads, 128), strict=True):
                rows[col].append(value)
            rows["latency"].append(0.008 + flops / 400e12 * 1e3 + bytes_ / 2.5e12 * 1e3)
    n = len(rows["latency"])
    fixed = {"attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "beam_width": 1}
    return {**rows, **{c: [v] * n for c, v in fixed.items()}, "window_size": [0] * n}


def _fake_package(root: Path) -> Path:
    """A site folder holding a tiny aiconfigurator-core: h100_sxm's vLLM GEMM and
    attention tables, an empty l4 and a gb200 servetune has no preset for."""
    site = root / "site"
    pkg = site / PACKAGE
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('aiconfigurator_core was imported')\n")
    dist = site / f"aiconfigurator_core-{FAKE_VERSION}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: aiconfigurator-core\nVersion: {FAKE_VERSION}\n"
    )
    systems = pkg / "systems"
    data = systems / "data"
    (systems / "h100_sxm.yaml").parent.mkdir(parents=True)
    (systems / "h100_sxm.yaml").write_text("gpu:\n  mem_capacity: 85899345920\n  sm_version: 90\n")
    (systems / NEVER_READ_NAME).write_bytes(GARBAGE)
    version = data / "h100_sxm" / "gemm" / "vllm" / "0.24.0"
    _table(version / "gemm_perf.parquet", _gemm_rows())
    (version / NEVER_READ_NAME).write_bytes(GARBAGE)
    attention = data / "h100_sxm" / "attention" / "vllm" / "0.24.0"
    for phase in ("context", "generation"):
        _table(attention / f"{phase}_attention_perf.parquet", _attention_rows(phase))
    (data / "l4").mkdir()
    (data / "gb200" / "gemm" / "vllm" / "0.24.0").mkdir(parents=True)
    return site


@pytest.fixture
def fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake tree first on sys.path, where find_spec and importlib.metadata look."""
    site = _fake_package(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    assert PACKAGE not in sys.modules
    return site


def test_never_read_is_the_silicon_sample() -> None:
    assert NEVER_READ_NAME in NEVER_READ


def test_readers_refuse_the_external_check_by_name(tmp_path: Path, watch_reads) -> None:
    path = tmp_path / NEVER_READ_NAME
    path.write_bytes(GARBAGE)  # (an open of its own, counted below)
    written = len(_never_read(watch_reads))
    with pytest.raises(ProfileImportError, match="never read"):
        read_csv(path)
    with pytest.raises(ProfileImportError, match="never read"):
        read_parquet(path, ("latency",))
    assert len(_never_read(watch_reads)) == written


def test_missing_package_names_the_extra(
    cli_db: str, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == PACKAGE else real(name, *a)
    )
    result = runner.invoke(app, ["profile", "import", "--aiconfigurator", "--gpu", "h100"])
    assert result.exit_code == 2, result.output
    assert "aiconfigurator-core is not installed" in result.output
    assert "pip install 'servetune[aic]'" in result.output


@pytest.mark.usefixtures("wide_console")
def test_import_fake_package_stores_provenance_and_fits(
    cli_db: str, runner: CliRunner, fake_package: Path, watch_reads
) -> None:
    result = runner.invoke(app, ["profile", "import", "--aiconfigurator", "--gpu", "h100"])
    assert result.exit_code == 0, result.output
    label = f"aiconfigurator-core {FAKE_VERSION}"
    assert f"stored profile run 1 (h100): 144 samples from {label} h100_sxm (vllm)" in (
        result.output
    )
    assert "stored latency model 1" in result.output
    assert f"{label}: h100_sxm vllm v1" in result.output
    runs = runner.invoke(app, ["profile", "list"], terminal_width=200).output
    assert f"{label}: h100_sxm vllm" in runs
    shown = runner.invoke(app, ["latency", "show", "1"])
    assert shown.exit_code == 0 and "h100" in shown.output
    # located, never executed; the external check never opened
    assert PACKAGE not in sys.modules
    # the fixtures wrote the tree before watch_reads began; the import read the tables
    assert any(p.endswith("gemm_perf.parquet") for p in watch_reads())
    assert any(p.endswith("h100_sxm.yaml") for p in watch_reads())
    assert _never_read(watch_reads) == []


def test_gpu_choices_and_errors(
    cli_db: str, runner: CliRunner, fake_package: Path, watch_reads
) -> None:
    unknown = runner.invoke(app, ["profile", "import", "--aiconfigurator", "--gpu", "gh200"])
    assert unknown.exit_code == 2
    assert "--gpu 'gh200'" in unknown.output and "no system for it" in unknown.output
    assert "gb200, h100_sxm, l4" in unknown.output  # the systems the package has
    absent = runner.invoke(app, ["profile", "import", "--aiconfigurator", "--gpu", "h200"])
    assert absent.exit_code == 2 and "no system for it" in absent.output
    no_gpu = runner.invoke(app, ["profile", "import", "--aiconfigurator"])
    assert no_gpu.exit_code == 2 and "needs --gpu NAME or --gpu all" in no_gpu.output
    sglang = ["profile", "import", "--aiconfigurator", "--gpu", "h100", "--engine", "sglang"]
    no_engine = runner.invoke(app, sglang)
    assert no_engine.exit_code == 2 and "holds no sglang GEMM" in no_engine.output
    both = runner.invoke(app, ["profile", "import", "/tmp", "--aiconfigurator", "--gpu", "h100"])
    assert both.exit_code == 2 and "mutually exclusive" in both.output
    neither = runner.invoke(app, ["profile", "import"])
    assert neither.exit_code == 2 and "--aiconfigurator --gpu NAME" in neither.output
    assert "no profile runs stored" in runner.invoke(app, ["profile", "list"]).output
    chosen, skipped = choose_systems(locate_package(), "all", "vllm")
    assert [(c.accelerator, c.system) for c in chosen] == [("h100", "h100_sxm")]
    assert {s.system: s.reason for s in skipped} == {
        "gb200": "no servetune accelerator preset",
        "l4": "no tables (an empty folder)",
    }
    assert _never_read(watch_reads) == []


def test_engine_systems_of_the_fake_package(fake_package: Path, watch_reads) -> None:
    """The (system, engine) pairs benchmarks/bench_latency_model.py --aic-package fits: per
    engine what choose_systems(package, "all", engine) takes, kept to the named systems."""
    package = locate_package()
    chosen, skipped = choose_engine_systems(package, ("vllm", "sglang"))
    assert [(p.engine, p.choice.accelerator, p.choice.system) for p in chosen] == [
        ("vllm", "h100", "h100_sxm")
    ]
    reasons = {(engine, s.system): s.reason for engine, s in skipped}
    assert set(reasons) == {(e, s) for e in ("vllm", "sglang") for s in ("gb200", "l4")} | {
        ("sglang", "h100_sxm")
    }
    assert reasons["sglang", "h100_sxm"] == "no sglang GEMM and attention tables"
    assert reasons["vllm", "l4"] == "no tables (an empty folder)"
    named, left = choose_engine_systems(package, ("vllm", "sglang"), ("h100",))
    assert [(p.engine, p.choice.system) for p in named] == [("vllm", "h100_sxm")]
    assert [(engine, s.system) for engine, s in left] == [("sglang", "h100_sxm")]
    by_folder, _ = choose_engine_systems(package, ("vllm",), ("H100_SXM", "l4"))
    assert [p.choice.system for p in by_folder] == ["h100_sxm"]
    with pytest.raises(ProfileImportError, match=r"\['h200_sxm'\]: .* no system for them"):
        choose_engine_systems(package, ("vllm",), ("h200",))
    with pytest.raises(ProfileImportError, match="expected one of"):
        choose_engine_systems(package, ("tgi",))
    assert PACKAGE not in sys.modules
    assert _never_read(watch_reads) == []


@pytest.mark.aic
def test_real_package_h100_vllm(aic_package, watch_reads) -> None:
    """The installed wheel's H100 vLLM tables import with every operator the shared copy
    gives (the same wheel's tables), without touching its silicon_sample.csv."""
    assert aic_package.version != "unknown version"
    chosen, _ = choose_systems(aic_package, "h100", "vllm")
    imported = import_system(aic_package, chosen[0], "vllm")
    assert imported.accelerator == "h100" and "H100" in imported.device.name
    counts = Counter(s.op for s in imported.samples)
    assert {OpKind.GEMM, OpKind.PREFILL_ATTN, OpKind.DECODE_ATTN, OpKind.ALL_REDUCE} <= set(counts)
    assert {OpKind.VLLM_ALL_REDUCE, OpKind.MOE, OpKind.MLA_DECODE} <= set(counts)
    assert counts[OpKind.GEMM] > 10_000
    assert imported.device.memory_gb is not None  # the spec YAML beside data/ was read
    assert PACKAGE not in sys.modules
    assert _never_read(watch_reads) == []
