"""The parts of a `ModelShape` beyond a dense transformer's: mixture-of-experts MLPs
(`MoESpec`) and multi-head latent attention (`MLASpec`). Each checks itself; the shape
that holds them checks how they fit together. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass


class ShapeError(ValueError):
    """A model shape or its config file is invalid."""


def _check_positive(where: str, **values: int) -> None:
    for field, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ShapeError(f"{where}: {field} must be a positive integer, got {value!r}")


def _check_non_negative(where: str, **values: int) -> None:
    for field, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ShapeError(f"{where}: {field} must be an integer >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class MoESpec:
    """The mixture-of-experts MLP of a model's MoE layers.

    Each MoE layer has `num_experts` routed experts of width `expert_intermediate_size`
    (gated: gate, up and down projections), of which `experts_per_token` run per token,
    a router (hidden x num_experts) and, where the model has them, shared experts that
    every token runs, `shared_intermediate_size` wide in all (DeepSeek-V3: one of 2,048;
    Qwen2-MoE: shared_expert_intermediate_size). The first `first_dense_layers` layers
    have a dense MLP of the shape's `intermediate_size` instead (DeepSeek-V3's
    first_k_dense_replace = 3); after them every `layer_step`-th layer is MoE and the
    others dense (Llama-4-Maverick's interleave_moe_layer_step = 2; 1: all).
    """

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_intermediate_size: int = 0
    first_dense_layers: int = 0
    layer_step: int = 1

    def check(self, where: str) -> None:
        _check_positive(
            where,
            num_experts=self.num_experts,
            experts_per_token=self.experts_per_token,
            expert_intermediate_size=self.expert_intermediate_size,
            layer_step=self.layer_step,
        )
        _check_non_negative(
            where,
            shared_intermediate_size=self.shared_intermediate_size,
            first_dense_layers=self.first_dense_layers,
        )
        if self.experts_per_token > self.num_experts:
            raise ShapeError(
                f"{where}: experts_per_token ({self.experts_per_token}) exceeds num_experts "
                f"({self.num_experts})"
            )

    def num_moe_layers(self, num_layers: int) -> int:
        """How many of `num_layers` layers are MoE layers."""
        after = max(0, num_layers - self.first_dense_layers)
        return after // self.layer_step


@dataclass(frozen=True, slots=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): keys and values are cached
    as one `kv_lora_rank`-wide latent plus a `qk_rope_head_dim`-wide rotary key per token
    and layer, shared by all heads. Each head's query and key are qk_nope_head_dim +
    qk_rope_head_dim wide and its value `v_head_dim`; queries go through a
    `q_lora_rank`-wide low-rank projection (0: a full projection, DeepSeek-V2-Lite)."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0

    def check(self, where: str) -> None:
        _check_positive(
            where,
            kv_lora_rank=self.kv_lora_rank,
            qk_rope_head_dim=self.qk_rope_head_dim,
            qk_nope_head_dim=self.qk_nope_head_dim,
            v_head_dim=self.v_head_dim,
        )
        _check_non_negative(where, q_lora_rank=self.q_lora_rank)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_width(self) -> int:
        """KV-cache elements per token and layer (the latent plus the rotary key)."""
        return self.kv_lora_rank + self.qk_rope_head_dim
