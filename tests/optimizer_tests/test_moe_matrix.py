"""Issue 27's coverage target: every MoE family and precision users deploy simulates on
H100, H200, B200 and B300 (roofline-priced here: no tables needed), on the smallest
layout that fits, and an unsupported combination is refused with an error that names it.
"""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.config import ConfigError, InstanceConfig, ServingConfig
from optimizer.latency import build_catalog
from optimizer.sim import simulate
from optimizer.workload import Workload

GPUS = ("h100", "h200", "b200", "b300")
# (model as users name it, its weight format as shipped)
MODELS = (
    ("openai/gpt-oss-20b", "mxfp4"),
    ("openai/gpt-oss-120b", "mxfp4"),
    ("Qwen/Qwen3-30B-A3B", "none"),
    ("Qwen/Qwen3-235B-A22B", "none"),
    ("Qwen/Qwen3-235B-A22B-FP8", "fp8"),
    ("deepseek-ai/DeepSeek-V3", "fp8"),
    ("deepseek-ai/DeepSeek-R1", "fp8"),
    ("moonshotai/Kimi-K2-Instruct", "fp8"),
    ("moonshotai/Kimi-K2-Thinking", "int4"),
    ("MiniMaxAI/MiniMax-M2", "fp8"),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "none"),
    ("nvidia/DeepSeek-R1-FP4", "fp4"),
    ("deepseek-ai/DeepSeek-V3.2", "fp8"),
    ("zai-org/GLM-5-FP8", "fp8"),
    ("nvidia/DeepSeek-V3.2-NVFP4", "fp4"),
    ("moonshotai/Kimi-K2.5", "int4"),
    ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", "none"),
    ("Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8", "fp8"),
    ("mistralai/Mixtral-8x7B-v0.1", "none"),
    ("MiniMaxAI/MiniMax-M2.5", "fp8"),
    ("nvidia/Qwen3-235B-A22B-NVFP4", "fp4"),
    ("nvidia/Kimi-K2.5-NVFP4", "fp4"),
    ("nvidia/MiniMax-M2.5-NVFP4", "fp4"),
    ("Qwen/Qwen3.6-35B-A3B", "none"),
    ("Qwen/Qwen3.5-397B-A17B", "none"),
    ("Qwen/Qwen3-Next-80B-A3B-Instruct", "none"),
)
# (tp, dp, expert_parallel), smallest first: one node of 8 GPUs, then two
LAYOUTS = ((1, 1, False), (2, 1, True), (4, 1, True), (8, 1, True), (8, 2, True))


def smallest_fitting(model: str, gpu: str) -> ServingConfig:
    last: ConfigError | None = None
    for tp, dp, ep in LAYOUTS:
        try:
            inst = InstanceConfig(accelerator=gpu, tp=tp, dp=dp, expert_parallel=ep)
            return ServingConfig.colocated(model, inst)
        except ConfigError as exc:
            if "does not fit" not in str(exc):
                raise
            last = exc
    raise AssertionError(f"{model} fits on no layout of {gpu}: {last}")


@pytest.mark.parametrize(("model", "fmt"), MODELS)
def test_every_family_and_format_simulates_on_hopper_and_blackwell(model, fmt) -> None:
    n = 12
    workload = Workload(np.linspace(0.0, 0.5, n), np.full(n, 512), np.full(n, 16))
    for gpu in GPUS:
        if fmt == "fp4" and gpu in ("h100", "h200"):
            with pytest.raises(ConfigError, match=f"fp4.*{gpu}"):
                smallest_fitting(model, gpu)
            continue
        config = smallest_fitting(model, gpu)
        assert config.shape.is_moe and config.shape.quantization == fmt
        catalog = build_catalog(config.shape, [])
        result = simulate(workload, config, catalog)
        assert result.num_completed == n, (model, gpu)
        assert np.all(np.isfinite(result.ttft_s)) and np.all(result.tpot_s > 0), (model, gpu)
