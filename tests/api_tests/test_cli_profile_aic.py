"""`servetune profile import --aiconfigurator`: the installed aiconfigurator-core's tables.

Most tests run on a fake package tree put first on sys.path: its `__init__.py` raises
(the package must be located, never imported), and it holds `silicon_sample.csv`
files of garbage that no code may open (servetune's external check). The tests marked
`aic` read the real package (the `aic` extra: its H100 tables, each mapped preset against
its system YAML): skipped without it, mandatory with SERVETUNE_REQUIRE_AIC=1.
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
import yaml
from typer.testing import CliRunner

from api.cli import app
from optimizer.hardware import get_accelerator
from optimizer.records import OpKind
from profiler.importers import ProfileImportError
from profiler.importers._common import NEVER_READ, read_csv, read_parquet
from profiler.importers.aiconfigurator_package import (
    PACKAGE,
    SYSTEMS,
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


def _vllm_tables(system: Path) -> None:
    """A system folder's vLLM GEMM and attention tables (the fake H100's)."""
    _table(system / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet", _gemm_rows())
    attention = system / "attention" / "vllm" / "0.24.0"
    for phase in ("context", "generation"):
        _table(attention / f"{phase}_attention_perf.parquet", _attention_rows(phase))


def _fake_package(root: Path) -> Path:
    """A site folder holding a tiny aiconfigurator-core: h100_sxm's vLLM GEMM and
    attention tables; b60's (no comm/nccl: its collectives under comm/oneccl); gb200's
    whose GEMM table lacks its latency column; an empty l4; and an a30 servetune has no
    preset for."""
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
    (data / "a30" / "gemm" / "vllm" / "0.24.0").mkdir(parents=True)
    _vllm_tables(data / "b60")
    (data / "b60" / "comm" / "oneccl" / "2021.15.9").mkdir(parents=True)
    _vllm_tables(data / "gb200")
    broken = _gemm_rows()
    del broken["latency"]
    _table(data / "gb200" / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet", broken)
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
    assert "a30, b60, gb200, h100_sxm, l4" in unknown.output  # the systems the package has
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
    assert [(c.accelerator, c.system) for c in chosen] == [
        ("b60", "b60"),
        ("gb200", "gb200"),
        ("h100", "h100_sxm"),
    ]
    assert {s.system: s.reason for s in skipped} == {
        "a30": "no servetune accelerator preset",
        "l4": "no tables (an empty folder)",
    }
    for alias in ("h100-sxm", "H100_SXM", "h100"):  # preset aliases name its system
        chosen, _ = choose_systems(locate_package(), alias, "vllm")
        assert [c.system for c in chosen] == ["h100_sxm"]
    assert _never_read(watch_reads) == []


@pytest.mark.usefixtures("wide_console")
def test_all_imports_past_a_failing_system(
    cli_db: str, runner: CliRunner, fake_package: Path, watch_reads
) -> None:
    """--gpu all: gb200's broken table is reported, b60 and h100 still import and fit,
    and the command exits 1 naming the failure."""
    result = runner.invoke(app, ["profile", "import", "--aiconfigurator", "--gpu", "all"])
    assert result.exit_code == 1, result.output
    assert "skipped a30: no servetune accelerator preset" in result.output
    assert "note: b60 has no comm/nccl tables (its collectives were measured with oneccl, " in (
        result.output
    )
    assert "error: gb200: " in result.output and "missing columns ['latency']" in result.output
    assert "stored profile run 1 (b60): 144 samples" in result.output
    assert "stored profile run 2 (h100): 144 samples" in result.output
    assert "1 of 3 systems failed: gb200 (the others were stored and fitted)" in result.output
    runs = runner.invoke(app, ["profile", "list"], terminal_width=200).output
    assert "h100_sxm vllm" in runs and "b60 vllm" in runs and "gb200" not in runs
    one = runner.invoke(app, ["profile", "import", "--aiconfigurator", "--gpu", "gb200"])
    assert one.exit_code == 2 and "error: gb200: " in one.output  # one system: its own error
    assert PACKAGE not in sys.modules
    assert _never_read(watch_reads) == []


def test_engine_systems_of_the_fake_package(fake_package: Path, watch_reads) -> None:
    """The (system, engine) pairs benchmarks/bench_latency_model.py --aic-package fits: per
    engine what choose_systems(package, "all", engine) takes, kept to the named systems."""
    package = locate_package()
    chosen, skipped = choose_engine_systems(package, ("vllm", "sglang"))
    assert [(p.engine, p.choice.accelerator, p.choice.system) for p in chosen] == [
        ("vllm", "b60", "b60"), ("vllm", "gb200", "gb200"), ("vllm", "h100", "h100_sxm")
    ]  # fmt: skip
    reasons = {(engine, s.system): s.reason for engine, s in skipped}
    assert set(reasons) == {(e, s) for e in ("vllm", "sglang") for s in ("a30", "l4")} | {
        ("sglang", s) for s in ("b60", "gb200", "h100_sxm")
    }
    assert reasons["sglang", "h100_sxm"] == "no sglang GEMM and attention tables"
    assert reasons["vllm", "l4"] == "no tables (an empty folder)"
    assert reasons["vllm", "a30"] == "no servetune accelerator preset"
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
    assert {OpKind.GDN_PREFILL, OpKind.GDN_DECODE, OpKind.DSA_DECODE} <= set(counts)
    assert counts[OpKind.GEMM] > 10_000
    assert imported.device.memory_gb is not None  # the spec YAML beside data/ was read
    assert PACKAGE not in sys.modules
    assert _never_read(watch_reads) == []


def _capability(sm_version: int | None) -> str | None:
    """The YAML's sm_version (100, 89, ...) as a compute capability ("10.0", "8.9")."""
    return None if sm_version is None else f"{sm_version // 10}.{sm_version % 10}"


@pytest.mark.aic
@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_presets_agree_with_the_package_yaml(aic_package, name: str, watch_reads) -> None:
    """Each preset mapped onto a system states that system's YAML figures: peaks and the
    link within 1%, bandwidth within 5% (the a100/b200/b300 presets keep the vendor's
    2.0/8.0/8.0 TB/s against the YAML's 2.039/7.7/7.75), memory the device-reported
    98-100% of the YAML's total, the SM version, GPUs per host and per link domain (the
    rack when it is reached at the intra-node bandwidth: NVL72)."""
    acc = get_accelerator(name)
    system = SYSTEMS[name]
    spec = yaml.safe_load(aic_package.spec_path(system).read_text(encoding="utf-8"))
    gpu, node = spec["gpu"], spec["node"]
    assert acc.bf16_tflops == pytest.approx(gpu["bfloat16_tc_flops"] / 1e12, rel=0.01)
    fp8 = gpu.get("fp8_tc_flops")
    if fp8 is None or fp8 == gpu["bfloat16_tc_flops"]:  # none, or "falls back to BF16" (b60)
        assert acc.fp8_tflops is None
    else:
        assert acc.fp8_tflops == pytest.approx(fp8 / 1e12, rel=0.01)
    fp4 = gpu.get("fp4_tc_flops")
    assert acc.fp4_tflops == (None if fp4 is None else pytest.approx(fp4 / 1e12, rel=0.01))
    assert acc.hbm_tb_s == pytest.approx(gpu["mem_bw"] / 1e12, rel=0.05)
    assert 0.98 <= acc.hbm_bytes / gpu["mem_capacity"] <= 1.0
    assert acc.compute_capability == _capability(gpu.get("sm_version"))
    assert acc.link_gb_s == pytest.approx(node["intra_node_bw"] / 1e9, rel=0.01)
    assert acc.num_gpus_per_node == node["num_gpus_per_node"]
    rack = node.get("num_gpus_per_rack")
    nvlink_rack = rack is not None and node["inter_node_bw"] >= node["intra_node_bw"]
    assert acc.num_gpus_per_domain == (rack if nvlink_rack else node["num_gpus_per_node"])
    assert acc.family == name  # its own tables: priced by its own model
    assert aic_package.has_engine(system, "vllm")
    assert _never_read(watch_reads) == []


@pytest.mark.aic
def test_real_package_maps_every_system_with_tables(aic_package) -> None:
    """Every system holding tables is mapped; b60 says its collectives are oneCCL's."""
    with_tables = [
        s for s in aic_package.systems() if any(d.is_dir() for d in aic_package.folder(s).iterdir())
    ]
    assert sorted(with_tables) == sorted(SYSTEMS.values())
    assert aic_package.engines("b60") == ["vllm"]
    assert aic_package.engines("gb200") == ["vllm", "sglang", "trtllm"]
    assert "measured with oneccl" in aic_package.notes("b60")[0]
    assert aic_package.notes("gb200") == []
    for alias in ("rtx_pro_6000", "rtx_pro_6000_server", "rtx-pro-6000"):
        chosen, _ = choose_systems(aic_package, alias, "vllm")
        assert [(c.accelerator, c.system) for c in chosen] == [
            ("rtx-pro-6000", "rtx_pro_6000_server")
        ]


@pytest.mark.aic
def test_real_package_h100_sglang_own_all_reduce_and_moe(aic_package, watch_reads) -> None:
    """SGLang's own all-reduce and fused MoE rows are read from its folders (0.5.14), as the
    engine's operators; its wide-EP and MLA tables are not (priced by the roofline)."""
    from profiler.importers.aiconfigurator import _engine_all_reduce_samples
    from profiler.importers.aiconfigurator_moe import moe_samples

    folder = aic_package.folder("h100_sxm")
    reduces = _engine_all_reduce_samples(folder / "comm" / "sglang", "sglang")
    kinds = Counter(s.op for s in reduces)
    assert set(kinds) == {OpKind.VLLM_ALL_REDUCE, OpKind.VLLM_ALL_REDUCE_EAGER}
    assert kinds[OpKind.VLLM_ALL_REDUCE] == kinds[OpKind.VLLM_ALL_REDUCE_EAGER] > 30
    graph = {(s.num_gpus, s.message_bytes): s.median_ms for s in reduces
             if s.op is OpKind.VLLM_ALL_REDUCE}  # fmt: skip
    eager = {(s.num_gpus, s.message_bytes): s.median_ms for s in reduces
             if s.op is OpKind.VLLM_ALL_REDUCE_EAGER}  # fmt: skip
    small = min(graph)  # a tiny message: a graph replay beats an eager launch
    assert graph[small] < eager[small]
    moe = moe_samples(folder, engine="sglang")
    assert len(moe) > 10_000 and {s.dtype for s in moe} >= {"bfloat16", "fp8", "int4"}
    assert moe_samples(folder, engine="trtllm") == []
    assert _never_read(watch_reads) == []


def test_quickstart_prices_with_measured_tables_when_it_can(
    cli_db: str, fake_package: Path, capsys
) -> None:
    from api.cli.quickstart import measured_prices

    assert measured_prices(allow_import=False) is None  # nothing stored, no import asked
    assert "roofline estimate" in capsys.readouterr().out
    model_id = measured_prices(allow_import=True)  # the fake package's H100 vLLM tables
    out = capsys.readouterr().out
    assert model_id == 1 and f"importing aiconfigurator-core {FAKE_VERSION}'s measured" in out
    assert measured_prices(allow_import=True) == 1  # stored now: no second import
    out = capsys.readouterr().out
    assert "stored latency model #1" in out and "importing" not in out
    assert PACKAGE not in sys.modules


def test_quickstart_without_the_extra_says_how_to_get_measured_prices(
    cli_db: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from api.cli.quickstart import measured_prices

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == PACKAGE else real(name, *a)
    )
    assert measured_prices(allow_import=True) is None
    out = " ".join(capsys.readouterr().out.split())
    assert "prices: roofline estimate (no measured h100 tables)" in out
    assert "pip install 'servetune[aic]' && servetune profile import --aiconfigurator" in out
