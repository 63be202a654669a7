"""A real decoder-only transformer with random weights over a paged KV cache.

The forward runs the very `profiler.kernels` functions the per-operator
profile times (and that `profiler.mixed` composes), so the only differences
between a measured step and the latency model's price are what a real engine
adds: gathering paged KV, masks for ragged batches, input preparation and
sampling. Keys and values live in one pool per layer of `num_blocks *
block_size` slots; a sequence's block table maps its positions to slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from optimizer.shapes import ModelShape
from profiler import kernels
from profiler.reference_engine.batch import DecodeGroup, PrefillSegment, StepBatch
from profiler.weights import LayerWeights, random_weights


@dataclass(frozen=True, slots=True)
class _Layer:
    w: LayerWeights
    k_pool: torch.Tensor  # (slots, g, d)
    v_pool: torch.Tensor  # (slots, g, d)


class PagedTransformer:
    """Random-weight transformer of `shape` with a KV pool of `num_blocks` blocks."""

    def __init__(
        self,
        shape: ModelShape,
        *,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        seed: int = 0,
    ) -> None:
        self.shape = shape
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = device
        dtype = kernels.torch_dtype(shape.dtype)
        g, d = shape.num_kv_heads, shape.head_dim
        slots = num_blocks * block_size
        weights = random_weights(shape, device, torch.Generator().manual_seed(seed))

        def zeros(*size: int) -> torch.Tensor:
            return torch.zeros(*size, device=device, dtype=dtype)

        self.layers = [
            _Layer(w, k_pool=zeros(slots, g, d), v_pool=zeros(slots, g, d)) for w in weights.layers
        ]
        self.table = weights.table  # (V, h)
        self.final_norm = weights.final_norm
        self.head = weights.head  # (V, h)
        self.activation = kernels.silu_and_mul if shape.gated_mlp else kernels.gelu

    @property
    def kv_bytes_per_token(self) -> int:
        s = self.shape
        return 2 * s.num_layers * s.num_kv_heads * s.head_dim * s.dtype_bytes

    # ------------------------------------------------------------------ KV hand-off

    def read_kv(self, slots: torch.Tensor) -> torch.Tensor:
        """KV of `slots` (n,) from every layer: (layers, 2, n, g, d), a fresh tensor."""
        return torch.stack(
            [torch.stack((ly.k_pool[slots], ly.v_pool[slots])) for ly in self.layers]
        )

    def write_kv(self, slots: torch.Tensor, kv: torch.Tensor) -> None:
        """Store a `read_kv` tensor into `slots` (n,)."""
        for i, ly in enumerate(self.layers):
            ly.k_pool.index_copy_(0, slots, kv[i, 0])
            ly.v_pool.index_copy_(0, slots, kv[i, 1])

    # ------------------------------------------------------------------ forward

    def _prefill_attention(self, q: torch.Tensor, ly: _Layer, seg: PrefillSegment) -> torch.Tensor:
        qs = q[seg.row : seg.row + seg.q_len].transpose(0, 1).unsqueeze(0)  # (1, a, q, d)
        k = ly.k_pool[seg.kv_slots].transpose(0, 1).unsqueeze(0)  # (1, g, kv, d)
        v = ly.v_pool[seg.kv_slots].transpose(0, 1).unsqueeze(0)
        o = kernels.prefill_attention(qs, k, v)  # (1, a, q, d)
        return o[0].transpose(0, 1).reshape(seg.q_len, -1)

    def _decode_attention(self, q: torch.Tensor, ly: _Layer, grp: DecodeGroup) -> torch.Tensor:
        b, n = grp.num_seqs, grp.q_len
        rows = b * n
        qs = q[grp.row : grp.row + rows].view(b, n, *q.shape[1:]).transpose(1, 2)  # (B, a, q, d)
        k = ly.k_pool[grp.kv_slots].transpose(1, 2)  # (B, g, kv, d)
        v = ly.v_pool[grp.kv_slots].transpose(1, 2)
        if grp.mask is None:
            o = kernels.decode_attention(qs, k, v)
        else:
            o = torch.nn.functional.scaled_dot_product_attention(
                qs, k, v, attn_mask=grp.mask, enable_gqa=True
            )
        return o.transpose(1, 2).reshape(rows, -1)  # (B·q, a·d)

    def forward(self, batch: StepBatch) -> torch.Tensor:
        """Run one step; returns the logits of `batch.sample_rows`, (m, V)."""
        s = self.shape
        a, g, d = s.num_heads, s.num_kv_heads, s.head_dim
        t = batch.num_tokens
        cos, sin = kernels.rope_tables(batch.positions, d)  # (T, 1, d/2)
        x = kernels.embedding(batch.token_ids, self.table)  # (T, h)
        for ly in self.layers:
            y = kernels.rms_norm(x, ly.w.norm1)
            q, k, v = kernels.gemm(y, ly.w.qkv).split((a * d, g * d, g * d), dim=-1)
            q = kernels.rope(q.view(t, a, d), cos, sin)  # (T, a, d)
            k = kernels.rope(k.view(t, g, d), cos, sin)  # (T, g, d)
            ly.k_pool.index_copy_(0, batch.write_slots, k)
            ly.v_pool.index_copy_(0, batch.write_slots, v.view(t, g, d))
            parts = [self._prefill_attention(q, ly, seg) for seg in batch.prefills]
            parts += [self._decode_attention(q, ly, grp) for grp in batch.decodes]
            y = parts[0] if len(parts) == 1 else torch.cat(parts)  # (T, a·d)
            x = kernels.residual_add(kernels.gemm(y, ly.w.out), x)
            y = kernels.rms_norm(x, ly.w.norm2)
            y = kernels.gemm(self.activation(kernels.gemm(y, ly.w.up)), ly.w.down)
            x = kernels.residual_add(y, x)
        x = kernels.rms_norm(x[batch.sample_rows], self.final_norm)
        return kernels.lm_head(x, self.head)  # (m, V)

    def greedy(self, batch: StepBatch) -> list[int]:
        """Forward, then the arg-max token of every sampled row."""
        with torch.inference_mode():
            return self.forward(batch).argmax(dim=-1).tolist()
