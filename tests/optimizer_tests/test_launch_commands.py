"""Launch commands run as pasted: each command is split as a shell splits it, its leading
`NAME=value` assignments set apart, and its argv parsed by a parser built from the engine's
documented argument names (vLLM `vllm serve` and its NixlConnector proxy, SGLang
`sglang.launch_server` and `sglang_router.launch_router`), so an unknown or misspelt flag
fails. Then the deployment is checked as a whole: no GPU or port is shared, the GPUs are
exactly the recommended ones, TP is each instance's, and the proxy or router names every
server's address."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter

import pytest

from optimizer.config import (
    InstanceConfig,
    RoutingPolicy,
    ServingConfig,
    ServingMode,
    SpecMethod,
    SpeculationConfig,
)
from optimizer.search.flags import VLLM_PD_PROXY, LaunchCommand, launch_commands
from tests.optimizer_tests.engine_cli import Process, parse

GPUS_PER_NODE = 8


def host(node: int, num_nodes: int) -> str:
    """The address the proxy or router names for a server on `node` (after shlex)."""
    return "127.0.0.1" if num_nodes == 1 else f"${{NODE_{node}_HOST}}"


def check_deployment(config: ServingConfig, commands: tuple[LaunchCommand, ...]) -> None:
    """Everything one engine's commands must hold for the deployment to run as simulated."""
    pd = config.mode is ServingMode.DISAGGREGATED
    tp = {p.role.value: p.instance.tp for p in config.roles()}
    inst = {p.role.value: p.instance for p in config.roles()}
    assert [c.engine for c in commands] == sorted((c.engine for c in commands), reverse=True)
    for engine in ("vllm", "sglang"):
        procs = [parse(c) for c in commands if c.engine == engine]
        servers = [p for p in procs if p.is_server]
        fronts = [p for p in procs if not p.is_server]
        assert procs[: len(servers)] == servers, "servers first, then the proxy or router"
        num_nodes = max(p.cmd.node for p in servers) + 1
        # Each server: its own GPUs, exactly TP per replica it runs, on a node of one type.
        used = []
        for s in servers:
            assert s.cmd.count == 1 and s.cmd.accelerator == inst[s.cmd.role].accelerator
            assert s.tp == tp[s.cmd.role]
            assert len(s.gpus) == s.tp * s.num_engines
            assert all(0 <= g < GPUS_PER_NODE for g in s.gpus)
            used += [(s.cmd.node, g) for g in s.gpus]
        assert len(set(used)) == len(used) == config.num_gpus
        node_types = {(s.cmd.node, s.cmd.accelerator) for s in servers}
        assert len(node_types) == num_nodes and set(range(num_nodes)) == {n for n, _ in node_types}
        assert all(f.cmd.node == 0 and f.cmd.accelerator == "" for f in fronts)
        # Every listening process has its own port on its node.
        ports = [(p.cmd.node, p.args.port) for p in procs if p.listens]
        assert len(set(ports)) == len(ports)
        # The simulated knobs, per role.
        for s in servers:
            i = inst[s.cmd.role]
            check_moe_split(s, i)
            if engine == "vllm":
                assert s.args.max_num_seqs == i.max_num_seqs
                assert s.args.max_num_batched_tokens == i.max_num_batched_tokens
            else:
                assert s.args.max_running_requests == i.max_num_seqs
        check_speculation(config, servers)
        address = {s.cmd: (host(s.cmd.node, num_nodes), s.args.port) for s in servers}
        if engine == "vllm" and pd:
            check_vllm_pd(servers, fronts, address, num_nodes)
        elif engine == "vllm" and config.shape.is_moe:
            assert len(servers) == config.num_replicas and all(s.listens for s in servers)
            assert fronts == []  # the user's load balancer goes in front of the servers
        elif engine == "vllm":
            check_vllm_data_parallel(config, servers, fronts, num_nodes)
        elif pd:
            check_sglang_pd(servers, fronts, address)
        else:
            assert config.replica is not None
            assert sum(s.num_engines for s in servers) == config.num_replicas * config.replica.dp
            if len(servers) == 1:
                assert fronts == [] and servers[0].args.host == "0.0.0.0"
            else:
                (router,) = fronts
                urls = [f"http://{h}:{port}" for h, port in address.values()]
                assert router.program == "sglang-router" and router.args.worker_urls == urls
                if config.routing is RoutingPolicy.ROUND_ROBIN:
                    assert router.args.policy == "round_robin"
        if num_nodes > 1:  # servers must be reachable from node 0's router or proxy
            for s in servers:
                if engine == "sglang":
                    assert s.args.host == "0.0.0.0"


def check_moe_split(s: Process, inst: InstanceConfig) -> None:
    """One server's attention ranks and expert split are its instance's (tp x dp GPUs)."""
    if s.program == "vllm":
        if inst.dp > 1:  # (a dense model's data_parallel_size is its replicas)
            assert s.args.data_parallel_size == inst.dp
        assert s.args.enable_expert_parallel == inst.expert_parallel
    else:
        assert s.args.tp_size == inst.tp * inst.dp
        assert s.args.dp_size == inst.dp and s.args.enable_dp_attention == (inst.dp > 1)
        assert s.args.ep_size == (inst.tp * inst.dp if inst.expert_parallel else 1)


def check_speculation(config: ServingConfig, servers: list[Process]) -> None:
    spec = config.speculation
    for s in servers:
        speculates = spec.enabled and s.cmd.role != "prefill"
        if s.program == "vllm":
            got = s.args.speculative_config
            assert (got is not None) == speculates
            if speculates:
                assert got["num_speculative_tokens"] == spec.num_speculative_tokens
        else:
            assert (s.args.speculative_algorithm is not None) == speculates
            if speculates:
                assert s.args.speculative_num_steps == spec.num_speculative_tokens
                assert s.args.speculative_num_draft_tokens == spec.num_speculative_tokens + 1


def check_vllm_data_parallel(
    config: ServingConfig, servers: list[Process], fronts: list[Process], num_nodes: int
) -> None:
    """Colocated vLLM: one data-parallel deployment; node 0 serves it, others run headless."""
    assert fronts == [] and len(servers) == num_nodes
    head, *others = servers
    assert head.cmd.node == 0 and head.listens and all(not s.listens for s in others)
    rank = 0
    for s in servers:
        assert s.args.data_parallel_size == config.num_replicas
        assert s.args.data_parallel_start_rank == rank
        rank += s.num_engines
        if num_nodes > 1:
            assert s.args.data_parallel_address == host(0, num_nodes)
            assert s.args.data_parallel_rpc_port == head.args.data_parallel_rpc_port
    assert rank == config.num_replicas


def check_vllm_pd(
    servers: list[Process],
    fronts: list[Process],
    address: dict[LaunchCommand, tuple[str, int]],
    num_nodes: int,
) -> None:
    (proxy,) = fronts
    assert proxy.program == "vllm-proxy"
    side_ports = []
    for s in servers:
        kv = s.args.kv_transfer_config
        want = "kv_producer" if s.cmd.role == "prefill" else "kv_consumer"
        assert kv == {"kv_connector": "NixlConnector", "kv_role": want}
        # one instance per server: its own dp ranks (a MoE's; 1 for a dense model), checked
        # against the instance in check_moe_split
        assert s.args.data_parallel_size_local is None
        base = int(s.env["VLLM_NIXL_SIDE_CHANNEL_PORT"])
        # Whether vLLM adds the TP rank or the DP rank to the base, ports stay apart.
        side_ports += [(s.cmd.node, base + r) for r in range(s.tp * s.num_engines)]
        if num_nodes > 1:
            assert s.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == host(s.cmd.node, num_nodes)
        else:
            assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in s.env
    assert len(set(side_ports)) == len(side_ports)
    a = proxy.args
    for role, hosts, ports in (
        ("prefill", a.prefiller_hosts, a.prefiller_ports),
        ("decode", a.decoder_hosts, a.decoder_ports),
    ):
        want = [address[s.cmd] for s in servers if s.cmd.role == role]
        assert list(zip(hosts, ports, strict=True)) == want


def check_sglang_pd(
    servers: list[Process], fronts: list[Process], address: dict[LaunchCommand, tuple[str, int]]
) -> None:
    (router,) = fronts
    assert router.program == "sglang-router" and router.args.pd_disaggregation
    bootstrap = [(s.cmd.node, s.args.disaggregation_bootstrap_port) for s in servers
                 if s.cmd.role == "prefill"]  # fmt: skip
    assert len(set(bootstrap)) == len(bootstrap)
    prefill, decode = [], []
    for s in servers:
        assert s.args.disaggregation_mode == s.cmd.role
        assert s.args.disaggregation_transfer_backend == "nixl"
        h, port = address[s.cmd]
        if s.cmd.role == "prefill":
            prefill.append([f"http://{h}:{port}", str(s.args.disaggregation_bootstrap_port)])
        else:
            decode.append([f"http://{h}:{port}"])
    assert router.args.prefill == prefill and router.args.decode == decode


EAGLE = SpeculationConfig(method=SpecMethod.EAGLE, num_speculative_tokens=3)
DRAFT = SpeculationConfig(
    method=SpecMethod.DRAFT, num_speculative_tokens=4, draft_model="llama-3.2-1b"
)
NGRAM = SpeculationConfig(method=SpecMethod.NGRAM, num_speculative_tokens=2)
MODEL = "llama-3.1-8b"

# replicas x TP
COLOCATED = {
    f"{n}x tp{tp}": ServingConfig.colocated(MODEL, InstanceConfig(tp=tp), num_replicas=n)
    for n, tp in ((1, 1), (1, 2), (1, 4), (1, 8), (2, 1), (3, 1), (8, 1), (2, 2), (3, 2),
                  (4, 2), (2, 4), (6, 2), (3, 4), (2, 8), (9, 1))
}  # fmt: skip
# prefill:decode, prefill TP/decode TP
DISAGGREGATED = {
    f"{p}P{d}D tp{ptp}/{dtp}": ServingConfig.disaggregated(
        MODEL, InstanceConfig(tp=ptp), InstanceConfig(tp=dtp), num_prefill=p, num_decode=d
    )
    for p, d, ptp, dtp in ((1, 1, 1, 1), (2, 1, 2, 2), (1, 2, 2, 2), (2, 6, 1, 1),
                           (3, 1, 2, 4), (4, 4, 2, 2), (1, 3, 4, 2))
}  # fmt: skip
OTHER = {
    "eagle 2x tp2": ServingConfig.colocated(MODEL, InstanceConfig(tp=2), 2, speculation=EAGLE),
    "draft 3x tp1": ServingConfig.colocated(MODEL, InstanceConfig(), 3, speculation=DRAFT),
    "eagle 2P1D tp2": ServingConfig.disaggregated(
        MODEL, InstanceConfig(tp=2), InstanceConfig(tp=2), 2, 1, speculation=EAGLE
    ),
    "ngram 1P2D": ServingConfig.disaggregated(
        MODEL, InstanceConfig(), InstanceConfig(), 1, 2, speculation=NGRAM
    ),
    "h100 prefill, a100 decode": ServingConfig.disaggregated(
        MODEL, InstanceConfig(tp=1), InstanceConfig(tp=2, accelerator="a100"), 2, 1
    ),
    "least outstanding tokens": ServingConfig.colocated(
        MODEL,
        InstanceConfig(),
        2,
        routing=RoutingPolicy.LEAST_OUTSTANDING_TOKENS,
        enable_prefix_caching=True,
    ),
    "fp8, no chunking": ServingConfig.colocated(
        MODEL,
        InstanceConfig(enable_chunked_prefill=False),
        2,
        quantization="fp8",
        kv_cache_dtype="fp8",
    ),
}
ALL = {**COLOCATED, **DISAGGREGATED, **OTHER}


@pytest.mark.parametrize("name", list(ALL))
def test_every_command_parses_and_the_deployment_holds_together(name: str) -> None:
    config = ALL[name]
    check_deployment(config, launch_commands(config))


def test_an_unknown_flag_fails_the_parse() -> None:
    cmd = LaunchCommand("vllm", "replica", 1, "vllm serve m --tensor-parallel 2")
    with pytest.raises(ValueError, match="unrecognized arguments"):
        parse(cmd)


def test_two_replica_colocated_commands() -> None:
    cfg = ServingConfig.colocated(MODEL, InstanceConfig(tp=2, max_num_seqs=128), 2)
    vllm, sg0, sg1, router = launch_commands(cfg)
    tuned = (
        "--tensor-parallel-size 2 --max-num-batched-tokens 8192 --max-num-seqs 128 "
        "--enable-chunked-prefill --gpu-memory-utilization 0.9 --block-size 16 "
        "--no-enable-prefix-caching"
    )
    assert vllm.command == (
        "CUDA_VISIBLE_DEVICES=0,1,2,3 vllm serve meta-llama/Llama-3.1-8B-Instruct --port 8000 "
        f"--data-parallel-size 2 {tuned}"
    )
    assert "2 replicas of TP 2 as one data-parallel deployment" in vllm.note
    server = (
        "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct "
        "--port {port} --tp-size 2 --chunked-prefill-size 8192 --max-prefill-tokens 8192 "
        "--max-running-requests 128 --mem-fraction-static 0.9 --disable-radix-cache"
    )
    assert sg0.command == "CUDA_VISIBLE_DEVICES=0,1 " + server.format(port=30000)
    assert sg1.command == "CUDA_VISIBLE_DEVICES=2,3 " + server.format(port=30001)
    assert router.command == (
        "python -m sglang_router.launch_router --host 0.0.0.0 --port 8000 --worker-urls "
        "http://127.0.0.1:30000 http://127.0.0.1:30001 --policy round_robin"
    )


def test_two_prefill_one_decode_commands() -> None:
    cfg = ServingConfig.disaggregated(MODEL, InstanceConfig(tp=2), InstanceConfig(tp=2), 2, 1)
    cmds = launch_commands(cfg)
    vllm = [c.command for c in cmds if c.engine == "vllm"]
    kv = """--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_%s"}'"""
    assert [c.split(" vllm serve ")[0] for c in vllm[:3]] == [
        "CUDA_VISIBLE_DEVICES=0,1 VLLM_NIXL_SIDE_CHANNEL_PORT=5600",
        "CUDA_VISIBLE_DEVICES=2,3 VLLM_NIXL_SIDE_CHANNEL_PORT=5602",
        "CUDA_VISIBLE_DEVICES=4,5 VLLM_NIXL_SIDE_CHANNEL_PORT=5604",
    ]
    assert [c.split(" --tensor-parallel-size")[0].split()[-1] for c in vllm[:3]] == [
        "8000", "8001", "8002"
    ]  # fmt: skip
    assert vllm[0].endswith(kv % "producer") and vllm[2].endswith(kv % "consumer")
    assert vllm[3] == (
        f"python {VLLM_PD_PROXY} --host 0.0.0.0 --port 8192 --prefiller-hosts 127.0.0.1 "
        "127.0.0.1 --prefiller-ports 8000 8001 --decoder-hosts 127.0.0.1 --decoder-ports 8002"
    )
    sglang = [c.command for c in cmds if c.engine == "sglang"]
    assert sglang[0].endswith(
        "--disaggregation-mode prefill --disaggregation-transfer-backend nixl "
        "--disaggregation-bootstrap-port 8998"
    )
    assert sglang[3] == (
        "python -m sglang_router.launch_router --host 0.0.0.0 --port 8000 --pd-disaggregation "
        "--prefill http://127.0.0.1:30000 8998 --prefill http://127.0.0.1:30001 8999 "
        "--decode http://127.0.0.1:30002 --policy round_robin"
    )


def test_more_than_a_node_says_which_node_runs_what() -> None:
    cfg = ServingConfig.colocated(MODEL, InstanceConfig(tp=4), 3)
    cmds = launch_commands(cfg)
    vllm = [c for c in cmds if c.engine == "vllm"]
    assert [(c.node, c.accelerator) for c in vllm] == [(0, "h100"), (1, "h100")]
    assert "export NODE_0_HOST, NODE_1_HOST" in vllm[0].note
    assert vllm[1].note.startswith("rank 2 of the deployment")
    assert Counter(c.node for c in cmds if c.engine == "sglang" and c.role == "replica") == {
        0: 2, 1: 1
    }  # fmt: skip
    # Fewer GPUs per node: the same fleet spreads wider.
    small = launch_commands(cfg, gpus_per_node=4)
    assert [c.node for c in small if c.engine == "vllm"] == [0, 1, 2]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_shell_runs_the_lines_as_written() -> None:
    """bash, not shlex: assignments stay assignments, node addresses expand, JSON survives."""
    cfg = ServingConfig.disaggregated(
        MODEL, InstanceConfig(tp=4), InstanceConfig(tp=4, accelerator="a100"), 2, 2,
        speculation=EAGLE,
    )  # fmt: skip
    cmds = [c for c in launch_commands(cfg) if c.engine == "vllm"]
    stub = (
        "export NODE_0_HOST=10.0.0.1 NODE_1_HOST=10.0.0.2\n"
        'vllm() { printf "%s\\n" "$CUDA_VISIBLE_DEVICES" "$VLLM_NIXL_SIDE_CHANNEL_HOST" "$@"; }\n'
        'python() { printf "%s\\n" "$@"; }\n'
    )
    for c in cmds:
        out = subprocess.run(["bash", "-c", stub + c.command], capture_output=True, text=True,
                             check=True).stdout.splitlines()  # fmt: skip
        if c.role == "proxy":
            assert out[out.index("--decoder-hosts") + 1] == "10.0.0.2"
            continue
        gpus, side_host, *argv = out
        assert gpus in ("0,1,2,3", "4,5,6,7")
        assert side_host == ("10.0.0.1" if c.node == 0 else "10.0.0.2")
        config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert config["kv_connector"] == "NixlConnector"
        if c.role == "decode":
            spec = json.loads(argv[argv.index("--speculative-config") + 1])
            assert spec["num_speculative_tokens"] == 3


def test_tp_beyond_a_node_is_flagged_not_laid_out() -> None:
    cfg = ServingConfig.colocated("llama-3.1-70b", InstanceConfig(tp=16), 2)
    first = launch_commands(cfg)[0]
    assert "a TP 16 instance needs more than one 8-GPU node" in first.note
