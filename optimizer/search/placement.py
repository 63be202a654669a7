"""Where each server of a deployment runs: nodes of `gpus_per_node` GPUs (8 unless told),
each GPU numbered 0..N-1 on its node; a node holds one GPU type, and instances are
packed in config order (prefill before decode), first fit, never sharing a GPU.
`optimizer.search.flags` turns the placements into launch commands."""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.config import InstanceConfig, Role, ServingConfig

GPUS_PER_NODE = 8


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one server (an engine instance: a replica, or a prefill or decode server) runs."""

    role: Role
    instance: InstanceConfig
    node: int
    gpus: tuple[int, ...]  # its GPUs on that node (tp x dp)
    slot: int  # its position among the node's servers: its port is the first port + slot


@dataclass(slots=True)
class _Node:
    accelerator: str
    used: int = 0  # GPUs handed out, from 0 up
    servers: int = 0


def node_size(config: ServingConfig, gpus_per_node: int = GPUS_PER_NODE) -> int:
    """GPUs per node in the layout: `gpus_per_node`, or an instance's GPUs (tp x dp) when
    that is larger (an instance spanning nodes is not laid out; the commands say so)."""
    return max(gpus_per_node, *(p.instance.num_gpus for p in config.roles()))


def place(config: ServingConfig, gpus_per_node: int = GPUS_PER_NODE) -> tuple[Placement, ...]:
    """Every server of `config` on a node (first fit, in config order): GPUs never shared,
    a node holding one GPU type."""
    size = node_size(config, gpus_per_node)
    nodes: list[_Node] = []
    out = []
    for plan in config.roles():
        inst = plan.instance
        for _ in range(plan.count):
            i = next(
                (
                    i
                    for i, n in enumerate(nodes)
                    if n.accelerator == inst.accelerator and size - n.used >= inst.num_gpus
                ),
                None,
            )
            if i is None:
                nodes.append(_Node(inst.accelerator))
                i = len(nodes) - 1
            node = nodes[i]
            gpus = tuple(range(node.used, node.used + inst.num_gpus))
            out.append(Placement(plan.role, inst, i, gpus, node.servers))
            node.used += inst.num_gpus
            node.servers += 1
    return tuple(out)
