"""Random weights of a dense decoder (`ModelShape`), shared by the profiler's whole
mixed iterations (`profiler.mixed`) and the reference engine (`profiler.reference_engine`).

Values are N(0, 0.05²) (norm weights 1): timing does not depend on them, only
their shapes and dtype do. With a `generator` (a seeded CPU one) the draws are
reproducible and moved to `device`; without, they are drawn on `device` itself,
so building a large model on a GPU costs no host-to-device copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from optimizer.shapes import ModelShape
from profiler import kernels


@dataclass(frozen=True, slots=True)
class LayerWeights:
    norm1: torch.Tensor  # (h,)
    qkv: torch.Tensor  # ((a + 2g)·d, h)
    out: torch.Tensor  # (h, a·d)
    norm2: torch.Tensor  # (h,)
    up: torch.Tensor  # (2f, h) gated, else (f, h)
    down: torch.Tensor  # (h, f)


@dataclass(frozen=True, slots=True)
class ModelWeights:
    layers: tuple[LayerWeights, ...]
    table: torch.Tensor  # (V, h) embedding
    final_norm: torch.Tensor  # (h,)
    head: torch.Tensor  # (V, h) LM head


def random_weights(
    shape: ModelShape, device: torch.device, generator: torch.Generator | None = None
) -> ModelWeights:
    """All of `shape`'s weights on `device` in its dtype (see the module docstring).

    Every layer is built as softmax attention with an ungated query projection: a shape
    with Gated DeltaNet layers or an attention output gate (Qwen3-Next, Qwen3.5) is
    refused rather than timed as a model it is not."""
    if shape.gdn is not None or shape.attn_output_gate:
        raise ValueError(
            f"{shape.name}: Gated DeltaNet (linear attention) layers and the attention "
            "output gate are not supported by the reference profiler's whole-model forwards "
            "and engine (every layer is built as ungated softmax attention); its GEMM, norm "
            "and attention operators can still be profiled one by one"
        )
    dtype = kernels.torch_dtype(shape.dtype)
    h, a, g, d = shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim
    f, vocab = shape.intermediate_size, shape.vocab_size

    def rand(*size: int) -> torch.Tensor:
        if generator is None:
            return torch.randn(*size, device=device, dtype=dtype) * 0.05
        return (torch.randn(*size, generator=generator) * 0.05).to(device=device, dtype=dtype)

    def ones() -> torch.Tensor:
        return torch.ones(h, device=device, dtype=dtype)

    layers = tuple(
        LayerWeights(
            norm1=ones(),
            qkv=rand((a + 2 * g) * d, h),
            out=rand(h, a * d),
            norm2=ones(),
            up=rand((2 if shape.gated_mlp else 1) * f, h),
            down=rand(h, f),
        )
        for _ in range(shape.num_layers)
    )
    return ModelWeights(layers, table=rand(vocab, h), final_norm=ones(), head=rand(vocab, h))
