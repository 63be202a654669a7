"""Hold-out evaluation, the fitted per-iteration overhead and its persistence."""

from __future__ import annotations

import pickle
from dataclasses import replace

import numpy as np
import pytest

from optimizer.engines import NO_OVERHEAD, V0_OVERHEAD, EngineRelease
from optimizer.hardware import get_accelerator
from optimizer.latency import StepLoad, build_catalog, compile_learned
from optimizer.latency.compose import iteration_ms, iterations_ms
from optimizer.latency.evaluate import (
    AccuracyTargets,
    HoldoutOptions,
    evaluate_holdout,
    evaluate_mixed,
    holdout_masks,
)
from optimizer.latency.features import FEATURE_VERSION, OpBatch
from optimizer.latency.fit import fit_latency_model
from optimizer.latency.mixed_fit import mixed_load, mixed_pricing
from optimizer.latency.model import FitOptions, LatencyModelError
from optimizer.latency.persist import (
    _MAGIC,
    PAYLOAD_SCHEMA_VERSION,
    PayloadError,
    dump_model,
    load_model,
)
from optimizer.latency.roofline import RooflinePricer
from optimizer.latency.table import TableGrid
from optimizer.records import HoldoutMetric, HoldoutSplit, KernelSample, OpKind
from optimizer.shapes import get_shape

FAST = FitOptions(max_iter=30)
SMALL = TableGrid(max_tokens=1024, max_log2_batch=6, max_log2_q=10, max_log2_kv=12, max_verify_q=2)
TINY = get_shape("tiny")


def gemm_samples(n: int = 100, noise: float = 0.0, seed: int = 0) -> list[KernelSample]:
    """A GEMM of known physics: 5 us launch + 600 GFLOP/s."""
    rng = np.random.default_rng(seed)
    m = rng.integers(1, 8192, n)
    t = (0.005 + m * 4096 * 4096 * 2 / 600e9) * (1 + noise * rng.standard_normal(n))
    return [
        KernelSample(OpKind.GEMM, float(x), float(x), float(x), num_tokens=int(a), n=4096, k=4096)
        for a, x in zip(m, t, strict=True)
    ]


def test_holdout_masks_sizes_and_extrapolation_rows() -> None:
    samples = gemm_samples(50)
    batch = OpBatch.from_samples(OpKind.GEMM, samples)
    masks = holdout_masks(batch, HoldoutOptions())
    assert masks[HoldoutSplit.RANDOM].sum() == 10  # 20% of 50
    far = masks[HoldoutSplit.EXTRAPOLATION]
    assert far.sum() == 5  # the top 10% of token counts
    assert batch.num_tokens[far].min() > batch.num_tokens[~far].max()
    other = holdout_masks(batch, HoldoutOptions(seed=1))[HoldoutSplit.RANDOM]
    assert not np.array_equal(other, masks[HoldoutSplit.RANDOM])


def test_evaluate_holdout_on_known_physics() -> None:
    metrics = evaluate_holdout(gemm_samples(), options=FAST)
    assert [(m.op, m.split, m.num_rows) for m in metrics] == [
        ("gemm", HoldoutSplit.RANDOM, 20),
        ("gemm", HoldoutSplit.EXTRAPOLATION, 10),
    ]
    # Noise-free linear physics: the NNLS base alone is exact, in and beyond the grid.
    assert all(m.median_ape < 1.0 and m.p90_ape < 2.0 for m in metrics)
    assert all(AccuracyTargets().met(m) for m in metrics)
    assert evaluate_holdout(gemm_samples(), options=FAST) == metrics  # seeded


def test_noise_shows_in_the_metrics_and_targets() -> None:
    metrics = evaluate_holdout(gemm_samples(200, noise=0.2), options=FAST)
    rand = next(m for m in metrics if m.split is HoldoutSplit.RANDOM)
    assert 5.0 < rand.median_ape < 40.0 and rand.p90_ape >= rand.median_ape
    assert not AccuracyTargets().met(rand)
    assert AccuracyTargets(random_median=50, random_p90=200).met(rand)


def test_too_few_rows_are_skipped_and_options_checked() -> None:
    seen: list[tuple[OpKind, HoldoutSplit]] = []
    # 9 rows: 7 left to train on the random split, 8 on the extrapolation split.
    metrics = evaluate_holdout(
        gemm_samples(9), options=FAST, progress=lambda op, split: seen.append((op, split))
    )
    assert [m.split for m in metrics] == [HoldoutSplit.EXTRAPOLATION]
    assert len(seen) == 2
    with pytest.raises(ValueError, match="random_fraction"):
        HoldoutOptions(random_fraction=1.0)
    with pytest.raises(ValueError, match="extrapolation_fraction"):
        HoldoutOptions(extrapolation_fraction=0.0)


def roofline_profile() -> tuple[list[KernelSample], list[KernelSample]]:
    """Per-op samples of the tiny shape priced by the CPU roofline, and mixed iterations
    (their measured time not yet set)."""
    from profiler.cases import case_sample
    from profiler.sweep import NOT_PROFILED, ProfileGrid, plan_cases
    from profiler.timing import Timing

    grid = ProfileGrid(
        num_tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        tp_degrees=(1,),
        lm_head_rows=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        prefill_chunk_lens=(16, 64, 256),
        prefill_context_lens=(0, 128),
        decode_batch_sizes=(1, 4, 16),
        decode_kv_lens=(64, 256, 1024),
        mixed_chunk_lens=(0, 16, 128),
        mixed_num_decodes=(0, 2, 8),
        mixed_decode_kv_lens=(64, 256),
        ops=tuple(op for op in OpKind if op not in NOT_PROFILED),
    )
    roof = RooflinePricer(get_accelerator("cpu"))
    ops, mixed = [], []
    for case in plan_cases(TINY, grid):
        if case.op is OpKind.MIXED_ITERATION:
            from profiler.mixed import mixed_sample

            one = Timing(1.0, 1.0, 1.0, 1)
            mixed.append(mixed_sample(TINY, case.q_len, case.batch_size, case.kv_len, one))
            continue
        s = case_sample(case, TINY, Timing(1.0, 1.0, 1.0, 1))
        t = float(roof.predict_ms(OpBatch.from_samples(s.op, [s]))[0])
        ops.append(replace(s, median_ms=t, p10_ms=t, p90_ms=t))
    return ops, mixed


def test_overhead_fitted_on_mixed_iterations_and_used_by_catalogs() -> None:
    ops, mixed = roofline_profile()
    plain = fit_latency_model(ops, accelerator="cpu", options=FAST)
    assert plain.overhead_s is None and plain.num_mixed == 0
    pricing = mixed_pricing(plain, TINY)
    measured = [replace(s, median_ms=iteration_ms(pricing, mixed_load(s), 0.002)) for s in mixed]
    model = fit_latency_model(ops + measured, accelerator="cpu", options=FAST)
    assert model.overhead_s == pytest.approx(0.002, abs=1e-9)
    assert model.num_mixed == len(mixed) == 14
    acc = evaluate_mixed(model, TINY, measured)
    assert acc.num_fit + acc.num_test == 14 and acc.overhead_s == pytest.approx(0.002)
    assert acc.median_ape < 1e-6

    # The batched composition used by the overhead fit equals the per-load one.
    loads = [mixed_load(s) for s in mixed] + [
        StepLoad(40, 9, (16, 8), (100, 8), 8, 800, 3),
        StepLoad(5, 5, (), (), 5, 500, 2),
        StepLoad(7, 1, (7,), (7,)),
    ]
    batched = iterations_ms(mixed_pricing(model, TINY), loads, 0.001)
    one_by_one = [iteration_ms(mixed_pricing(model, TINY), ld, 0.001) for ld in loads]
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-12)

    load = StepLoad(40, 9, (32,), (32,), 8, 8 * 256)
    own = compile_learned(TINY, model, 1, grid=SMALL).step_time_s(load)
    # A model with its own whole-step measurements is priced with its constant and the
    # reference engine's rules, whatever the release; one without, with the release's:
    # here vLLM V0, whose rules are those same legacy ones, so only the overhead differs.
    v0 = EngineRelease(version="0.5.3")
    assert compile_learned(TINY, model, 1, grid=SMALL, engine=v0).step_time_s(load) == own
    default = compile_learned(TINY, plain, 1, grid=SMALL, engine=v0).step_time_s(load)
    v0_s = V0_OVERHEAD.step_s(load.num_decode_seqs + len(load.prefill_q), load.num_tokens)
    assert own - default == pytest.approx(0.002 - v0_s, rel=1e-9)
    forced = build_catalog(TINY, [model], (1,), overhead=NO_OVERHEAD, grid=SMALL).for_instance(
        "cpu", 1
    )
    assert own - forced.step_time_s(load) == pytest.approx(0.002, rel=1e-9)
    catalog = build_catalog(TINY, [model], (1,), grid=SMALL).for_instance("cpu", 1)
    assert catalog.step_time_s(load) == own


def test_mixed_iterations_of_an_unknown_shape_are_rejected() -> None:
    ops, mixed = roofline_profile()
    odd = [replace(s, model="no-such-shape") for s in mixed]
    with pytest.raises(LatencyModelError, match="no-such-shape"):
        fit_latency_model(ops + odd, accelerator="cpu", options=FAST)
    with pytest.raises(LatencyModelError, match="no mixed iterations of shape 'small'"):
        fit_latency_model(ops + mixed, accelerator="cpu", options=FAST, shape=get_shape("small"))
    with pytest.raises(LatencyModelError, match="several shapes"):
        fit_latency_model(ops + mixed + odd, accelerator="cpu", options=FAST)
    # Naming the shape picks its iterations out of a profile of several.
    both = fit_latency_model(ops + mixed + odd, accelerator="cpu", options=FAST, shape=TINY)
    assert both.num_mixed == len(mixed)


def test_payload_v3_keeps_overhead_and_feature_set_and_older_payloads_still_load() -> None:
    ops, _ = roofline_profile()
    model = replace(fit_latency_model(ops, accelerator="cpu", options=FAST), overhead_s=0.0031)
    model = replace(model, num_mixed=12, op_scale=1.17)
    restored = load_model(dump_model(model), PAYLOAD_SCHEMA_VERSION)
    assert PAYLOAD_SCHEMA_VERSION == 3
    assert (restored.overhead_s, restored.num_mixed, restored.op_scale) == (0.0031, 12, 1.17)
    assert {m.feature_version for m in restored.ops.values()} == {FEATURE_VERSION}
    # A version-2 payload was fitted on feature set 1 (no table column): it loads as
    # such and prices exactly as the model it was written from.
    old_model = fit_latency_model(ops, accelerator="cpu", options=replace(FAST, feature_version=1))
    _, parts = pickle.loads(dump_model(old_model)[len(_MAGIC) :])
    parts["ops"] = [row[:-1] for row in parts["ops"]]
    del parts["op_scale"]
    v2 = load_model(_MAGIC + pickle.dumps((2, parts)), 2)
    assert v2.op_scale == 1.0
    embed = OpBatch.make(
        OpKind.EMBEDDING, dtype_bytes=4.0, num_tokens=[1.0, 64.0, 900.0], n=256.0, k=4096.0
    )
    assert v2.ops[OpKind.EMBEDDING].feature_version == 1
    assert np.array_equal(v2.predict_ms(embed), old_model.predict_ms(embed))
    # A version-1 payload (before the overhead was stored) loads without one.
    del parts["overhead_s"], parts["num_mixed"]
    old = load_model(_MAGIC + pickle.dumps((1, parts)), 1)
    assert old.overhead_s is None and set(old.ops) == set(model.ops)
    with pytest.raises(PayloadError, match="schema_version"):
        load_model(dump_model(model), 4)
    with pytest.raises(PayloadError, match="holds version 3"):
        load_model(dump_model(model), 2)


def test_evaluation_imports_neither_storage_sql_nor_torch() -> None:
    import subprocess
    import sys

    import storage.latency_models as stored

    assert stored.HoldoutMetric is HoldoutMetric  # one record, re-exported by storage
    code = (
        "import sys, optimizer.latency.evaluate, optimizer.latency.persist;"
        "print(sorted(m for m in ('sqlalchemy', 'torch', 'storage.latency_models')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_simulator_and_config_import_neither_scipy_nor_sklearn() -> None:
    import subprocess
    import sys

    code = (
        "import sys, optimizer.sim, optimizer.config, optimizer.latency.table;"
        "print(sorted(m for m in ('scipy', 'sklearn', 'threadpoolctl') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
