"""Compiled step latency, roofline fallback and catalog (the simulator's fast path)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingRegressor

from optimizer.engines import DEFAULT_RELEASE
from optimizer.hardware import get_accelerator
from optimizer.latency import StepLoad, build_catalog, compile_roofline
from optimizer.latency.compose import Pricing, iteration_ms
from optimizer.latency.fit import fit_latency_model
from optimizer.latency.mixed_fit import fit_composition
from optimizer.latency.model import FitOptions
from optimizer.latency.roofline import ROOFLINE_LABEL, RooflinePricer
from optimizer.latency.table import compile_step_latency
from optimizer.records import KernelSample, OpKind
from optimizer.shapes import get_shape
from optimizer.sim.floor import decode_floor_s
from tests.optimizer_tests.step_loads import batch_step_times

SHAPE = get_shape("llama-3.1-8b")


def _gemm_model():
    rng = np.random.default_rng(0)
    m = rng.integers(1, 16384, 1500)
    n = rng.choice([1024, 4096, 6144, 14336, 28672, 128256], m.size)
    k = rng.choice([4096, 14336], m.size)
    t = 1e3 * np.maximum(2 * m * n * k / 650e12, 2 * (m * k + k * n + m * n) / 2.9e12) + 0.005
    samples = [
        KernelSample(OpKind.GEMM, x, x, x, num_tokens=int(a), n=int(b), k=int(c))
        for a, b, c, x in zip(m, n, k, t, strict=True)
    ]
    return fit_latency_model(
        samples, accelerator="h100", source="synthetic", options=FitOptions(100)
    )


@pytest.fixture(scope="module")
def learned():
    return build_catalog(SHAPE, [_gemm_model()], tps=(1, 2))


def _random_loads(rng: np.random.Generator, num: int) -> list[StepLoad]:
    loads = []
    for _ in range(num):
        decodes = int(rng.integers(0, 200))
        chunk = int(rng.integers(0, 2048)) if rng.random() < 0.6 or decodes == 0 else 0
        chunk = max(chunk, 1) if decodes == 0 else chunk
        kv = chunk + int(rng.integers(0, 8000))
        loads.append(
            StepLoad(
                num_tokens=chunk + decodes,
                num_logits=decodes + (1 if chunk else 0),
                prefill_q=(chunk,) if chunk else (),
                prefill_kv=(kv,) if chunk else (),
                num_decode_seqs=decodes,
                decode_kv_tokens=decodes * int(rng.integers(1, 6000)),
            )
        )
    return loads


@pytest.mark.parametrize("tp", [1, 2])
def test_compiled_matches_exact_composition(learned, tp: int) -> None:
    loads = _random_loads(np.random.default_rng(tp), 60)
    rules = DEFAULT_RELEASE.rules
    roof = Pricing(SHAPE, tp, RooflinePricer(get_accelerator("h200")), rules=rules)
    table = compile_roofline(SHAPE, get_accelerator("h200"), tp)
    exact = np.array([table.with_engine_s(iteration_ms(roof, ld, 0.0) / 1e3, ld) for ld in loads])
    err = np.abs(np.array([table.step_time_s(ld) for ld in loads]) / exact - 1.0)
    assert np.median(err) < 0.01 and err.max() < 0.08  # quantisation: tokens rounded up to 8
    # A learned model's tables are also made monotone, which lifts its local dips.
    table = learned.for_instance("h100", tp)
    h100 = RooflinePricer(get_accelerator("h100"))
    pricing = Pricing(SHAPE, tp, h100, _gemm_model(), rules=rules)
    exact = np.array(
        [table.with_engine_s(iteration_ms(pricing, ld, 0.0) / 1e3, ld) for ld in loads]
    )
    ratio = np.array([table.step_time_s(ld) for ld in loads]) / exact
    assert np.median(np.abs(ratio - 1.0)) < 0.02 and ratio.min() > 0.95


def test_compiled_tables_apply_the_fitted_operator_scale() -> None:
    """A model fitted to run 1.25x slower in a forward prices every step's operators
    1.25x (the overhead unscaled), in the compiled tables as in the exact sum."""
    from dataclasses import replace

    from optimizer.latency import compile_learned

    model = replace(_gemm_model(), overhead_s=0.001)
    loads = _random_loads(np.random.default_rng(7), 40)
    plain = compile_learned(SHAPE, model, 1)
    scaled = compile_learned(SHAPE, replace(model, op_scale=1.25), 1)
    a = np.array([plain.step_time_s(ld) for ld in loads]) - 0.001
    b = np.array([scaled.step_time_s(ld) for ld in loads]) - 0.001
    np.testing.assert_allclose(b, 1.25 * a, rtol=1e-9)
    with pytest.raises(ValueError, match="op_scale must be > 0"):
        replace(model, op_scale=0.0)


def test_batch_api_equals_scalar_path(learned) -> None:
    table = learned.for_instance("h100", 1)
    loads = _random_loads(np.random.default_rng(7), 200)
    loads.append(StepLoad(40000, 1, (40000,), (2_000_000,)))  # beyond every grid end
    loads.append(StepLoad(5000, 5000, (), (), 5000, 5000 * 100))
    scalar = np.array([table.step_time_s(ld) for ld in loads])
    batch = batch_step_times(table, list(loads))
    np.testing.assert_allclose(batch, scalar, rtol=1e-9)


def test_step_time_never_calls_sklearn(learned, monkeypatch: pytest.MonkeyPatch) -> None:
    table = learned.for_instance("h100", 1)

    def boom(*args, **kwargs):
        raise AssertionError("predict called in the hot path")

    monkeypatch.setattr(HistGradientBoostingRegressor, "predict", boom)
    for ld in _random_loads(np.random.default_rng(3), 50):
        assert table.step_time_s(ld) > 0
    clone = pickle.loads(pickle.dumps(table))
    ld = StepLoad(300, 45, (256,), (1024,), 44, 44 * 900)
    assert clone.step_time_s(ld) == table.step_time_s(ld)


def test_monotone_in_tokens_and_kv(learned) -> None:
    table = learned.for_instance("h100", 1)
    times = [table.step_time_s(StepLoad(t, 1, (t,), (t,))) for t in (64, 512, 4096, 32768, 65536)]
    assert np.all(np.diff(times) > 0)
    dec = [table.step_time_s(StepLoad(32, 32, (), (), 32, 32 * kv)) for kv in (100, 1000, 10000)]
    assert np.all(np.diff(dec) > 0)
    base = StepLoad(64, 64, (), (), 16, 16 * 2000)
    verify = StepLoad(16 * 5, 16 * 5, (), (), 16, 16 * 2000, decode_q=5)
    assert table.step_time_s(verify) > table.step_time_s(base)


def test_learned_labels_roofline_parts(learned) -> None:
    table = learned.for_instance("h100", 2)
    assert not table.is_estimate and table.label == "learned (synthetic)"
    assert "decode_attn" in table.estimated_ops and "qkv_proj" not in table.estimated_ops


@pytest.mark.parametrize("name", ["h100", "h200", "a100", "b200"])
def test_roofline_respects_decode_floor(name: str) -> None:
    acc = get_accelerator(name)
    table = compile_roofline(SHAPE, acc, 1)
    assert table.is_estimate and table.label == ROOFLINE_LABEL
    for b in (1, 8, 64):
        t = table.step_time_s(StepLoad(b, b, (), (), b, b * 500))
        assert t >= decode_floor_s(SHAPE, acc)


def test_catalog_fallback_and_errors(learned, tmp_path: Path) -> None:
    assert not learned.for_instance("H100_SXM", 1).is_estimate  # aliases resolve
    estimate = learned.for_instance("h200", 1)
    assert estimate.is_estimate and estimate.label == ROOFLINE_LABEL
    spec = tmp_path / "stacked.yaml"
    spec.write_text("name: stacked\nbf16_tflops: 1000\nmemory_gib: 96\nhbm_tb_s: 16\n")
    fast_mem = learned.for_instance(str(spec), 1)
    ld = StepLoad(1, 1, (), (), 1, 1000)
    assert fast_mem.is_estimate and fast_mem.step_time_s(ld) < estimate.step_time_s(ld)
    with pytest.raises(LookupError, match="unknown accelerator"):
        learned.for_instance("tpu-v9", 1)
    with pytest.raises(LookupError, match="tp=3"):
        learned.for_instance("h200", 3)
    strict = build_catalog(SHAPE, [], allow_roofline=False)
    with pytest.raises(LookupError, match="roofline fallback is off"):
        strict.for_instance("h100", 1)


def test_fit_composition_recovers_overhead_and_operator_scale() -> None:
    pricing = Pricing(get_shape("tiny"), 1, RooflinePricer(get_accelerator("cpu")))
    loads = _random_loads(np.random.default_rng(5), 10)
    composed = np.array([iteration_ms(pricing, ld, 0.0) / 1e3 for ld in loads])
    fit = fit_composition(pricing, loads, list(composed + 0.0021))
    assert fit.overhead_s == pytest.approx(0.0021, rel=1e-6) and fit.scale == pytest.approx(1.0)
    # Operators 17% slower in a forward plus 0.3 ms: both recovered, and a constant
    # alone (the fallback below MIN_SCALE_FIT iterations) is what the scale replaces.
    fit = fit_composition(pricing, loads, list(1.17 * composed + 0.0003))
    assert (fit.overhead_s, fit.scale) == (pytest.approx(0.0003, rel=1e-4), pytest.approx(1.17))
    two = fit_composition(pricing, loads[:2], list(1.17 * composed[:2] + 0.0003))
    assert two.scale == 1.0
    assert two.overhead_s == pytest.approx(np.median(0.17 * composed[:2] + 0.0003))
    with pytest.raises(ValueError, match="matching"):
        fit_composition(pricing, loads, list(composed[:2]))
    with pytest.raises(ValueError, match="overhead must be an EngineOverhead"):
        compile_step_latency(pricing, -1.0, label="x", is_estimate=True)


def test_a_run_prices_its_reach_exactly_as_the_full_grid(learned) -> None:
    """Compiling only what a run can reach changes no price inside the reach: the tier is a
    prefix of the full grid (running maxima included), and the reach lies strictly inside."""
    from optimizer.latency import TableReach
    from optimizer.latency.catalog import LatencyCatalog
    from optimizer.latency.table import TableGrid

    reach = TableReach(max_tokens=2048, max_batch=200, max_q=2048, max_kv=14_000)
    narrow = LatencyCatalog(SHAPE, learned.models).for_instance("h100", 2, reach)
    full = learned.for_instance("h100", 2)
    assert narrow.grid == TableGrid.covering(reach) and narrow.grid != full.grid
    assert len(narrow.dense_ms) < len(full.dense_ms) / 10
    rng = np.random.default_rng(5)
    loads = [ld for ld in _random_loads(rng, 600) if ld.num_tokens <= reach.max_tokens]
    assert len(loads) > 300
    loads += [StepLoad(2048, 200, (1848,), (14_000,), 200, 200 * 14_000)]  # the corners
    for load in loads:
        assert narrow.step_time_s(load) == full.step_time_s(load)


def test_the_catalog_grows_a_table_for_a_larger_reach_and_stores_tables() -> None:
    from optimizer.latency import TableReach
    from optimizer.latency.catalog import LatencyCatalog, LoadedModel
    from optimizer.latency.table_bytes import table_from_bytes, table_to_bytes

    class Store:
        def __init__(self) -> None:
            self.tables: dict[str, bytes] = {}

        def get(self, key):
            data = self.tables.get(key)
            return None if data is None else table_from_bytes(data)

        def put(self, key, table, model_key):
            assert model_key in ("latency-model-7", "")
            self.tables[key] = table_to_bytes(table)

    loads = []

    class CountingRef:
        accelerator = "h100"
        cache_key = "latency-model-7"

        def load(self):
            loads.append(1)
            return _MODEL

    store = Store()
    small, large = TableReach(512, 16, 512, 4000), TableReach(8192, 256, 8192, 30_000)
    cat = LatencyCatalog(SHAPE, {"h100": CountingRef()}, store=store)
    a = cat.for_instance("h100", 1, small)
    assert cat.for_instance("h100", 1, small) is a and len(loads) == 1
    b = cat.for_instance("h100", 1, large)
    assert b.grid.max_tokens == 8192 and cat.for_instance("h100", 1, small) is b
    assert len(store.tables) == 2 and all("latency-model-7" in k for k in store.tables)
    # Another process: the stored tables, no model load, the same prices.
    again = LatencyCatalog(SHAPE, {"h100": CountingRef()}, store=store)
    c = again.for_instance("h100", 1, large)
    assert len(loads) == 1 and c == b
    # An in-memory model has no identity to key by: compiled, not stored; the roofline is.
    LatencyCatalog(SHAPE, {"h100": LoadedModel(_MODEL)}, store=store).for_instance("h100", 4)
    assert len(store.tables) == 2
    LatencyCatalog(SHAPE, store=store).for_instance("a100", 1, small)
    assert len(store.tables) == 3 and any("roofline" in k for k in store.tables)


_MODEL = _gemm_model()


def test_a_stored_table_is_never_read_back_by_another_pricing(monkeypatch) -> None:
    """A table's store key holds what its numbers depend on beyond the fitted model: the
    engine generation with its rules and overheads, and the pricing code's version. A
    changed overhead (a recalibration), another generation, or another build of servetune
    compiles the next run's table again instead of reading the old one."""
    import dataclasses

    import optimizer.engines as engines
    from optimizer.engines import EngineRelease
    from optimizer.latency import TableReach
    from optimizer.latency import catalog as catalog_module
    from optimizer.latency.catalog import LatencyCatalog
    from optimizer.latency.table_bytes import table_from_bytes, table_to_bytes

    class Store:
        def __init__(self) -> None:
            self.tables: dict[str, bytes] = {}
            self.misses = 0

        def get(self, key):
            data = self.tables.get(key)
            self.misses += data is None
            return None if data is None else table_from_bytes(data)

        def put(self, key, table, model_key):
            self.tables[key] = table_to_bytes(table)

    class Ref:
        accelerator = "h100"
        cache_key = "latency-model-7"

        def load(self):
            return _MODEL

    store, reach = Store(), TableReach(512, 16, 512, 4000)
    load = StepLoad(8, 8, (), (), 8, 8 * 1000)

    def run(engine: EngineRelease = engines.DEFAULT_RELEASE) -> float:
        cat = LatencyCatalog(SHAPE, {"h100": Ref()}, store=store)
        return cat.for_instance("h100", 1, reach, engine=engine).step_time_s(load)

    first = run()
    assert (store.misses, len(store.tables)) == (1, 1)
    assert run() == first and store.misses == 1  # read back: same pricing
    # A recalibrated overhead: the same model and release, a new table and new prices.
    gens = tuple(
        dataclasses.replace(g, overhead=engines.EngineOverhead(base_s=0.05))
        if g.key == "vllm-v1-async" else g
        for g in engines.GENERATIONS
    )  # fmt: skip
    monkeypatch.setattr(engines, "GENERATIONS", gens)
    assert run() == pytest.approx(first + 0.05, abs=1e-3)
    assert (store.misses, len(store.tables)) == (2, 2)
    monkeypatch.undo()
    # Another engine generation.
    run(EngineRelease("vllm", "0.12.0"))
    assert (store.misses, len(store.tables)) == (3, 3)
    # Another build of the pricing code.
    monkeypatch.setattr(catalog_module, "pricing_version", lambda: "another-build")
    assert run() == first
    assert (store.misses, len(store.tables)) == (4, 4)


def test_native_thread_count_changes_no_table(learned) -> None:
    """Compilation runs scikit-learn under a thread limit (SERVETUNE_NATIVE_THREADS);
    the tables are the same for any limit."""
    from optimizer.latency import TableReach
    from optimizer.latency.catalog import LatencyCatalog

    reach = TableReach(1024, 64, 1024, 8192)
    one = LatencyCatalog(SHAPE, learned.models, num_threads=1).for_instance("h100", 1, reach)
    two = LatencyCatalog(SHAPE, learned.models, num_threads=2).for_instance("h100", 1, reach)
    assert one == two


def test_engine_overhead_grows_with_sequences_and_tokens() -> None:
    """By hand: 1 ms + 20 us x 4 sequences + 0.1 us x 103 tokens = 1.0903 ms on top of
    the same table without overhead, in the scalar and batch paths and after storage."""
    from optimizer.engines import NO_OVERHEAD, EngineOverhead
    from optimizer.latency.roofline import RooflineOptions
    from optimizer.latency.table import TableGrid
    from optimizer.latency.table_bytes import table_from_bytes, table_to_bytes

    grid = TableGrid(max_tokens=1024, max_log2_q=10, max_log2_kv=12, max_log2_batch=5)
    acc = get_accelerator("h100")
    overhead = EngineOverhead(base_s=1e-3, per_seq_s=20e-6, per_token_s=1e-7)
    with_o = compile_roofline(SHAPE, acc, 1, options=RooflineOptions(overhead=overhead), grid=grid)
    none = compile_roofline(SHAPE, acc, 1, options=RooflineOptions(overhead=NO_OVERHEAD), grid=grid)
    load = StepLoad(103, 4, (100,), (300,), 3, 3 * 500)
    assert with_o.step_time_s(load) - none.step_time_s(load) == pytest.approx(1.0903e-3, rel=1e-9)
    decode_only = StepLoad(3, 3, (), (), 3, 1500)  # 1 ms + 3 x 20 us + 3 x 0.1 us
    diff = with_o.step_time_s(decode_only) - none.step_time_s(decode_only)
    assert diff == pytest.approx(1.0603e-3, rel=1e-9)
    args = ([103, 3], [4, 3], [3, 3], [1500, 1500], [100, 0], [300, 0])
    np.testing.assert_allclose(
        with_o.step_times_s(*args) - none.step_times_s(*args), [1.0903e-3, 1.0603e-3], rtol=1e-9
    )
    assert table_from_bytes(table_to_bytes(with_o)).overhead == overhead
    with pytest.raises(ValueError, match=r"EngineOverhead\.per_seq_s must be a finite number"):
        EngineOverhead(per_seq_s=-1.0)


def test_small_decode_steps_are_tabulated_at_their_own_token_counts() -> None:
    """A decode of 1-7 sequences runs at 1-7 tokens padded to vLLM's capture sizes (1, 2,
    4, 8), not at 8: for a MoE each token brings its own experts, so 1 and 8 tokens differ
    by far more than the rounding allowed. The table equals the composition it tabulates."""
    shape = get_shape("qwen3-30b-a3b")
    acc = get_accelerator("h100")
    table = compile_roofline(shape, acc, 1)
    roof = Pricing(shape, 1, RooflinePricer(acc), rules=DEFAULT_RELEASE.rules)
    for b in range(1, 8):
        load = StepLoad(b, b, (), (), b, b * 1000)
        exact = table.with_engine_s(iteration_ms(roof, load, 0.0) / 1e3, load)
        assert table.step_time_s(load) == pytest.approx(exact, rel=0.01), b
    one, eight = (table.kernel_time_s(StepLoad(b, b, (), (), b, b * 1000)) for b in (1, 8))
    assert eight > 1.5 * one
