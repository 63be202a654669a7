"""Launch commands users paste: vLLM and SGLang flags for a `ServingConfig` (DOMAIN.md §5).

Colocated configs get one command per engine, run `count` times (one server
per replica, behind any load balancer). Disaggregated configs get one command
per role with the KV-transfer settings (vLLM: NixlConnector producer/consumer;
SGLang: `--disaggregation-mode` with the NIXL backend), plus the proxy or
router that pairs them, listing every instance as PREFILL_HOST_i / DECODE_HOST_i
placeholders on the engine's default port. vLLM ships no production PD router:
its command is the reference proxy from the vLLM repository
(`tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`, as in vLLM's
NixlConnector guide); put your own router in its place at scale.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from enum import StrEnum

from optimizer.config import InstanceConfig, ServingConfig, ServingMode, SpecMethod
from optimizer.shapes import HF_IDS

_VLLM_SPEC = {
    SpecMethod.EAGLE: "eagle3",
    SpecMethod.DRAFT: "draft_model",
    SpecMethod.NGRAM: "ngram",
}
_SGLANG_SPEC = {
    SpecMethod.EAGLE: "EAGLE3",
    SpecMethod.DRAFT: "STANDALONE",
    SpecMethod.NGRAM: "NGRAM",
}
DRAFT_PLACEHOLDER = "<draft-model>"
VLLM_PD_PROXY = "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"
VLLM_PORT, SGLANG_PORT = 8000, 30000  # the engines' default serving ports


class Engine(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    engine: Engine
    role: str  # "replica" | "prefill" | "decode" | "proxy"
    count: int  # how many servers run this command
    command: str
    note: str = ""  # what the command leaves to the engine's defaults, for people


def model_id(config: ServingConfig, override: str | None = None) -> str:
    return override or HF_IDS.get(config.model.lower(), config.model)


def _draft(config: ServingConfig, draft_model: str | None) -> str:
    name = draft_model or config.speculation.draft_model
    return HF_IDS.get(name.lower(), name) if name else DRAFT_PLACEHOLDER


def _precision_args(config: ServingConfig, *, kv_flag: str, kv_fp8: str) -> list[str]:
    """FP8 weights on a 16-bit checkpoint (quantised on the fly; a pre-quantised checkpoint
    needs no flag: both engines read its quantization_config) and an FP8 KV cache."""
    out = []
    if config.shape.quantization == "fp8" and config.checkpoint_quantization != "fp8":
        out += ["--quantization", "fp8"]
    if config.kv_cache_dtype == "fp8":
        out += [kv_flag, kv_fp8]
    return out


def _max_model_len(config: ServingConfig, inst: InstanceConfig) -> int | None:
    """The context limit to pass: with chunked prefill off a prompt must fit one step's
    token budget (vLLM refuses to start otherwise), which is also what was simulated."""
    mml = config.max_model_len
    if not inst.enable_chunked_prefill:
        budget = inst.max_num_batched_tokens
        mml = budget if mml is None else min(mml, budget)
    return mml


def _vllm_args(
    config: ServingConfig, inst: InstanceConfig, *, speculate: bool, draft_model: str | None
) -> list[str]:
    args = [
        "--tensor-parallel-size",
        str(inst.tp),
        "--max-num-batched-tokens",
        str(inst.max_num_batched_tokens),
        "--max-num-seqs",
        str(inst.max_num_seqs),
        "--enable-chunked-prefill"
        if inst.enable_chunked_prefill
        else "--no-enable-chunked-prefill",
        "--gpu-memory-utilization",
        f"{inst.gpu_memory_utilization:g}",
        "--block-size",
        str(inst.block_size),
    ]
    mml = _max_model_len(config, inst)
    if mml is not None:
        args += ["--max-model-len", str(mml)]
    # Stated either way: vLLM v1 enables it by default, and the command must be the
    # simulated deployment.
    args.append(
        "--enable-prefix-caching" if config.enable_prefix_caching else "--no-enable-prefix-caching"
    )
    args += _precision_args(config, kv_flag="--kv-cache-dtype", kv_fp8="fp8")
    spec = config.speculation
    if speculate and spec.enabled:
        cfg: dict[str, object] = {"method": _VLLM_SPEC[spec.method]}
        if spec.method is not SpecMethod.NGRAM:
            cfg["model"] = _draft(config, draft_model)
        cfg["num_speculative_tokens"] = spec.num_speculative_tokens
        if spec.method is SpecMethod.NGRAM:
            cfg["prompt_lookup_max"] = 4
        args += ["--speculative-config", json.dumps(cfg)]
    return args


def _sglang_args(
    config: ServingConfig, inst: InstanceConfig, *, speculate: bool, draft_model: str | None
) -> list[str]:
    chunk = inst.max_num_batched_tokens if inst.enable_chunked_prefill else -1
    args = [
        "--tp-size",
        str(inst.tp),
        "--chunked-prefill-size",
        str(chunk),
        "--max-prefill-tokens",
        str(inst.max_num_batched_tokens),
        "--max-running-requests",
        str(inst.max_num_seqs),
        "--mem-fraction-static",
        f"{inst.gpu_memory_utilization:g}",
    ]
    mml = _max_model_len(config, inst)
    if mml is not None:
        args += ["--context-length", str(mml)]
    if not config.enable_prefix_caching:
        args.append("--disable-radix-cache")
    args += _precision_args(config, kv_flag="--kv-cache-dtype", kv_fp8="fp8_e4m3")
    spec = config.speculation
    if speculate and spec.enabled:
        k = spec.num_speculative_tokens
        args += ["--speculative-algorithm", _SGLANG_SPEC[spec.method]]
        if spec.method is not SpecMethod.NGRAM:
            args += ["--speculative-draft-model-path", _draft(config, draft_model)]
        args += [
            "--speculative-num-steps",
            str(k),
            "--speculative-num-draft-tokens",
            str(k + 1),
            "--speculative-eagle-topk",
            "1",
        ]
    return args


def _join(parts: list[str]) -> str:
    return " ".join(shlex.quote(p) for p in parts)


def launch_commands(
    config: ServingConfig, *, model: str | None = None, draft_model: str | None = None
) -> tuple[LaunchCommand, ...]:
    """vLLM then SGLang commands; `model` overrides the Hugging Face id of the shape."""
    mid = model_id(config, model)
    pd = config.mode is ServingMode.DISAGGREGATED
    if pd:
        assert config.prefill is not None and config.decode is not None
        roles = [
            ("prefill", config.prefill, config.num_prefill),
            ("decode", config.decode, config.num_decode),
        ]
    else:
        assert config.replica is not None
        roles = [("replica", config.replica, config.num_replicas)]
    vllm: list[LaunchCommand] = []
    sglang: list[LaunchCommand] = []
    for role, inst, n in roles:
        speculate = role != "prefill"  # a prefill server emits one token: nothing to verify
        args = _vllm_args(config, inst, speculate=speculate, draft_model=draft_model)
        if pd:
            kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
            kv = {"kv_connector": "NixlConnector", "kv_role": kv_role}
            args += ["--kv-transfer-config", json.dumps(kv, separators=(",", ":"))]
        vllm.append(LaunchCommand(Engine.VLLM, role, n, _join(["vllm", "serve", mid, *args])))
        args = _sglang_args(config, inst, speculate=speculate, draft_model=draft_model)
        if pd:
            args += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "nixl"]
        server = ["python", "-m", "sglang.launch_server", "--model-path", mid, *args]
        note = ""
        if config.enable_prefix_caching:  # off is --disable-radix-cache; on has no flag
            note = "radix cache (prefix caching) on: SGLang's default, no flag needed"
        sglang.append(LaunchCommand(Engine.SGLANG, role, n, _join(server), note))
    if pd:
        prefill_hosts = [f"PREFILL_HOST_{i + 1}" for i in range(config.num_prefill)]
        decode_hosts = [f"DECODE_HOST_{i + 1}" for i in range(config.num_decode)]
        proxy = ["python", VLLM_PD_PROXY, "--port", "8192", "--prefiller-hosts", *prefill_hosts]
        proxy += ["--prefiller-ports", *[str(VLLM_PORT)] * len(prefill_hosts)]
        proxy += ["--decoder-hosts", *decode_hosts]
        proxy += ["--decoder-ports", *[str(VLLM_PORT)] * len(decode_hosts)]
        vllm.append(LaunchCommand(Engine.VLLM, "proxy", 1, _join(proxy)))
        router = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
        for flag, hosts in (("--prefill", prefill_hosts), ("--decode", decode_hosts)):
            for host in hosts:
                router += [flag, f"http://{host}:{SGLANG_PORT}"]
        sglang.append(LaunchCommand(Engine.SGLANG, "proxy", 1, _join(router)))
    return (*vllm, *sglang)
