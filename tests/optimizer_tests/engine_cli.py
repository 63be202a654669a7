"""The engines' command lines as their documentation names them: argparse parsers for
`vllm serve`, vLLM's NixlConnector proxy, SGLang's `sglang.launch_server` and
`sglang_router.launch_router` (no abbreviations: an unknown or misspelt flag fails),
and `parse`, which splits a launch command as a shell does and sets its leading
`NAME=value` assignments apart. Used by test_launch_commands.py."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from dataclasses import dataclass

from optimizer.search.flags import VLLM_PD_PROXY, LaunchCommand


class _Parser(argparse.ArgumentParser):
    """Exact names only: no abbreviations (`--tensor-parallel` is not a flag), and a parse
    error is an exception, not an exit."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog=prog, allow_abbrev=False)

    def error(self, message: str) -> None:  # argparse would print usage and exit
        raise ValueError(f"{self.prog}: {message}")


def _vllm_serve() -> _Parser:
    """`vllm serve` (vLLM engine args and serving/data-parallel deployment docs)."""
    p = _Parser("vllm serve")
    p.add_argument("model")
    p.add_argument("--host")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--data-parallel-size-local", type=int)
    p.add_argument("--data-parallel-start-rank", type=int, default=0)
    p.add_argument("--data-parallel-address")
    p.add_argument("--data-parallel-rpc-port", type=int)
    p.add_argument("--enable-expert-parallel", "-ep", action="store_true")
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction)
    p.add_argument("--gpu-memory-utilization", type=float)
    p.add_argument("--block-size", type=int, choices=[1, 8, 16, 32, 64, 128])
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
    p.add_argument("--kv-cache-dtype", choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2"])
    p.add_argument("--quantization", "-q")
    p.add_argument("--speculative-config", type=json.loads)
    p.add_argument("--kv-transfer-config", type=json.loads)
    return p


def _vllm_proxy() -> _Parser:
    """vLLM's tests/v1/kv_connector/nixl_integration/toy_proxy_server.py."""
    p = _Parser("toy_proxy_server.py")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--prefiller-hosts", "--prefiller-host", nargs="+", default=["localhost"])
    p.add_argument("--prefiller-ports", "--prefiller-port", type=int, nargs="+", default=[8100])
    p.add_argument("--decoder-hosts", "--decoder-host", nargs="+", default=["localhost"])
    p.add_argument("--decoder-ports", "--decoder-port", type=int, nargs="+", default=[8200])
    return p


def _sglang_server() -> _Parser:
    """`python -m sglang.launch_server` (SGLang's server arguments page)."""
    p = _Parser("sglang.launch_server")
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tensor-parallel-size", "--tp-size", dest="tp_size", type=int, default=1)
    p.add_argument("--data-parallel-size", "--dp-size", dest="dp_size", type=int, default=1)
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--expert-parallel-size", "--ep-size", "--ep", dest="ep_size", type=int,
                   default=1)  # fmt: skip
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--max-prefill-tokens", type=int)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--context-length", type=int)
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--kv-cache-dtype", choices=["auto", "fp8_e5m2", "fp8_e4m3", "bf16"])
    p.add_argument("--quantization")
    p.add_argument("--speculative-algorithm",
                   choices=["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"])  # fmt: skip
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model")
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--disaggregation-mode", choices=["null", "prefill", "decode"], default="null")
    p.add_argument("--disaggregation-transfer-backend", choices=["mooncake", "nixl"])
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    return p


def _sglang_router() -> _Parser:
    """`python -m sglang_router.launch_router` (sgl-router's router_args.py)."""
    p = _Parser("sglang_router.launch_router")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--worker-urls", nargs="*", default=[])
    p.add_argument("--policy", choices=["random", "round_robin", "cache_aware", "power_of_two"])
    p.add_argument("--pd-disaggregation", action="store_true")
    p.add_argument("--prefill", nargs="+", action="append", default=[])
    p.add_argument("--decode", nargs=1, action="append", default=[])
    return p


PROGRAMS = {
    ("vllm", "serve"): ("vllm", _vllm_serve),
    ("python", VLLM_PD_PROXY): ("vllm-proxy", _vllm_proxy),
    ("python", "-m", "sglang.launch_server"): ("sglang", _sglang_server),
    ("python", "-m", "sglang_router.launch_router"): ("sglang-router", _sglang_router),
}
ASSIGNMENT = re.compile(r"[A-Z_][A-Z0-9_]*=.*")


@dataclass(frozen=True)
class Process:
    cmd: LaunchCommand
    env: dict[str, str]
    program: str  # a key of the table above: "vllm", "vllm-proxy", "sglang", "sglang-router"
    args: argparse.Namespace

    @property
    def is_server(self) -> bool:
        return self.program in ("vllm", "sglang")

    @property
    def gpus(self) -> list[int]:
        return [int(g) for g in self.env["CUDA_VISIBLE_DEVICES"].split(",")]

    @property
    def tp(self) -> int:
        """GPUs per engine (per data-parallel rank): SGLang's --tp-size counts every GPU of a
        server with DP attention (its attn_tp_size = tp_size / dp_size)."""
        if self.program == "vllm":
            return self.args.tensor_parallel_size
        if self.args.enable_dp_attention:
            return self.args.tp_size // self.args.dp_size
        return self.args.tp_size

    @property
    def num_engines(self) -> int:
        """Replicas, or data-parallel ranks, this server process runs (a vLLM data-parallel
        server runs several)."""
        if self.program != "vllm":
            return self.args.dp_size
        local = self.args.data_parallel_size_local
        return self.args.data_parallel_size if local is None else local

    @property
    def listens(self) -> bool:
        return not getattr(self.args, "headless", False)


def parse(cmd: LaunchCommand) -> Process:
    argv = shlex.split(cmd.command)
    env = {}
    while argv and ASSIGNMENT.fullmatch(argv[0]):
        name, value = argv.pop(0).split("=", 1)
        env[name] = value
    for prefix, (program, parser) in PROGRAMS.items():
        if tuple(argv[: len(prefix)]) == prefix:
            return Process(cmd, env, program, parser().parse_args(argv[len(prefix) :]))
    raise AssertionError(f"unknown program in {cmd.command!r}")
