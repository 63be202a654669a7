"""Per-GPU memory: what is left for the KV cache once weights and reserves are counted
(DOMAIN.md §3, §10).
"""

from __future__ import annotations

from typing import Protocol

from optimizer.hardware import Accelerator
from optimizer.shapes import ModelShape

GIB = 1024**3
# Fixed per-GPU reserve (CUDA context, CUDA graphs, allocator slack) on top of activations.
FIXED_RESERVE_BYTES = int(0.5 * GIB)


class EngineLimits(Protocol):
    """What memory depends on of one instance's engine settings (`InstanceConfig`)."""

    tp: int
    max_num_batched_tokens: int
    max_num_seqs: int
    gpu_memory_utilization: float
    block_size: int

    def resolve_accelerator(self, where: str = ...) -> Accelerator: ...


def activation_reserve_bytes(shape: ModelShape, inst: EngineLimits) -> int:
    """Estimated per-GPU memory kept for activations, logits and the runtime (not for KV).

    A step of `max_num_batched_tokens` tokens holds roughly a residual stream,
    QKV and the gated-MLP intermediate (`4h + 2f/tp` values per token), plus fp32
    logits for `max_num_seqs` rows, plus a fixed 0.5 GiB (CUDA context, graphs).
    """
    t = inst.max_num_batched_tokens
    per_token = 4 * shape.hidden_size + 2 * shape.intermediate_size // inst.tp
    logits = inst.max_num_seqs * (shape.vocab_size // inst.tp) * 4
    return FIXED_RESERVE_BYTES + t * per_token * shape.dtype_bytes + logits


def kv_capacity_blocks(
    shape: ModelShape, inst: EngineLimits, draft: ModelShape | None = None
) -> int:
    """KV blocks per instance (DOMAIN.md §3); <= 0 when the model does not fit.
    `draft`: a draft model whose weights share the GPU."""
    acc = inst.resolve_accelerator()
    free = acc.hbm_bytes * inst.gpu_memory_utilization - shape.weight_bytes(inst.tp)
    free -= activation_reserve_bytes(shape, inst)
    if draft is not None:
        free -= draft.weight_bytes(inst.tp)
    per_block = shape.kv_bytes_per_token(inst.tp) * inst.block_size
    return max(0, int(free // per_block))
