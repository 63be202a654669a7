"""Launch commands carry exactly what was simulated: knobs, prefix caching, KV roles and
precision, in vLLM's and SGLang's own flags (where they run: test_launch_commands.py)."""

from __future__ import annotations

from optimizer.config import (
    InstanceConfig,
    ServingConfig,
    ServingMode,
    SpecMethod,
    SpeculationConfig,
)
from optimizer.search.flags import launch_commands
from optimizer.search.space import SearchSpace, enumerate_grid


def test_vllm_and_sglang_golden_commands():
    cfg = ServingConfig.colocated(
        "llama-3.1-8b",
        InstanceConfig(tp=2, max_num_batched_tokens=2048, max_num_seqs=128),
        num_replicas=4,
        speculation=SpeculationConfig(method=SpecMethod.EAGLE, num_speculative_tokens=3),
    )
    vllm, sglang, *_, router = launch_commands(
        cfg, draft_model="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    )
    # vLLM: the 4 replicas as one data-parallel server; SGLang: one server each + router.
    assert vllm.count == 1 and vllm.role == "replica" and router.role == "proxy"
    assert vllm.command == (
        "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 vllm serve meta-llama/Llama-3.1-8B-Instruct "
        "--port 8000 --data-parallel-size 4 --tensor-parallel-size 2 "
        "--max-num-batched-tokens 2048 --max-num-seqs 128 --enable-chunked-prefill "
        "--gpu-memory-utilization 0.9 --block-size 16 --no-enable-prefix-caching "
        "--speculative-config "
        """'{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", """
        """"num_speculative_tokens": 3}'"""
    )
    assert sglang.note == ""  # --disable-radix-cache states it
    assert sglang.command == (
        "CUDA_VISIBLE_DEVICES=0,1 python -m sglang.launch_server --model-path "
        "meta-llama/Llama-3.1-8B-Instruct --port 30000 --tp-size 2 --chunked-prefill-size 2048 "
        "--max-prefill-tokens 2048 "
        "--max-running-requests 128 --mem-fraction-static 0.9 --disable-radix-cache "
        "--speculative-algorithm EAGLE3 --speculative-draft-model-path "
        "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B --speculative-num-steps 3 "
        "--speculative-num-draft-tokens 4 --speculative-eagle-topk 1"
    )


def test_the_priced_engines_commands_come_first():
    inst = InstanceConfig(tp=2, max_num_batched_tokens=2048, max_num_seqs=128)
    vllm_first = launch_commands(ServingConfig.colocated("llama-3.1-8b", inst, num_replicas=2))
    sglang_cfg = ServingConfig.colocated("llama-3.1-8b", inst, num_replicas=2, engine="sglang")
    sglang_first = launch_commands(sglang_cfg)
    assert vllm_first[0].engine == "vllm" and sglang_first[0].engine == "sglang"
    assert sorted(c.command for c in vllm_first) == sorted(c.command for c in sglang_first)
    engines = [c.engine for c in sglang_first]
    assert engines == sorted(engines, key=lambda e: e != "sglang")  # one block each


def test_prefix_caching_is_stated_in_both_engines_commands():
    on = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(), enable_prefix_caching=True)
    vllm, sglang = launch_commands(on)
    assert "--enable-prefix-caching" in vllm.command
    assert "--disable-radix-cache" not in sglang.command and "radix cache" in sglang.note
    off = ServingConfig.colocated("llama-3.1-8b", InstanceConfig())
    vllm, sglang = launch_commands(off)
    assert "--no-enable-prefix-caching" in vllm.command
    assert "--disable-radix-cache" in sglang.command


def test_disaggregated_commands_carry_the_kv_roles():
    cfg = ServingConfig.disaggregated(
        "llama-3.1-8b",
        InstanceConfig(enable_chunked_prefill=False),
        InstanceConfig(max_num_batched_tokens=2048),
        num_prefill=2,
        num_decode=6,
    )
    cmds = launch_commands(cfg)
    pre = next(c for c in cmds if c.engine == "vllm" and c.role == "prefill")
    dec = next(c for c in cmds if c.engine == "vllm" and c.role == "decode")
    roles = [c.role for c in cmds if c.engine == "vllm"]
    assert roles == ["prefill"] * 2 + ["decode"] * 6 + ["proxy"]
    assert pre.command.endswith(
        """--no-enable-chunked-prefill --gpu-memory-utilization 0.9 --block-size 16 """
        # chunked prefill off: vLLM needs max_model_len <= the token budget
        """--max-model-len 8192 --no-enable-prefix-caching """
        """--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'"""
    )
    assert """"kv_role":"kv_consumer"}'""" in dec.command
    proxy = next(c for c in cmds if c.engine == "vllm" and c.role == "proxy")
    assert proxy.count == 1 and proxy.command == (
        "python tests/v1/kv_connector/nixl_integration/toy_proxy_server.py --host 0.0.0.0 "
        "--port 8192 --prefiller-hosts 127.0.0.1 127.0.0.1 --prefiller-ports 8000 8001 "
        "--decoder-hosts "
        + " ".join(["127.0.0.1"] * 6)
        + " --decoder-ports "
        + " ".join(str(p) for p in range(8002, 8008))
    )
    sg = [c for c in cmds if c.engine == "sglang"]
    assert [c.role for c in sg] == ["prefill"] * 2 + ["decode"] * 6 + ["proxy"]
    assert "--chunked-prefill-size -1" in sg[0].command
    assert "--context-length 8192" in sg[0].command
    assert "--max-model-len" not in dec.command  # chunked: no limit beyond the KV cache
    assert sg[2].command.endswith(
        "--disaggregation-mode decode --disaggregation-transfer-backend nixl"
    )
    assert sg[-1].command == (
        "python -m sglang_router.launch_router --host 0.0.0.0 --port 8000 --pd-disaggregation "
        "--prefill http://127.0.0.1:30000 8998 --prefill http://127.0.0.1:30001 8999 "
        + " ".join(f"--decode http://127.0.0.1:{p}" for p in range(30002, 30008))
        + " --policy round_robin"
    )


def test_precision_is_in_the_commands_as_simulated():
    fp8_ckpt = ServingConfig.colocated("nvidia/Llama-3.1-8B-Instruct-FP8", InstanceConfig())
    vllm, sglang = launch_commands(fp8_ckpt)
    # Pre-quantised: the engines read the checkpoint's quantization_config.
    assert vllm.command.startswith(
        "CUDA_VISIBLE_DEVICES=0 vllm serve nvidia/Llama-3.1-8B-Instruct-FP8 "
    )
    assert "--quantization" not in vllm.command and "--kv-cache-dtype" not in vllm.command
    on_the_fly = ServingConfig.colocated(
        "llama-3.1-8b", InstanceConfig(), quantization="fp8", kv_cache_dtype="fp8"
    )
    vllm, sglang = launch_commands(on_the_fly)
    assert "--quantization fp8 --kv-cache-dtype fp8" in vllm.command
    assert "--quantization fp8 --kv-cache-dtype fp8_e4m3" in sglang.command
    # FP8 KV halves the KV bytes per token: twice the blocks, minus nothing else.
    base = ServingConfig.colocated("llama-3.1-8b", InstanceConfig())
    kv8 = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(), kv_cache_dtype="fp8")
    assert kv8.roles()[0].kv_blocks in (2 * base.roles()[0].kv_blocks,
                                        2 * base.roles()[0].kv_blocks + 1)  # fmt: skip
    space = SearchSpace("llama-3.1-8b", ("h100",), 1, kv_cache_dtype=("auto", "fp8"),
                        modes=(ServingMode.COLOCATED,), tp=(1,))  # fmt: skip
    assert {p.config.kv_cache_dtype for p in enumerate_grid(space) if p.config} == {"auto", "fp8"}
