"""Per-GPU memory: what is left for the KV cache once weights and reserves are counted
(DOMAIN.md §3, §10).
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class DraftFootprint:
    """What a speculative drafter adds per GPU: its weights, and its KV per token (vLLM keeps
    the draft's KV in the same blocks as the target's, so a block holds both)."""

    weight_bytes: int
    kv_bytes_per_token: int


# EAGLE-3 heads draft from a reduced vocabulary (32k rows for the Llama-3 heads).
EAGLE_DRAFT_VOCAB = 32_000


def draft_model_footprint(draft: ModelShape, tp: int) -> DraftFootprint:
    """A separate draft model on the same GPUs, at the target's TP degree."""
    return DraftFootprint(draft.weight_bytes(tp), draft.kv_bytes_per_token(tp))


def eagle_head_footprint(shape: ModelShape, tp: int) -> DraftFootprint:
    """An EAGLE-3 head for `shape`: one decoder layer of the target's dimensions, the fusion
    of three hidden states (3h x h) and a draft LM head over `EAGLE_DRAFT_VOCAB` tokens
    (about 0.4 B parameters for Llama-3.1-8B); its KV is one layer's."""
    h, kv = shape.hidden_size, shape.num_kv_heads * shape.head_dim
    layer = h * shape.num_heads * shape.head_dim * 2 + h * kv * 2 + 3 * h * shape.intermediate_size
    params = layer + 3 * h * h + EAGLE_DRAFT_VOCAB * h
    kv_per_token = shape.kv_bytes_per_token(tp) // shape.num_layers
    return DraftFootprint(params * shape.dtype_bytes // tp, kv_per_token)


def kv_capacity_blocks(
    shape: ModelShape, inst: EngineLimits, draft: DraftFootprint | None = None
) -> int:
    """KV blocks per instance (DOMAIN.md §3); <= 0 when the model does not fit.
    `draft`: a speculative drafter sharing the GPU (its weights, and its KV in each block)."""
    acc = inst.resolve_accelerator()
    free = acc.hbm_bytes * inst.gpu_memory_utilization - shape.weight_bytes(inst.tp)
    free -= activation_reserve_bytes(shape, inst)
    per_token = shape.kv_bytes_per_token(inst.tp)
    if draft is not None:
        free -= draft.weight_bytes
        per_token += draft.kv_bytes_per_token
    return max(0, int(free // (per_token * inst.block_size)))
