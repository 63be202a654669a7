"""Launch commands users paste: vLLM and SGLang flags for a `ServingConfig` (DOMAIN.md §5),
laid out on nodes so that every command runs as pasted.

Layout. Servers are placed on nodes of `gpus_per_node` GPUs (the accelerator's host size,
`Accelerator.num_gpus_per_node`: 8, or 4 for GB200/GB300, unless told), each GPU
numbered 0..N-1 on its node; a node holds one GPU type, and instances are packed in
config order (prefill before decode), first fit. Every server gets its own
`CUDA_VISIBLE_DEVICES` range of exactly its TP and its own port on its node (vLLM from
8000, SGLang from 30000). On one node every address is 127.0.0.1; across nodes it is
`${NODE_<i>_HOST}`, expanded by the shell where each node's address is exported.

Colocated replicas, vLLM: one `vllm serve --data-parallel-size N --tensor-parallel-size
T` per node. vLLM documents this for dense models as N independent engines behind one
API endpoint that balances on each engine's queues ("internal load balancing"), and
`--max-num-seqs` and the KV cache stay per replica as simulated; a node that is not the
first runs `--headless` with its share of the ranks. It needs no router, which vLLM does
not ship. SGLang: one server per replica behind `sglang_router.launch_router`, the form
SGLang recommends for data parallelism; `--dp-size` cannot span nodes for a dense model,
and the router's `round_robin` policy is the simulated routing.

A MoE model's instance has tp x dp GPUs (`optimizer.search.engine_args` has its flags);
its colocated replicas are one vLLM server each (vLLM would shard the experts over every
data-parallel rank of one deployment), behind a load balancer of the user's.

Disaggregated: one server per instance with the KV-transfer settings (vLLM:
NixlConnector producer/consumer, each with a distinct `VLLM_NIXL_SIDE_CHANNEL_PORT`, its
node's first port plus the instance's first GPU so that per-rank ports never overlap;
SGLang: `--disaggregation-mode` with the NIXL backend and a distinct bootstrap port per
prefill server), then the proxy or router naming every server's address. vLLM ships no
production PD router: its command is the reference proxy from the vLLM repository
(`tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`, as in vLLM's NixlConnector
guide); put your own router in its place at scale.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from enum import StrEnum

from optimizer.config import (
    Role,
    RoutingPolicy,
    ServingConfig,
    ServingMode,
)
from optimizer.hardware import get_accelerator
from optimizer.search.engine_args import sglang_args, vllm_args
from optimizer.search.placement import Placement, node_size, place
from optimizer.shapes import HF_IDS

VLLM_PD_PROXY = "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"
# First server port on each node: the engines' default serving ports.
VLLM_PORT, SGLANG_PORT = 8000, 30000
# Client-facing front ends: vLLM's PD proxy (as in its NixlConnector guide) and SGLang's
# router (as in its PD guide; its own default, 30000, is the first server's).
VLLM_PROXY_PORT, SGLANG_ROUTER_PORT = 8192, 8000
NIXL_SIDE_CHANNEL_PORT = 5600  # vLLM's default VLLM_NIXL_SIDE_CHANNEL_PORT
SGLANG_BOOTSTRAP_PORT = 8998  # SGLang's default --disaggregation-bootstrap-port
VLLM_DP_RPC_PORT = 13345  # --data-parallel-rpc-port across nodes (vLLM's docs' example)
LOCALHOST = "127.0.0.1"  # not "localhost": it may resolve to IPv6, which servers don't bind
ALL_INTERFACES = "0.0.0.0"


class Engine(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    """One process to start, on `node`. `command` is a shell line: leading `NAME=value`
    assignments (`CUDA_VISIBLE_DEVICES`, ...) then the program and its arguments."""

    engine: Engine
    role: str  # "replica" | "prefill" | "decode" | "proxy" (a PD proxy or a router)
    # Times the command is run: 1 for every command built today. Documents stored before
    # commands were laid out on nodes hold one command per role, run `count` times.
    count: int
    command: str
    note: str = ""  # what a person must know to run it (defaults relied on, order, addresses)
    node: int = 0  # the node it runs on (0-based); GPUs are numbered 0..N-1 on each node
    accelerator: str = ""  # the node's GPU type; "" for a proxy or router (it needs none)


def model_id(config: ServingConfig, override: str | None = None) -> str:
    return override or HF_IDS.get(config.model.lower(), config.model)


def _quote(part: str) -> str:
    # A node address is a shell variable the user exports: double quotes let it expand.
    return f'"{part}"' if "${NODE_" in part else shlex.quote(part)


def _line(env: dict[str, str], argv: list[str]) -> str:
    """A shell line: `NAME=value` assignments (names unquoted, so the shell sees them as
    assignments), then the command."""
    return " ".join([*(f"{k}={_quote(v)}" for k, v in env.items()), *map(_quote, argv)])


@dataclass(frozen=True, slots=True)
class _Layout:
    config: ServingConfig
    model: str
    draft_model: str | None
    placements: tuple[Placement, ...]
    accelerators: tuple[str, ...]  # per node
    node_note: str  # said once per engine: addresses to export, nodes larger than asked

    @property
    def multi_node(self) -> bool:
        return len(self.accelerators) > 1

    def host(self, node: int) -> str:
        """The address other processes reach a server on `node` at."""
        return f"${{NODE_{node}_HOST}}" if self.multi_node else LOCALHOST

    def gpus(self, p: Placement) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, p.gpus))}

    def server(self, engine: Engine, p: Placement, env: dict[str, str], argv: list[str],
               note: str = "") -> LaunchCommand:  # fmt: skip
        return LaunchCommand(engine, p.role.value, 1, _line(env, argv), note, p.node,
                             self.accelerators[p.node])  # fmt: skip


def _layout(
    config: ServingConfig, model: str, draft_model: str | None, gpus_per_node: int
) -> _Layout:
    placements = place(config, gpus_per_node)
    accelerators: dict[int, str] = {}
    for p in placements:
        accelerators.setdefault(p.node, p.instance.accelerator)
    num_nodes = len(accelerators)
    notes = []
    if num_nodes > 1:
        names = ", ".join(f"NODE_{i}_HOST" for i in range(num_nodes))
        notes.append(
            f"{num_nodes} nodes: export {names} (each node's address) in the shell on every "
            "node, then run each command on the node it names"
        )
    size = node_size(config, gpus_per_node)
    if size > gpus_per_node:
        dense = all(p.instance.dp == 1 for p in config.roles())
        what = f"a TP {size} instance" if dense else f"a {size}-GPU (tp x dp) instance"
        notes.append(
            f"{what} needs more than one {gpus_per_node}-GPU node: this layout "
            f"assumes {size}-GPU nodes; span nodes with the engine's multi-node setup"
        )
    return _Layout(config, model, draft_model, placements,
                   tuple(accelerators[i] for i in range(num_nodes)), "; ".join(notes))  # fmt: skip


def _join_notes(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def _vllm_colocated(lay: _Layout) -> list[LaunchCommand]:
    """One data-parallel server per node: vLLM's API server on node 0 balances requests over
    every replica (engine); other nodes run their ranks headless."""
    config = lay.config
    assert config.replica is not None
    n, tp = config.num_replicas, config.replica.tp
    args = vllm_args(config, config.replica, speculate=True, draft_model=lay.draft_model)
    by_node: dict[int, list[Placement]] = {}
    for p in lay.placements:
        by_node.setdefault(p.node, []).append(p)
    out = []
    start_rank = 0
    for node, replicas in by_node.items():
        env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for p in replicas for g in p.gpus)}
        serve = ["--headless"] if node else ["--port", str(VLLM_PORT)]
        dp = ["--data-parallel-size", str(n)] if n > 1 else []
        if lay.multi_node:
            dp += ["--data-parallel-size-local", str(len(replicas))]
            if node:
                dp += ["--data-parallel-start-rank", str(start_rank)]
            dp += ["--data-parallel-address", lay.host(0)]
            dp += ["--data-parallel-rpc-port", str(VLLM_DP_RPC_PORT)]
        note = ""
        if node == 0 and n > 1:
            note = (
                f"{n} replicas of TP {tp} as one data-parallel deployment behind one endpoint "
                "(vLLM balances requests over them; max-num-seqs and the KV cache are per "
                "replica)"
            )
        elif node:
            last = start_rank + len(replicas) - 1
            ranks = f"rank {last}" if last == start_rank else f"ranks {start_rank}-{last}"
            note = f"{ranks} of the deployment; node 0 serves their requests"
        if node == 0:
            note = _join_notes(lay.node_note, note)
        argv = ["vllm", "serve", lay.model, *serve, *dp, *args]
        out.append(lay.server(Engine.VLLM, replicas[0], env, argv, note))
        start_rank += len(replicas)
    return out


def _vllm_moe_colocated(lay: _Layout) -> list[LaunchCommand]:
    """A MoE model: one server per replica on its own port. Its --data-parallel-size is the
    replica's own dp ranks (in lockstep, sharing the experts): vLLM shards a MoE's experts
    over every rank of one deployment, so replicas cannot be its data-parallel ranks."""
    config = lay.config
    n = config.num_replicas
    out = []
    for i, p in enumerate(lay.placements):
        args = vllm_args(config, p.instance, speculate=True, draft_model=lay.draft_model)
        argv = ["vllm", "serve", lay.model, "--port", str(VLLM_PORT + p.slot), *args]
        note = ""
        if i == 0 and n > 1:
            note = (
                f"{n} independent servers of this MoE model, one per replica: put a "
                "round-robin load balancer in front of their ports (vLLM ships none)"
            )
        if i == 0:
            note = _join_notes(lay.node_note, note)
        out.append(lay.server(Engine.VLLM, p, lay.gpus(p), argv, note))
    return out


def _vllm_disaggregated(lay: _Layout) -> list[LaunchCommand]:
    out = []
    hosts: dict[Role, list[tuple[str, int]]] = {Role.PREFILL: [], Role.DECODE: []}
    for i, p in enumerate(lay.placements):
        args = vllm_args(lay.config, p.instance, speculate=p.role is Role.DECODE,
                          draft_model=lay.draft_model)  # fmt: skip
        kv_role = "kv_producer" if p.role is Role.PREFILL else "kv_consumer"
        kv = {"kv_connector": "NixlConnector", "kv_role": kv_role}
        env = lay.gpus(p)
        # Each TP rank of an instance takes a side-channel port from this base up (older
        # vLLM: base + TP rank; newer: base + DP rank): offsetting by the first GPU keeps
        # the instances on a node apart under either rule.
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(NIXL_SIDE_CHANNEL_PORT + p.gpus[0])
        if lay.multi_node:  # what the decode side dials back; vLLM's default is localhost
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = lay.host(p.node)
        port = VLLM_PORT + p.slot
        argv = ["vllm", "serve", lay.model, "--port", str(port), *args,
                "--kv-transfer-config", json.dumps(kv, separators=(",", ":"))]  # fmt: skip
        out.append(lay.server(Engine.VLLM, p, env, argv, lay.node_note if i == 0 else ""))
        hosts[p.role].append((lay.host(p.node), port))
    proxy = ["python", VLLM_PD_PROXY, "--host", ALL_INTERFACES, "--port", str(VLLM_PROXY_PORT)]
    for flag, role in (("prefiller", Role.PREFILL), ("decoder", Role.DECODE)):
        proxy += [f"--{flag}-hosts", *(h for h, _ in hosts[role])]
        proxy += [f"--{flag}-ports", *(str(port) for _, port in hosts[role])]
    note = (
        "vLLM's reference PD proxy (round robin over each role): run it from a vLLM source "
        "checkout once the servers are up"
    )
    out.append(LaunchCommand(Engine.VLLM, "proxy", 1, _line({}, proxy), note))
    return out


def _sglang_commands(lay: _Layout) -> list[LaunchCommand]:
    """One server per instance, then the router when there is more than one server."""
    config = lay.config
    pd = config.mode is ServingMode.DISAGGREGATED
    single = len(lay.placements) == 1
    out = []
    workers: list[str] = []
    router_pd: list[str] = []
    for i, p in enumerate(lay.placements):
        args = sglang_args(config, p.instance, speculate=p.role is not Role.PREFILL,
                            draft_model=lay.draft_model)  # fmt: skip
        # SGLang binds 127.0.0.1 unless told: a lone server faces clients, and a router on
        # another node must reach the servers.
        bind = ["--host", ALL_INTERFACES] if single or lay.multi_node else []
        port = SGLANG_PORT + p.slot
        argv = ["python", "-m", "sglang.launch_server", "--model-path", lay.model, *bind,
                "--port", str(port), *args]  # fmt: skip
        url = f"http://{lay.host(p.node)}:{port}"
        if pd:
            argv += ["--disaggregation-mode", p.role.value,
                     "--disaggregation-transfer-backend", "nixl"]  # fmt: skip
            if p.role is Role.PREFILL:
                bootstrap = str(SGLANG_BOOTSTRAP_PORT + p.slot)
                argv += ["--disaggregation-bootstrap-port", bootstrap]
                router_pd += ["--prefill", url, bootstrap]
            else:
                router_pd += ["--decode", url]
        workers.append(url)
        note = ""
        if i == 0:
            radix = ""
            if config.enable_prefix_caching:  # off is --disable-radix-cache; on has no flag
                radix = "radix cache (prefix caching) on: SGLang's default, no flag needed"
            note = _join_notes(lay.node_note, radix)
        out.append(lay.server(Engine.SGLANG, p, lay.gpus(p), argv, note))
    if single:
        return out
    router = ["python", "-m", "sglang_router.launch_router", "--host", ALL_INTERFACES,
              "--port", str(SGLANG_ROUTER_PORT)]  # fmt: skip
    router += ["--pd-disaggregation", *router_pd] if pd else ["--worker-urls", *workers]
    if config.routing is RoutingPolicy.ROUND_ROBIN:  # as simulated; the router's default
        router += ["--policy", "round_robin"]  # is cache-aware
    out.append(LaunchCommand(Engine.SGLANG, "proxy", 1, _line({}, router)))
    return out


def launch_commands(
    config: ServingConfig,
    *,
    model: str | None = None,
    draft_model: str | None = None,
    gpus_per_node: int | None = None,
) -> tuple[LaunchCommand, ...]:
    """The commands of the engine the config is priced as (`ServingConfig.engine`), then
    the other's (run one engine's set, not both; vLLM's and SGLang's), each engine's
    servers before its proxy or router; `model` overrides the Hugging Face id of the shape.
    `gpus_per_node` defaults to the smallest host among the config's accelerators
    (`Accelerator.num_gpus_per_node`: 8, a GB200/GB300 compute tray's 4)."""
    if gpus_per_node is None:
        gpus_per_node = min(
            get_accelerator(p.instance.accelerator).num_gpus_per_node for p in config.roles()
        )
    lay = _layout(config, model_id(config, model), draft_model, gpus_per_node)
    if config.mode is ServingMode.DISAGGREGATED:
        vllm = _vllm_disaggregated(lay)
    elif config.shape.is_moe:
        vllm = _vllm_moe_colocated(lay)
    else:
        vllm = _vllm_colocated(lay)
    sglang = _sglang_commands(lay)
    return (*sglang, *vllm) if config.engine == "sglang" else (*vllm, *sglang)
