"""Engine generations: which release prices how, and the step rules each applies."""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.config import ConfigError, InstanceConfig, ServingConfig
from optimizer.config_parts import SpecMethod, SpeculationConfig
from optimizer.engines import (
    CURRENT_SGLANG,
    CURRENT_VLLM,
    DEFAULT_RELEASE,
    LEGACY_RULES,
    NO_OVERHEAD,
    EngineError,
    EngineOverhead,
    EngineRelease,
    StepRules,
    parse_version,
)
from optimizer.hardware import get_accelerator
from optimizer.latency import StepLoad
from optimizer.latency.catalog import compile_roofline, step_pricing
from optimizer.latency.compose import Pricing, cuda_graph_padded
from optimizer.latency.roofline import RooflinePricer
from optimizer.records import OpKind
from optimizer.shapes import get_shape

SHAPE = get_shape("qwen3-32b")


@pytest.mark.parametrize(
    ("version", "key", "async_"),
    [
        ("0.5.3.post1", "vllm-v0", False),
        ("0.7.3", "vllm-v0", False),
        ("0.8.0", "vllm-v1", False),
        ("v0.12.0", "vllm-v1", False),
        ("0.13", "vllm-v1", False),
        ("0.14.0", "vllm-v1-async", True),
        ("0.20.1", "vllm-v1-async", True),
        ("1.0.0rc1", "vllm-v1-async", True),
    ],
)
def test_each_release_maps_to_its_generation(version: str, key: str, async_: bool) -> None:
    g = EngineRelease("vllm", version).generation
    assert g.key == key and g.async_scheduling is async_


def test_versions_parse_and_bad_ones_are_refused_with_the_field() -> None:
    assert parse_version("0.5.3.post1") == (0, 5, 3)
    assert parse_version("v0.20") == (0, 20)
    with pytest.raises(EngineError, match="expected a release number"):
        parse_version("latest")
    inst = InstanceConfig(accelerator="h100", tp=2)
    with pytest.raises(ConfigError, match=r"config\.engine_version: .*'0\.x'"):
        ServingConfig.colocated("qwen3-32b", inst, engine_version="0.x")
    with pytest.raises(ConfigError, match=r"config\.engine: .*'trtllm'.*TensorRT-LLM"):
        ServingConfig.colocated("qwen3-32b", inst, engine="trtllm")
    with pytest.raises(ConfigError, match=r"config\.engine_version: .*SGLang from 0\.4"):
        ServingConfig.colocated("qwen3-32b", inst, engine="sglang", engine_version="0.3.6")


def test_sglang_runs_its_own_generation_uncalibrated_and_says_so() -> None:
    inst = InstanceConfig(accelerator="h100", tp=2)
    config = ServingConfig.colocated("qwen3-32b", inst, engine="sglang")
    release = config.engine_release
    assert release.version == CURRENT_SGLANG and release.generation.key == "sglang"
    assert release.label == "SGLang 0.5.14, overlap scheduler (engine overhead not calibrated)"
    g = release.generation
    assert g.async_scheduling and not g.calibrated and g.overhead == g.cpu == NO_OVERHEAD
    rules = release.rules
    assert rules.fused_elementwise and rules.vllm_all_reduce and not rules.fused_allreduce_norm
    assert rules.cuda_graph_tokens == 256
    # its tables are not vLLM's: another key, so no compiled table is shared
    assert release.key != EngineRelease("vllm", "0.20").key


def test_the_default_is_the_current_release_line_and_says_so() -> None:
    config = ServingConfig.colocated("qwen3-32b", InstanceConfig(accelerator="h100", tp=2))
    assert config.engine_version is None
    assert config.engine_release == DEFAULT_RELEASE
    assert DEFAULT_RELEASE.label == f"vLLM {CURRENT_VLLM}, V1 with async scheduling"
    old = ServingConfig.from_dict({**config.to_dict(), "engine_version": "0.12.0"})
    assert old.engine_release.label == "vLLM 0.12.0, V1 with synchronous scheduling"


@pytest.mark.parametrize(("method", "sync"), [(SpecMethod.DRAFT, True), (SpecMethod.NGRAM, True),
                                              (SpecMethod.EAGLE, False)])  # fmt: skip
def test_vllm_turns_async_scheduling_off_for_draft_models_and_ngram(method, sync) -> None:
    draft = "llama-3.2-1b" if method is SpecMethod.DRAFT else None
    spec = SpeculationConfig(method=method, num_speculative_tokens=3, draft_model=draft)
    config = ServingConfig.colocated("llama-3.1-8b", speculation=spec)
    release = config.engine_release
    assert (release.generation.key == "vllm-v1") is sync
    assert ("turns async scheduling off" in release.label) is sync


def test_the_fused_norm_fusion_starts_at_0_17() -> None:
    assert not EngineRelease("vllm", "0.16.0").rules.fused_allreduce_norm
    assert EngineRelease("vllm", "0.17.0").rules.fused_allreduce_norm


def test_synchronous_cpu_adds_and_async_cpu_bounds_a_step_below() -> None:
    """A V1 synchronous step is kernels + its overhead; an async one lasts max(kernels +
    exposed, CPU): a tiny step is CPU-bound, a large one is not."""
    h100 = get_accelerator("h100")
    sync = compile_roofline(SHAPE, h100, 2, engine=EngineRelease("vllm", "0.12.0"))
    asy = compile_roofline(SHAPE, h100, 2, engine=EngineRelease("vllm", "0.20.1"))
    sync_g = EngineRelease("vllm", "0.12.0").generation
    async_g = EngineRelease("vllm", "0.20.1").generation
    assert sync.hidden == NO_OVERHEAD and sync.overhead == sync_g.overhead
    # the exposed time per sequence is the generation's share of this table's forward
    exposed = async_g.overhead.resolved(asy.forward_s)
    assert asy.hidden == async_g.cpu and asy.overhead == exposed
    assert exposed.per_seq_s == pytest.approx(async_g.overhead.per_seq_forward * asy.forward_s)
    big = StepLoad(8192, 1, (8192,), (8192,))
    kernels = asy.kernel_time_s(big)
    assert asy.step_time_s(big) == pytest.approx(kernels + exposed.step_s(1, 8192))
    assert sync.step_time_s(big) == pytest.approx(kernels + sync_g.overhead.step_s(1, 8192))
    # a table whose kernels take almost nothing: the async step lasts its CPU work
    small = StepLoad(1, 1, (), (), 1, 1)
    assert asy.with_engine_s(1e-6, small) == pytest.approx(async_g.cpu.step_s(1, 1))


def test_a_model_with_its_own_whole_step_measurements_keeps_its_rules_and_constant() -> None:
    from dataclasses import replace

    from optimizer.latency.model import LatencyModel

    own = replace(LatencyModel("cpu", "profiler"), overhead_s=0.002)
    how = step_pricing(own, EngineRelease("vllm", "0.20.1"))
    assert how.rules == LEGACY_RULES and how.overhead == EngineOverhead.constant(0.002)
    assert how.hidden == NO_OVERHEAD and how.kernel_scale == 1.0


def test_v1_fuses_elementwise_kernels_and_the_flashinfer_pass_drops_the_norms() -> None:
    """Per layer, V0 prices 6 elementwise kernels (2 norms, 2 adds, SiLU, RoPE); V1 prices 4
    (2 add+norm, SiLU-and-mul, RoPE), and where FlashInfer fuses the all-reduce with the
    add + RMSNorm (B300 TP8: messages up to 2 MB), only SiLU and RoPE stay apart."""
    roof = RooflinePricer(get_accelerator("b300"))
    legacy = Pricing(SHAPE, 8, roof)
    v1 = Pricing(SHAPE, 8, roof, rules=StepRules(True, False, 0, False))
    fused = Pricing(SHAPE, 8, roof, rules=StepRules(True, False, 0, True))
    m = np.array([16.0])
    launch = roof.options.launch_ms
    layers = SHAPE.num_layers
    # at 16 tokens every elementwise kernel is launch-bound: count the launches
    assert legacy.dense_ms(m)[0] - v1.dense_ms(m)[0] == pytest.approx(2 * layers * launch, rel=0.05)
    assert v1.dense_ms(m)[0] - fused.dense_ms(m)[0] > 1.5 * layers * launch
    big = np.array([8192.0])  # 80 MB messages: beyond the fusion, the norms are back
    assert fused.dense_ms(big)[0] == pytest.approx(v1.dense_ms(big)[0], rel=1e-9)


def test_the_fused_moes_output_reduce_keeps_its_norm_apart() -> None:
    """The fused MoE reduces its output out of the FlashInfer pass's reach: a MoE layer's
    second block end costs what an unfused one does (the all-reduce + add + RMSNorm of the
    V1 rules without the fusion), its first stays fused; beyond the fusion's limit (B300
    TP8: 2 MB, 512 tokens of hidden 2048) both are unfused alike, and at TP 1 there is no
    reduce at all."""
    from optimizer.latency import moe
    from optimizer.parallel import ExpertLayout

    shape = get_shape("qwen3.6-35b-a3b")
    roof = RooflinePricer(get_accelerator("b300"))
    ep = ExpertLayout(1, True)
    plain = Pricing(shape, 8, roof, rules=StepRules(True, False, 0, False), layout=ep)
    fused = Pricing(shape, 8, roof, rules=StepRules(True, False, 0, True), layout=ep)
    m = np.array([16.0, 8192.0])
    ends = {"mlp": False, "attention": False}  # a layer's two block ends alone
    both_plain = plain.layer_ms(m, **ends)
    both_fused = fused.layer_ms(m, **ends)
    assert both_fused[0] < both_plain[0] and both_fused[1] == pytest.approx(both_plain[1])
    # both ends unfused are the rules without the fusion; one is half the difference
    np.testing.assert_allclose(fused.layer_ms(m, **ends, unfused_reduces=2), both_plain)
    extra = fused.unfused_reduce_ms(m)
    assert extra[0] == pytest.approx((both_plain[0] - both_fused[0]) / 2) and extra[1] == 0.0
    assert plain.unfused_reduce_ms(m).tolist() == [0.0, 0.0]  # nothing fused to undo
    gap = moe.moe_block_ms(fused, m) - moe.moe_block_ms(plain, m)
    np.testing.assert_allclose(gap, extra, atol=1e-12)
    one = Pricing(shape, 1, roof, rules=StepRules(True, False, 0, True))
    assert one.unfused_reduce_ms(m).tolist() == [0.0, 0.0]


def test_cuda_graph_padding_follows_vllms_capture_sizes() -> None:
    m = np.array([1, 2, 3, 5, 9, 255, 257, 270, 511, 512, 513, 4000], dtype=float)
    padded = cuda_graph_padded(m, 512)
    np.testing.assert_array_equal(padded, [1, 2, 4, 8, 16, 256, 272, 272, 512, 512, 513, 4000])


def test_v1_prices_all_reduces_with_vllms_own_table_when_measured(monkeypatch) -> None:
    """With vLLM's all-reduce measured at this TP degree, V1 uses it (graph up to the graph
    size, eager beyond); V0, or a model without it, uses NCCL's."""
    from optimizer.latency.fit import fit_latency_model
    from optimizer.latency.model import FitOptions
    from optimizer.records import KernelSample

    samples = []
    for kind, lat in ((OpKind.ALL_REDUCE, 0.050), (OpKind.VLLM_ALL_REDUCE, 0.005),
                      (OpKind.VLLM_ALL_REDUCE_EAGER, 0.020)):  # fmt: skip
        for size in (2**k for k in range(8, 24)):
            t = lat + size / 4e8
            samples.append(KernelSample(kind, t, t, t, dtype="float16" if kind is
                                        OpKind.ALL_REDUCE else "bfloat16", tp=2,
                                        num_gpus=2, message_bytes=size))  # fmt: skip
    model = fit_latency_model(samples, accelerator="h100", options=FitOptions(max_iter=20))
    roof = RooflinePricer(get_accelerator("h100"))
    v1 = Pricing(SHAPE, 2, roof, model, rules=EngineRelease("vllm", "0.12.0").rules)
    v0 = Pricing(SHAPE, 2, roof, model)
    assert v1.all_reduce_kinds() == (OpKind.VLLM_ALL_REDUCE, OpKind.VLLM_ALL_REDUCE_EAGER)
    assert v0.all_reduce_kinds() == (OpKind.ALL_REDUCE, OpKind.ALL_REDUCE)
    assert Pricing(SHAPE, 4, roof, model, rules=v1.rules).all_reduce_kinds()[0] is (
        OpKind.ALL_REDUCE
    )  # not measured at TP4
    small, large = np.array([64.0]), np.array([4096.0])
    assert v1.dense_ms(small)[0] < v0.dense_ms(small)[0]  # 5 us graph vs 50 us NCCL
    in_graph = v0.dense_ms(small)[0] - v1.dense_ms(small)[0]
    eager = v0.dense_ms(large)[0] - v1.dense_ms(large)[0]
    assert 0 < eager < in_graph  # beyond 512 tokens: the eager all-reduce (20 us)


def test_an_idle_start_adds_the_cpu_work_async_scheduling_hides_otherwise() -> None:
    """The first step on an idle engine has nothing to overlap its CPU work with: with
    async scheduling it lasts kernels + exposed + CPU, once more than a steady step; a
    synchronous engine's CPU work is in every step already (no difference)."""
    h100 = get_accelerator("h100")
    asy = compile_roofline(SHAPE, h100, 2, engine=EngineRelease("vllm", "0.20.1"))
    sync = compile_roofline(SHAPE, h100, 2, engine=EngineRelease("vllm", "0.12.0"))
    cpu = EngineRelease("vllm", "0.20.1").generation.cpu
    big = StepLoad(8192, 1, (8192,), (8192,))
    assert asy.idle_step_time_s(big) == pytest.approx(asy.step_time_s(big) + cpu.step_s(1, 8192))
    assert sync.idle_step_time_s(big) == pytest.approx(sync.step_time_s(big))


def test_the_exposed_share_of_the_forward_resolves_per_table() -> None:
    """`per_seq_forward` is a share of the one-token forward outside MoE blocks: 0.5% of
    a 4 ms forward is 20 us a sequence, on top of a fixed 10 us (golden). In the async
    generation's tables it follows the model's share of the GPU: dense Qwen3-32B's
    exposed time per sequence falls with TP, and a MoE of 3B active parameters, whose
    experts are left out, exposes a fraction of it."""
    share = EngineOverhead(base_s=1e-3, per_seq_s=10e-6, per_seq_forward=0.005)
    resolved = share.resolved(4e-3)
    assert resolved.per_seq_s == pytest.approx(30e-6) and resolved.per_seq_forward == 0
    assert (resolved.base_s, resolved.per_token_s) == (1e-3, 0.0)
    assert resolved.step_s(2, 100) == pytest.approx(1e-3 + 2 * 30e-6)
    assert EngineOverhead(per_seq_s=5e-6).resolved(4e-3) == EngineOverhead(per_seq_s=5e-6)
    with pytest.raises(ValueError, match="per_seq_forward"):
        EngineOverhead(per_seq_forward=-0.1)

    b300 = get_accelerator("b300")
    release = EngineRelease("vllm", "0.20.1")
    g = release.generation
    assert g.overhead.per_seq_forward > 0 and g.overhead.per_seq_s == 0
    dense = {tp: compile_roofline(SHAPE, b300, tp, engine=release) for tp in (1, 8)}
    for t in dense.values():
        assert t.overhead.per_seq_s == pytest.approx(g.overhead.per_seq_forward * t.forward_s)
    assert dense[8].overhead.per_seq_s < dense[1].overhead.per_seq_s / 2
    moe = compile_roofline(get_shape("qwen3.6-35b-a3b"), b300, 1, engine=release)
    one = StepLoad(1, 1, (), (), 1, 1)
    assert moe.forward_s < moe.kernel_time_s(one)  # its experts are not in it
    assert moe.overhead.per_seq_s < dense[1].overhead.per_seq_s / 4
