"""Accelerator presets of the parts aiconfigurator-core measures (their figures as
transcribed from its system YAMLs; `tests/api_tests/test_cli_profile_aic.py` holds them to
the installed package's files) and the precisions each refuses."""

from __future__ import annotations

import pytest

from optimizer.config import ConfigError, InstanceConfig, ServingConfig
from optimizer.engines import COMPUTE_CAPABILITY
from optimizer.hardware import HardwareError, get_accelerator, load_accelerator
from optimizer.search.flags import launch_commands

# name -> (bf16, fp8, fp4 dense TFLOP/s, memory GiB, TB/s, link GB/s, capability,
#          GPUs per host, GPUs per link domain)
PRESETS = {
    "gb200": (2500.0, 5000.0, 10000.0, 183.4, 8.0, 900.0, "10.0", 4, 72),
    "gb300": (2500.0, 5000.0, 15000.0, 275.0, 8.0, 900.0, "10.3", 4, 72),
    "rtx-pro-6000": (467.8, 935.6, 1871.2, 94.7, 1.792, 64.0, "12.0", 8, 8),
    "b60": (98.304, None, None, 23.8, 0.456, 28.4, None, 8, 8),
    "l40s": (362.05, 733.0, None, 44.4, 0.864, 32.0, "8.9", 8, 8),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_figures(name: str) -> None:
    a = get_accelerator(name)
    assert (
        a.bf16_tflops,
        a.fp8_tflops,
        a.fp4_tflops,
        a.memory_gib,
        a.hbm_tb_s,
        a.link_gb_s,
        a.compute_capability,
        a.num_gpus_per_node,
        a.num_gpus_per_domain,
    ) == PRESETS[name]
    assert a.family == name  # each has its own tables in the package: priced by its own model


@pytest.mark.parametrize("alias", ["rtx_pro_6000_server", "RTX_PRO_6000", "rtx-pro-6000-server"])
def test_rtx_pro_6000_aliases(alias: str) -> None:
    assert get_accelerator(alias).name == "rtx-pro-6000"


def test_existing_presets_keep_one_eight_gpu_node() -> None:
    for name in ("a100", "a100-40gb", "h100", "h200", "gh200", "b200", "b300", "l40s", "cpu"):
        a = get_accelerator(name)
        assert (a.num_gpus_per_node, a.num_gpus_per_domain) == (8, 8)


def test_domain_fields_are_checked(tmp_path) -> None:
    spec = tmp_path / "rack.yaml"
    spec.write_text(
        "bf16_tflops: 100\nmemory_gib: 10\nhbm_tb_s: 1\nnum_gpus_per_node: 4\n"
        "num_gpus_per_domain: 72\n"
    )
    assert load_accelerator(spec).num_gpus_per_domain == 72
    spec.write_text(
        "bf16_tflops: 100\nmemory_gib: 10\nhbm_tb_s: 1\nnum_gpus_per_node: 8\n"
        "num_gpus_per_domain: 4\n"
    )
    with pytest.raises(HardwareError, match="num_gpus_per_domain \\(4\\) is smaller"):
        load_accelerator(spec)
    spec.write_text("bf16_tflops: 100\nmemory_gib: 10\nhbm_tb_s: 1\nnum_gpus_per_node: 0\n")
    with pytest.raises(HardwareError, match="num_gpus_per_node must be an int >= 1"):
        load_accelerator(spec)


def dense(acc: str, quant: str) -> ServingConfig:
    return ServingConfig.colocated(
        "llama-3.1-8b", InstanceConfig(accelerator=acc), quantization=quant
    )


@pytest.mark.parametrize("acc", ["l40s", "b60"])
def test_fp4_refused_without_fp4_tensor_cores(acc: str) -> None:
    with pytest.raises(
        ConfigError,
        match=rf"fp4 \(NVFP4 W4A4\) needs FP4 tensor cores \(Blackwell: b200, b300, gb200, "
        rf"gb300, rtx-pro-6000\); {acc} has none",
    ):
        dense(acc, "fp4")


@pytest.mark.parametrize("acc", ["gb200", "gb300", "rtx-pro-6000"])
def test_fp4_runs_on_new_blackwell_parts(acc: str) -> None:
    assert dense(acc, "fp4").shape.quantization == "fp4"


@pytest.mark.parametrize("quant", ["mxfp4", "int4"])
def test_b60_refuses_marlin_formats(quant: str) -> None:
    with pytest.raises(ConfigError, match=rf"{quant} runs on vLLM's Marlin.*b60 states no"):
        dense("b60", quant)


def test_b60_runs_fp8_weight_only() -> None:
    # the package measured FP8 GEMMs on it (BF16 compute): allowed, priced at the bf16 peak
    assert get_accelerator("b60").fp8_tflops is None
    assert dense("b60", "fp8").shape.quantization == "fp8"


def test_fusion_capabilities_follow_the_presets() -> None:
    for family, cc in COMPUTE_CAPABILITY.items():
        assert get_accelerator(family).compute_capability == cc
    assert "rtx-pro-6000" not in COMPUTE_CAPABILITY  # 12.0: vLLM has no fusion limits for it


def test_gb200_commands_fit_a_four_gpu_tray() -> None:
    cfg = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(accelerator="gb200", tp=2), 4)
    vllm = [c for c in launch_commands(cfg) if c.engine == "vllm"]
    assert [c.node for c in vllm] == [0, 1]  # 4 GPUs per host: two hosts of two replicas
    wide = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(accelerator="gb200", tp=8), 1)
    assert "needs more than one 4-GPU node" in launch_commands(wide)[0].note
