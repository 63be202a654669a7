"""Per-GPU memory: what is left for the KV cache, as vLLM computes it (DOMAIN.md §3, §10).

vLLM (v1 `gpu_worker.determine_available_memory`) gives the KV cache

    total_memory x gpu_memory_utilization
      - weights - peak activation of the profile run - non-torch memory

where `total_memory` is what the device reports (`torch.cuda.mem_get_info`: 79.2
GiB on an "80 GB" H100, `optimizer.hardware`), the weights are what the checkpoint
holds per GPU (linear layers at their quantised width; a drafter's too), the
profile run is one forward of `max_num_batched_tokens` tokens followed by the
sampler on `max_num_seqs` rows (their peaks do not add: the forward's
activations are freed before sampling), and non-torch memory is the CUDA
context's and libraries' growth after start-up. CUDA graphs are captured after
the KV cache is sized, out of the `1 - gpu_memory_utilization` headroom (vLLM
before 0.21; later versions subtract an estimate, ~0.1-0.5 GiB, not modelled).

Mixture-of-experts instances (`optimizer.parallel`): an instance of tp x dp GPUs holds
its experts sharded over all tp x dp GPUs and the rest split by tp
(`weight_bytes_per_gpu`); each of its dp ranks has its own KV cache, so
`kv_capacity_blocks` is per rank (the whole instance when dp is 1).

Gated DeltaNet models (`ModelShape.gdn`): the full-attention layers' KV and the GDN
layers' fixed per-sequence state share one pool, as in vLLM's hybrid KV-cache manager;
a block is `block_size` tokens of the full layers' KV, and every running sequence also
holds `state_blocks_per_sequence` blocks for its state. (vLLM instead enlarges the
attention block until one page holds a layer's state, some 1,000 tokens for Qwen3.5,
and gives each group of GDN layers one page a sequence; the bytes are the same, the
coarser rounding of the KV is not modelled.)

Checked against vLLM's own logs in tests/optimizer_tests/test_memory.py
(Llama-3-8B and Qwen3-0.6B on H100 and A100; within 4%).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from optimizer.hardware import Accelerator
from optimizer.parallel import ExpertLayout
from optimizer.shapes import ModelShape

GIB = 1024**3
# CUDA context and library workspaces (cuBLAS, attention backends) that grow after
# start-up: vLLM logs 0.16-0.35 GiB for one GPU with the v1 accounting (1.79 GiB in a
# v0 log of Dec 2024, which also counted NCCL's buffers).
NON_TORCH_BYTES = int(0.4 * GIB)
LOGIT_BYTES = 4  # the sampler works on fp32 logits


class EngineLimits(Protocol):
    """What memory depends on of one instance's engine settings (`InstanceConfig`)."""

    tp: int
    max_num_batched_tokens: int
    max_num_seqs: int
    gpu_memory_utilization: float
    block_size: int

    @property
    def layout(self) -> ExpertLayout: ...

    def resolve_accelerator(self, where: str = ...) -> Accelerator: ...


def weight_bytes_per_gpu(shape: ModelShape, tp: int, layout: ExpertLayout) -> int:
    """Weights one GPU of an instance holds: `ModelShape.weight_bytes(tp, layout)` (experts
    sharded over tp x dp GPUs, the rest split by tp)."""
    return shape.weight_bytes(tp, layout)


def forward_activation_bytes(shape: ModelShape, num_tokens: int, tp: int) -> int:
    """Peak activations of one forward over `num_tokens` tokens on one GPU: the MLP's
    gate/up output and its activation (3f/tp values per token) beside three hidden-size
    buffers (residual, normed input, attention output)."""
    per_token = 3 * shape.intermediate_size // tp + 3 * shape.hidden_size
    return num_tokens * per_token * shape.dtype_bytes


def sampler_bytes(shape: ModelShape, num_seqs: int, tp: int) -> int:
    """fp32 logits of `num_seqs` rows (vocabulary-parallel: 1/tp of the vocabulary)."""
    return num_seqs * -(-shape.vocab_size // tp) * LOGIT_BYTES


def activation_reserve_bytes(shape: ModelShape, inst: EngineLimits) -> int:
    """Per-GPU memory vLLM keeps out of the KV cache besides the weights: the profile
    run's peak (the larger of the forward and the sampler) plus non-torch memory."""
    peak = max(
        forward_activation_bytes(shape, inst.max_num_batched_tokens, inst.tp),
        sampler_bytes(shape, inst.max_num_seqs, inst.tp),
    )
    return peak + NON_TORCH_BYTES


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
    (about 0.4 B parameters for Llama-3.1-8B); its KV is one full-attention layer's."""
    h, kv = shape.hidden_size, shape.num_kv_heads * shape.head_dim
    layer = h * shape.num_heads * shape.head_dim * 2 + h * kv * 2 + 3 * h * shape.intermediate_size
    params = layer + 3 * h * h + EAGLE_DRAFT_VOCAB * h
    kv_per_token = shape.kv_bytes_per_token(tp) // shape.num_full_attention_layers
    return DraftFootprint(params * shape.dtype_bytes // tp, kv_per_token)


def kv_cache_bytes(
    shape: ModelShape,
    inst: EngineLimits,
    draft: DraftFootprint | None = None,
    total_bytes: float | None = None,
) -> float:
    """Per-GPU bytes vLLM gives the KV cache (module docstring; may be negative: the model
    does not fit). `total_bytes`: the device's memory (default: the accelerator's)."""
    total = inst.resolve_accelerator().hbm_bytes if total_bytes is None else total_bytes
    weights = weight_bytes_per_gpu(shape, inst.tp, inst.layout)
    free = total * inst.gpu_memory_utilization - weights
    free -= activation_reserve_bytes(shape, inst)
    if draft is not None:
        free -= draft.weight_bytes
    return free


def kv_capacity_blocks(
    shape: ModelShape,
    inst: EngineLimits,
    draft: DraftFootprint | None = None,
    total_bytes: float | None = None,
) -> int:
    """KV blocks per instance, or per DP rank of a MoE instance (each rank's tp GPUs hold
    its own cache; DOMAIN.md §3); <= 0 when the model does not fit.
    `draft`: a speculative drafter sharing the GPU (its weights, and its KV in each block)."""
    free = kv_cache_bytes(shape, inst, draft, total_bytes)
    return max(0, int(free // kv_block_bytes(shape, inst, draft)))


def kv_block_bytes(shape: ModelShape, inst: EngineLimits, draft: DraftFootprint | None) -> int:
    """Bytes of one KV block on one GPU: `block_size` tokens of the model's (and the
    drafter's) KV."""
    per_token = shape.kv_bytes_per_token(inst.tp)
    if draft is not None:
        per_token += draft.kv_bytes_per_token
    return per_token * inst.block_size


def state_blocks_per_sequence(
    shape: ModelShape, inst: EngineLimits, draft: DraftFootprint | None = None
) -> int:
    """Blocks every running sequence holds for its fixed Gated DeltaNet state (module
    docstring): ceil(state bytes / block bytes); 0 for a model without GDN layers."""
    state = shape.gdn_state_bytes_per_sequence(inst.tp)
    return -(-state // kv_block_bytes(shape, inst, draft)) if state else 0
