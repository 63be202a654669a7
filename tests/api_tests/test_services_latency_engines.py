"""Each engine priced from its own kernel tables: stored models carry whose tables they were
fitted on, and a deployment's engine picks them (else vLLM's, said so)."""

from __future__ import annotations

import numpy as np
import pytest

from api.services.latency import fit_and_store, resolve_latency
from optimizer.engines import EngineRelease
from optimizer.latency.base import StepLoad
from optimizer.latency.model import FitOptions
from optimizer.records import DeviceInfo, KernelSample, OpKind
from storage.db import make_engine, session_scope, upgrade_database
from storage.profiles import create_profile_run

MODEL = "llama-3.1-8b"
VLLM = EngineRelease("vllm", "0.20")
SGLANG = EngineRelease.of("sglang", None)
# A mixed step: its GEMMs are priced by the stored models (attention by the roofline).
STEP = StepLoad(num_tokens=520, num_logits=9, prefill_q=(512,), prefill_kv=(512,),
                num_decode_seqs=8, decode_kv_tokens=8 * 1000)  # fmt: skip


def _gemm_samples(slowdown: float) -> list[KernelSample]:
    """GEMM timings of a made-up GPU, `slowdown` x slower for another engine's kernels."""
    rng = np.random.default_rng(0)
    m = rng.integers(1, 16384, 600)
    n = rng.choice([1024, 4096, 6144, 14336, 28672, 128256], m.size)
    k = rng.choice([4096, 14336], m.size)
    t = 1e3 * np.maximum(2 * m * n * k / 650e12, 2 * (m * k + k * n + m * n) / 2.9e12) + 0.005
    return [
        KernelSample(OpKind.GEMM, x, x, x, num_tokens=int(a), n=int(b), k=int(c))
        for a, b, c, x in zip(m, n, k, slowdown * t, strict=True)
    ]


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """h100: vLLM's, SGLang's (an older and a newer one) and TensorRT-LLM's tables; a100:
    vLLM's only. Each is a profile run fitted as `profile import` does."""
    url = f"sqlite:///{tmp_path_factory.mktemp('engines') / 'cat.db'}"
    upgrade_database(url)
    eng = make_engine(url)
    ids = {}
    device = DeviceInfo(kind="imported", name="made-up")
    for key, acc, engine_name, slowdown in (
        ("h100-vllm", "h100", "vllm", 1.0),
        ("h100-sglang-old", "h100", "sglang", 5.0),
        ("h100-sglang", "h100", "sglang", 2.0),
        ("h100-trtllm", "h100", "trtllm", 0.5),
        ("a100-vllm", "a100", "vllm", 1.5),
    ):
        with session_scope(eng) as s:
            run = create_profile_run(
                s, name=key, source="aiconfigurator", accelerator=acc, device=device,
                samples=_gemm_samples(slowdown), engine=engine_name,
            )  # fmt: skip
        assert run.engine == engine_name
        info = fit_and_store(eng, run.id, options=FitOptions(60))
        assert info.engine == engine_name  # the model takes its run's engine
        ids[key] = info.id
    yield eng, ids
    eng.dispose()


def test_each_engine_is_priced_by_its_own_tables_and_says_whose(stored) -> None:
    eng, ids = stored
    with session_scope(eng) as s:
        r = resolve_latency(s, MODEL)
    # the newest per accelerator and engine; TensorRT-LLM's tables price no deployment
    assert sorted(r.model_ids) == sorted([ids["h100-vllm"], ids["h100-sglang"], ids["a100-vllm"]])
    assert f"h100 #{ids['h100-sglang']} (h100-sglang v1, SGLang's tables)" in r.label
    assert f"h100 #{ids['h100-vllm']} (h100-vllm v1, vLLM's tables)" in r.label
    vllm = r.source.for_instance("h100", 1, engine=VLLM)
    sglang = r.source.for_instance("h100", 1, engine=SGLANG)
    assert sglang.label.endswith(", SGLang's tables") and "SGLang" not in vllm.label
    # SGLang's GEMMs were measured 2x slower here: its step is slower than vLLM's (whose
    # own engine overhead it lacks, so compare the kernels' part through a big prefill)
    big = StepLoad(num_tokens=8192, num_logits=1, prefill_q=(8192,), prefill_kv=(8192,))
    assert sglang.step_time_s(big) > 1.5 * (vllm.step_time_s(big) - 2e-3)
    assert r.tables_for(["h100"], SGLANG) == f"h100: SGLang's tables (model #{ids['h100-sglang']})"
    assert r.tables_for(["h100"], VLLM) == f"h100: vLLM's tables (model #{ids['h100-vllm']})"


def test_an_engine_without_tables_falls_back_to_vllms_and_says_so(stored) -> None:
    eng, ids = stored
    with session_scope(eng) as s:
        r = resolve_latency(s, MODEL)
    on_a100 = r.source.for_instance("a100", 1, engine=SGLANG)
    assert on_a100.label.endswith("vLLM's tables: no SGLang tables for a100")
    assert not on_a100.is_estimate
    # ... and the same GEMMs price both engines there
    vllm_a100 = r.source.for_instance("a100", 1, engine=VLLM)
    big = StepLoad(num_tokens=8192, num_logits=1, prefill_q=(8192,), prefill_kv=(8192,))
    assert on_a100.step_time_s(big) < vllm_a100.step_time_s(big)  # no vLLM overhead
    assert r.tables_for(["a100", "b200"], SGLANG) == (
        f"a100: vLLM's tables: no SGLang tables for a100 (model #{ids['a100-vllm']}); "
        "b200: roofline estimate"
    )


def test_named_models_are_used_as_named(stored) -> None:
    eng, ids = stored
    with session_scope(eng) as s:
        r = resolve_latency(s, MODEL, latency_model_ids=(ids["h100-sglang-old"],))
    assert r.model_ids == (ids["h100-sglang-old"],)
    assert r.tables_for(["h100"], VLLM) == "h100: roofline estimate"
    old = r.source.for_instance("h100", 1, engine=SGLANG)
    with session_scope(eng) as s:
        newest = resolve_latency(s, MODEL).source
    new = newest.for_instance("h100", 1, engine=SGLANG)  # its table is written outside
    big = StepLoad(num_tokens=8192, num_logits=1, prefill_q=(8192,), prefill_kv=(8192,))
    assert old.step_time_s(big) > 2.0 * new.step_time_s(big)  # 5x vs 2x slower GEMMs
