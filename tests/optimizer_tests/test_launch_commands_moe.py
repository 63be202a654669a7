"""Launch commands of MoE instances: vLLM's --data-parallel-size / --enable-expert-parallel
per replica server, SGLang's --tp-size over every GPU with --dp-size, --enable-dp-attention
and --ep-size; each parsed back and checked as a whole as test_launch_commands does."""

from __future__ import annotations

import pytest

from optimizer.config import InstanceConfig, ServingConfig
from optimizer.search.flags import launch_commands
from tests.optimizer_tests.engine_cli import parse
from tests.optimizer_tests.moe_fixtures import fake_layout_weights, register_moe
from tests.optimizer_tests.test_launch_commands import check_deployment


@pytest.fixture(autouse=True)
def _moe(monkeypatch):
    register_moe(monkeypatch)
    fake_layout_weights(monkeypatch)


def inst(tp: int, dp: int, ep: bool, **kw) -> InstanceConfig:
    return InstanceConfig(accelerator="h200", tp=tp, dp=dp, expert_parallel=ep, **kw)


CASES = {
    "dp4-ep": lambda: ServingConfig.colocated("test-moe", inst(1, 4, True)),
    "tp2-dp2-ep x3": lambda: ServingConfig.colocated("test-moe", inst(2, 2, True), 3),
    "tp2-dp2-tp-experts x2": lambda: ServingConfig.colocated("test-moe", inst(2, 2, False), 2),
    "tp2-ep x2": lambda: ServingConfig.colocated("test-moe", inst(2, 1, True), 2),
    "tp4 x2": lambda: ServingConfig.colocated("test-moe", inst(4, 1, False), 2),
    "pd dp": lambda: ServingConfig.disaggregated(
        "test-moe", inst(2, 2, True), inst(1, 4, True), num_prefill=1, num_decode=2
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_moe_commands_parse_and_hold_together(name: str) -> None:
    config = CASES[name]()
    check_deployment(config, launch_commands(config))


def test_moe_replicas_are_separate_vllm_servers() -> None:
    cfg = ServingConfig.colocated("test-moe", inst(2, 2, True, max_num_seqs=128), 2)
    v0, v1, s0, s1, router = launch_commands(cfg)
    tuned = (
        "--tensor-parallel-size 2 --data-parallel-size 2 --enable-expert-parallel "
        "--max-num-batched-tokens 8192 --max-num-seqs 128 --enable-chunked-prefill "
        "--gpu-memory-utilization 0.9 --block-size 16 --no-enable-prefix-caching"
    )
    assert v0.command == f"CUDA_VISIBLE_DEVICES=0,1,2,3 vllm serve test-moe --port 8000 {tuned}"
    assert v1.command == f"CUDA_VISIBLE_DEVICES=4,5,6,7 vllm serve test-moe --port 8001 {tuned}"
    assert "2 independent servers" in v0.note and "load balancer" in v0.note
    assert s0.command == (
        "CUDA_VISIBLE_DEVICES=0,1,2,3 python -m sglang.launch_server --model-path test-moe "
        "--port 30000 --tp-size 4 --dp-size 2 --enable-dp-attention --ep-size 4 "
        "--chunked-prefill-size 8192 --max-prefill-tokens 8192 --max-running-requests 128 "
        "--mem-fraction-static 0.9 --disable-radix-cache"
    )
    assert parse(s1).gpus == [4, 5, 6, 7] and router.role == "proxy"


def test_without_ep_or_dp_no_moe_flags() -> None:
    cfg = ServingConfig.colocated("test-moe", inst(4, 1, False))
    vllm, sglang = launch_commands(cfg)
    for flag in ("--data-parallel-size", "--enable-expert-parallel"):
        assert flag not in vllm.command
    for flag in ("--dp-size", "--enable-dp-attention", "--ep-size"):
        assert flag not in sglang.command
    assert "--tp-size 4 " in sglang.command


def test_an_instance_wider_than_a_node_is_flagged() -> None:
    cfg = ServingConfig.colocated("test-moe", inst(4, 4, True))
    first = launch_commands(cfg)[0]
    assert "a 16-GPU (tp x dp) instance needs more than one 8-GPU node" in first.note
