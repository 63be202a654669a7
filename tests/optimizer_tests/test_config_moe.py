"""MoE instances: dp and expert_parallel validated, per-GPU memory follows the split, the
refusals of precision against the GPU, and the JSON round trip of the new fields."""

from __future__ import annotations

import pytest

from optimizer.config import ConfigError, InstanceConfig, ServingConfig
from optimizer.hardware import Accelerator, HardwareError, get_accelerator, load_accelerator
from optimizer.memory import activation_reserve_bytes, kv_capacity_blocks
from optimizer.parallel import ExpertLayout
from optimizer.shapes import get_shape
from tests.optimizer_tests.moe_fixtures import (
    GIB,
    fake_layout_weights,
    fake_weight_bytes,
    register_moe,
)


@pytest.fixture(autouse=True)
def _moe(monkeypatch):
    register_moe(monkeypatch)
    # Known per-GPU weights for every layout (the shapes module prices the real ones).
    return fake_layout_weights(monkeypatch)


def moe(tp=1, dp=1, ep=False, acc="h200", model="test-moe", **kw) -> ServingConfig:
    inst = InstanceConfig(accelerator=acc, tp=tp, dp=dp, expert_parallel=ep)
    return ServingConfig.colocated(model, inst, **kw)


@pytest.mark.parametrize("dp", [0, -1, 1.5, True])
def test_dp_must_be_a_positive_int(dp):
    with pytest.raises(ConfigError, match=r"config\.replica\.dp: expected a positive integer"):
        moe(dp=dp)


def test_expert_parallel_must_be_a_bool():
    with pytest.raises(ConfigError, match=r"config\.replica\.expert_parallel: expected a bool"):
        moe(ep=1)


@pytest.mark.parametrize(("dp", "ep"), [(2, False), (1, True)])
def test_dense_model_refuses_dp_and_expert_parallel(dp, ep):
    with pytest.raises(ConfigError, match="dense model scales out with num_replicas") as exc:
        ServingConfig.colocated(
            "llama-3.1-8b", InstanceConfig(dp=dp, expert_parallel=ep), num_replicas=2
        )
    assert "config.replica" in str(exc.value)


def test_without_ep_the_expert_width_must_split_over_tp_x_dp():
    moe(tp=2, dp=2, model="test-odd-moe", acc="h100")  # 100 / 4 = 25: fine
    with pytest.raises(ConfigError, match=r"width 100 is not divisible by 8") as exc:
        moe(tp=2, dp=4, model="test-odd-moe", acc="h100")
    assert "config.replica" in str(exc.value) and "tp x dp = 8" in str(exc.value)
    moe(tp=2, dp=4, ep=True, model="test-odd-moe", acc="h100")  # whole experts: no split


def test_ep_splits_experts_unevenly_as_vllm_but_not_below_one_per_gpu():
    # vLLM's determine_expert_map gives 12 experts over 8 ranks as 2, 2, 2, 2, 1, 1, 1, 1.
    moe(tp=1, dp=8, ep=True, model="test-odd-moe", acc="h100")
    with pytest.raises(ConfigError, match="needs at least 16 experts; test-odd-moe has 12"):
        moe(tp=2, dp=8, ep=True, model="test-odd-moe", acc="h100")


def test_gpus_and_price_count_tp_x_dp():
    cfg = moe(tp=2, dp=4, ep=True, num_replicas=3)
    assert cfg.num_gpus == 2 * 4 * 3
    price = get_accelerator("h200").price_per_hour
    if price is not None:
        assert cfg.price_per_hour() == pytest.approx(price * 24)
    priced = ServingConfig.colocated(
        "test-moe",
        InstanceConfig(accelerator="h200", tp=2, dp=4, price_per_gpu_hour=2.5),
        num_replicas=3,
    )
    assert priced.price_per_hour() == pytest.approx(2.5 * 24)


def test_kv_capacity_uses_the_layouts_weights_per_gpu(_moe):
    seen = _moe
    inst = InstanceConfig(accelerator="h200", tp=2, dp=4, expert_parallel=True)
    shape = get_shape("test-moe")
    # by hand: 4 GiB / 2 + 64 GiB / 8 = 10 GiB of weights on each GPU
    assert fake_weight_bytes(2, inst.layout) == 10 * GIB
    free = 139.8 * GIB * 0.9 - 10 * GIB - activation_reserve_bytes(shape, inst)
    per_block = shape.kv_bytes_per_token(2) * 16
    assert kv_capacity_blocks(shape, inst) == int(free // per_block)
    assert ExpertLayout(4, True) in seen
    (plan,) = ServingConfig.colocated("test-moe", inst).roles()
    assert plan.kv_blocks == int(free // per_block)  # per DP rank


def test_does_not_fit_names_the_split():
    # tp 1, dp 1 on an H100: 4 + 64 = 68 GiB of weights > 79.2 GiB x 0.85
    with pytest.raises(ConfigError, match=r"does not fit on h100 at tp=1: 73\.0 GB of weights"):
        ServingConfig.colocated(
            "test-moe", InstanceConfig(accelerator="h100", gpu_memory_utilization=0.85)
        )
    with pytest.raises(ConfigError, match=r"at tp=1, dp=2: 38\.7 GB of weights per GPU"):
        ServingConfig.colocated(
            "test-moe",
            InstanceConfig(accelerator="h100", dp=2, gpu_memory_utilization=0.45),
        )
    # 4 + 32 GiB per GPU fits in 0.85 of an H100
    ServingConfig.colocated(
        "test-moe", InstanceConfig(accelerator="h100", dp=2, gpu_memory_utilization=0.85)
    )


@pytest.mark.parametrize("acc", ["h100", "h200", "a100", "l40s", "gh200"])
def test_nvfp4_needs_blackwell(acc):
    with pytest.raises(ConfigError, match=rf"fp4 \(NVFP4 W4A4\) needs FP4 tensor cores.*{acc}"):
        dense(acc, "fp4")


def dense(acc: str, quant: str) -> ServingConfig:
    return ServingConfig.colocated(
        "llama-3.1-8b", InstanceConfig(accelerator=acc), quantization=quant
    )


@pytest.mark.parametrize("acc", ["b200", "b300"])
def test_nvfp4_runs_on_blackwell(acc):
    assert dense(acc, "fp4").shape.quantization == "fp4"
    assert moe(acc=acc, quantization="fp4").shape.quantization == "fp4"


@pytest.mark.parametrize("quant", ["mxfp4", "int4"])
@pytest.mark.parametrize("acc", ["a100", "h100", "h200", "b200", "b300", "l40s"])
def test_weight_only_4bit_runs_on_ampere_and_newer(acc, quant):
    dense(acc, quant)


@pytest.mark.parametrize("quant", ["mxfp4", "int4"])
def test_weight_only_4bit_refused_without_marlin(tmp_path, quant):
    old = tmp_path / "v100.yaml"
    old.write_text("bf16_tflops: 125\nmemory_gib: 31.7\nhbm_tb_s: 0.9\ncompute_capability: 7.0\n")
    with pytest.raises(ConfigError, match=rf"{quant} runs on vLLM's Marlin.*v100 is 7\.0"):
        ServingConfig.colocated(
            "llama-3.1-8b", InstanceConfig(accelerator=str(old)), quantization=quant
        )
    unstated = tmp_path / "gpu.yaml"
    unstated.write_text("bf16_tflops: 125\nmemory_gib: 31.7\nhbm_tb_s: 0.9\n")
    with pytest.raises(ConfigError, match="gpu states no compute_capability"):
        ServingConfig.colocated(
            "llama-3.1-8b", InstanceConfig(accelerator=str(unstated)), quantization=quant
        )


def test_blackwell_presets_carry_aiconfigurator_fp4_peaks():
    # data/profiles/aiconfigurator/{b200,b300}_sxm/*.yaml: fp4_tc_flops 9e15 and 1.4e16
    assert get_accelerator("b200").fp4_tflops == 9000.0
    assert get_accelerator("b300").fp4_tflops == 14000.0
    for name in ("a100", "h100", "h200", "gh200", "l40s", "cpu"):
        assert get_accelerator(name).fp4_tflops is None


def test_spec_files_read_fp4_and_capability(tmp_path):
    spec = tmp_path / "rtx.yaml"
    spec.write_text(
        "bf16_tflops: 500\nmemory_gib: 94\nhbm_tb_s: 1.8\nfp4_tflops: 4000\n"
        "compute_capability: 12.0\n"
    )
    acc = load_accelerator(spec)
    assert acc.fp4_tflops == 4000 and acc.capability == (12, 0)
    with pytest.raises(HardwareError, match="fp4_tflops must be a positive number"):
        Accelerator("x", 1.0, memory_gib=1.0, hbm_tb_s=1.0, fp4_tflops=0)
    with pytest.raises(HardwareError, match="compute_capability must be a string"):
        Accelerator("x", 1.0, memory_gib=1.0, hbm_tb_s=1.0, compute_capability="nine")


def test_new_fields_round_trip_and_old_configs_load():
    cfg = moe(tp=2, dp=4, ep=True, num_replicas=2)
    data = cfg.to_dict()
    assert data["replica"]["dp"] == 4 and data["replica"]["expert_parallel"] is True
    assert ServingConfig.from_dict(data) == cfg
    old = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(tp=2)).to_dict()
    for key in ("dp", "expert_parallel"):
        del old["replica"][key]  # stored before issue 27
    loaded = ServingConfig.from_dict(old)
    assert loaded.replica is not None and loaded.replica.layout == ExpertLayout()
    pd = ServingConfig.disaggregated(
        "test-moe",
        InstanceConfig(accelerator="h200", tp=2, dp=2, expert_parallel=True),
        InstanceConfig(accelerator="h200", tp=1, dp=4),
    )
    assert ServingConfig.from_dict(pd.to_dict()) == pd
    assert pd.num_gpus == 4 + 4
