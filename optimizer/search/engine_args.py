"""The engine arguments of one server: vLLM's `vllm serve` flags and SGLang's
`sglang.launch_server` flags for an `InstanceConfig` of a `ServingConfig` (DOMAIN.md §5).
`optimizer.search.flags` lays the servers out and adds what depends on their place.

MoE instances (`optimizer.parallel`). vLLM: `--tensor-parallel-size T
--data-parallel-size D` (D attention ranks of T GPUs each, one scheduler and KV cache
per rank, run in lockstep for the MoE layers) and `--enable-expert-parallel` (experts
sharded whole over the T x D GPUs; without it vLLM tensor-splits them over T x D).
SGLang counts every GPU of the server in `--tp-size` (T x D): `--dp-size D
--enable-dp-attention` makes D attention ranks of T GPUs (its attn_tp_size = tp_size /
dp_size, dp_attention.compute_dp_attention_world_info) and `--ep-size T x D` shards the
experts whole; without `--ep-size` its MoE layers are tensor-split over tp_size, as
vLLM's are.
"""

from __future__ import annotations

import json

from optimizer.config import InstanceConfig, ServingConfig, SpecMethod
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


def vllm_args(
    config: ServingConfig, inst: InstanceConfig, *, speculate: bool, draft_model: str | None
) -> list[str]:
    args = ["--tensor-parallel-size", str(inst.tp)]
    if inst.dp > 1:
        args += ["--data-parallel-size", str(inst.dp)]
    if inst.expert_parallel:
        args.append("--enable-expert-parallel")
    args += [
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


def sglang_args(
    config: ServingConfig, inst: InstanceConfig, *, speculate: bool, draft_model: str | None
) -> list[str]:
    chunk = inst.max_num_batched_tokens if inst.enable_chunked_prefill else -1
    args = ["--tp-size", str(inst.num_gpus)]  # SGLang's tp_size counts every GPU
    if inst.dp > 1:
        args += ["--dp-size", str(inst.dp), "--enable-dp-attention"]
    if inst.expert_parallel:
        args += ["--ep-size", str(inst.num_gpus)]
    args += [
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
