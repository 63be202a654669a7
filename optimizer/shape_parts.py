"""The vocabulary a `ModelShape` is built from: number formats (`DTYPE_BYTES`,
`QUANTIZATIONS`, `KV_CACHE_DTYPES`, `Precision`, bytes per quantised weight), and the
parts beyond a dense transformer's: mixture-of-experts MLPs (`MoESpec`), multi-head
latent attention (`MLASpec`) and Gated DeltaNet linear-attention layers
(`GatedDeltaNetSpec`). Each checks itself; the shape that holds them checks how they fit
together. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction


class ShapeError(ValueError):
    """A model shape or its config file is invalid."""


DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
}

# Linear-layer weights (and their GEMMs): "fp4" is NVFP4 (W4A4, Blackwell), "mxfp4" the
# OCP MX FP4 gpt-oss ships, "int4" weight-only INT4 (16-bit activations, e.g. Kimi-K2).
QUANTIZATIONS = ("none", "fp8", "fp4", "mxfp4", "int4")
KV_CACHE_DTYPES = ("auto", "fp8")  # "auto": the activation dtype, as vLLM's --kv-cache-dtype
# Which weights a checkpoint's quantisation covers: "linear", every linear layer of the
# transformer blocks (attention, dense MLPs, shared and routed experts); "experts", the
# routed experts only, the rest in the activation dtype (gpt-oss's MXFP4, Kimi-K2-Thinking's
# INT4). Embeddings, the LM head, norms and routers stay in the activation dtype either way.
QUANTIZED_SCOPES = ("linear", "experts")
# INT4 checkpoints scale each group of this many weights by one 16-bit number unless the
# config says otherwise (Kimi-K2-Thinking's compressed-tensors "group_size": 32).
DEFAULT_INT4_GROUP_SIZE = 32


def weight_element_bytes(quantization: str, dtype_bytes: int, int4_group_size: int) -> Fraction:
    """Bytes one quantised weight takes, its share of the scales included (exact).

    - "none": the activation dtype (`dtype_bytes`); "fp8": 1 byte (block-scaled FP8's one
      fp32 scale per 128 x 128 block, 0.0002 B a weight, is left out);
    - "fp4" (NVFP4): 4 bits + one FP8 (E4M3) scale per 16 weights = 0.5 + 1/16 = 0.5625 B
      (the per-tensor fp32 scale is left out);
    - "mxfp4" (OCP MX): 4 bits + one 8-bit (E8M0) scale per 32 weights = 0.53125 B;
    - "int4": 4 bits + one 16-bit scale per `int4_group_size` weights = 0.5 + 2/g B
      (g = 32: 0.5625 B; AWQ/GPTQ's usual g = 128: 0.515625 B; zero points left out).
    """
    if quantization == "none":
        return Fraction(dtype_bytes)
    if quantization == "fp8":
        return Fraction(1)
    if quantization == "fp4":
        return Fraction(1, 2) + Fraction(1, 16)
    if quantization == "mxfp4":
        return Fraction(1, 2) + Fraction(1, 32)
    if quantization == "int4":
        return Fraction(1, 2) + Fraction(2, int4_group_size)
    raise ShapeError(f"quantization {quantization!r} is not one of {QUANTIZATIONS}")


@dataclass(frozen=True, slots=True)
class Precision:
    """The number formats of a deployment beyond the activations: linear-layer weights
    (`none`: the activation dtype; `fp8`; the 4-bit `fp4`, `mxfp4`, `int4`) and the KV
    cache (`auto` | `fp8`)."""

    weights: str = "none"
    kv_cache: str = "auto"

    def __post_init__(self) -> None:
        if self.weights not in QUANTIZATIONS:
            raise ShapeError(f"quantization {self.weights!r} is not one of {QUANTIZATIONS}")
        if self.kv_cache not in KV_CACHE_DTYPES:
            raise ShapeError(f"kv_cache_dtype {self.kv_cache!r} is not one of {KV_CACHE_DTYPES}")

    @property
    def label(self) -> str:
        return f"w-{self.weights}.kv-{self.kv_cache}"


DEFAULT_PRECISION = Precision()


def check_positive(where: str, **values: int) -> None:
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
        check_positive(
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
        check_positive(
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


@dataclass(frozen=True, slots=True)
class GatedDeltaNetSpec:
    """Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5 / 3.6): `num_layers` of the
    model's layers have it in place of softmax attention; the others are full attention.

    Each GDN layer (vLLM's `vllm/model_executor/layers/mamba/gdn_linear_attn.py`) has an
    input projection in_proj_qkvz, hidden x (2 key_dim + 2 value_dim) (queries and keys of
    num_key_heads x key_head_dim, values and the output gate z of num_value_heads x
    value_head_dim; Qwen3.5 stores it as in_proj_qkv and in_proj_z), in_proj_ba, hidden x
    2 num_value_heads (the per-head beta and decay inputs), a depthwise causal conv1d over
    the conv_dim = 2 key_dim + value_dim channels of q, k and v, `conv_kernel` wide,
    A_log and dt_bias (one per value head), a gated RMSNorm of value_head_dim and out_proj,
    value_dim x hidden.

    Its state per sequence is fixed, whatever the context: a recurrent state of
    num_value_heads x key_head_dim x value_head_dim in `ssm_dtype` and a convolution
    window of conv_dim x (conv_kernel - 1) in the activation dtype, per layer; it holds
    no KV cache (vLLM's MambaStateShapeCalculator.gated_delta_net_state_shape, split over
    tp by heads and channels). `ssm_dtype` is vLLM's --mamba-ssm-cache-dtype: Qwen3.5 /
    3.6 pin "float32" (their config's mamba_ssm_dtype); without that key vLLM keeps the
    state in the activation dtype (Qwen3-Next).
    """

    num_layers: int
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4
    ssm_dtype: str = "float32"

    def check(self, where: str) -> None:
        check_positive(
            where,
            num_layers=self.num_layers,
            num_key_heads=self.num_key_heads,
            num_value_heads=self.num_value_heads,
            key_head_dim=self.key_head_dim,
            value_head_dim=self.value_head_dim,
            conv_kernel=self.conv_kernel,
        )
        if self.num_value_heads % self.num_key_heads:
            raise ShapeError(
                f"{where}: num_value_heads ({self.num_value_heads}) must be a multiple of "
                f"num_key_heads ({self.num_key_heads})"
            )
        if self.ssm_dtype not in DTYPE_BYTES or self.ssm_dtype == "fp8":
            raise ShapeError(
                f"{where}: ssm_dtype {self.ssm_dtype!r} is not one of float32, bfloat16, float16"
            )

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal convolution: queries, keys and values."""
        return 2 * self.key_dim + self.value_dim

    def projection_params(self, hidden: int) -> int:
        """Weights of one layer's linear layers (quantisable): in_proj_qkvz, in_proj_ba and
        out_proj."""
        qkvz = hidden * (2 * self.key_dim + 2 * self.value_dim)
        return qkvz + hidden * 2 * self.num_value_heads + self.value_dim * hidden

    @property
    def small_params(self) -> int:
        """Weights of one layer kept in the activation dtype: the conv1d filters, A_log,
        dt_bias and the gated norm."""
        return self.conv_dim * self.conv_kernel + 2 * self.num_value_heads + self.value_head_dim

    def state_bytes(self, tp: int, dtype_bytes: int) -> int:
        """One layer's state of one sequence on one of `tp` GPUs (vLLM divides the heads and
        channels by tp): (num_value_heads / tp) x key_head_dim x value_head_dim x ssm_dtype
        + (conv_dim / tp) x (conv_kernel - 1) x `dtype_bytes` (the activation dtype)."""
        recurrent = self.num_value_heads // tp * self.key_head_dim * self.value_head_dim
        conv = self.conv_dim // tp * (self.conv_kernel - 1)
        return recurrent * DTYPE_BYTES[self.ssm_dtype] + conv * dtype_bytes


@dataclass(frozen=True, slots=True)
class DSASpec:
    """DeepSeek sparse attention (DeepSeek-V3.2; GLM-5) on MLA layers: a lightning indexer
    of `index_n_heads` heads of `index_head_dim` scores every cached key of each query
    against keys it caches itself in FP8, and attention reads only the `index_topk`
    best-scored keys. vLLM's indexer cache (DeepseekV32IndexerCache) holds index_head_dim
    bytes and a 4-byte scale per 128 of them, per token and layer, whatever the KV-cache
    format. Its projections: the query from the MLA query latent (q_lora_rank x heads x
    dim), one key (hidden x dim) and per-head weights (hidden x heads)."""

    index_n_heads: int
    index_head_dim: int
    index_topk: int

    def check(self, where: str) -> None:
        check_positive(
            where,
            index_n_heads=self.index_n_heads,
            index_head_dim=self.index_head_dim,
            index_topk=self.index_topk,
        )

    @property
    def cache_bytes(self) -> int:
        """Indexer-cache bytes per token and layer: FP8 keys and their scales."""
        return self.index_head_dim + 4 * -(-self.index_head_dim // 128)

    def projection_params(self, hidden: int, q_lora_rank: int) -> int:
        """The indexer's linear layers in one layer (wq_b, wk, weights_proj)."""
        heads, dim = self.index_n_heads, self.index_head_dim
        return q_lora_rank * heads * dim + hidden * dim + hidden * heads


def check_layer_mix(
    name: str,
    num_layers: int,
    *,
    moe: MoESpec | None,
    mla: MLASpec | None,
    gdn: GatedDeltaNetSpec | None,
    sliding_window: int,
    sliding_window_layers: int,
    quantized_scope: str,
    attn_output_gate: bool,
    dsa: DSASpec | None = None,
) -> None:
    """How a shape's parts fit its `num_layers` layers and each other (`ModelShape` calls
    this on construction): each part checks itself; a MoE has at least one MoE layer;
    sliding windows and Gated DeltaNet leave full-attention layers; GDN goes with neither
    MLA nor sliding windows; "experts" quantisation needs experts."""
    if moe is not None:
        if not isinstance(moe, MoESpec):
            raise ShapeError(f"{name}: moe must be a MoESpec, got {moe!r}")
        moe.check(f"{name}.moe")
        if moe.num_moe_layers(num_layers) == 0:
            raise ShapeError(
                f"{name}.moe: no MoE layer among {num_layers} layers (first_dense_layers "
                f"{moe.first_dense_layers}, layer_step {moe.layer_step})"
            )
    elif quantized_scope == "experts":
        raise ShapeError(f"{name}: quantized_scope 'experts' needs a MoE shape (moe is None)")
    if mla is not None:
        if not isinstance(mla, MLASpec):
            raise ShapeError(f"{name}: mla must be an MLASpec, got {mla!r}")
        mla.check(f"{name}.mla")
    if dsa is not None:
        if not isinstance(dsa, DSASpec):
            raise ShapeError(f"{name}: dsa must be a DSASpec, got {dsa!r}")
        dsa.check(f"{name}.dsa")
        if mla is None or not mla.q_lora_rank:
            raise ShapeError(f"{name}: dsa (sparse attention) needs MLA with a query latent")
    _check_non_negative(
        name, sliding_window=sliding_window, sliding_window_layers=sliding_window_layers
    )
    if sliding_window_layers > num_layers or bool(sliding_window) != bool(sliding_window_layers):
        raise ShapeError(
            f"{name}: sliding_window ({sliding_window}) and sliding_window_layers "
            f"({sliding_window_layers}) must both be 0 or both set, with at most "
            f"num_layers ({num_layers}) layers"
        )
    if not isinstance(attn_output_gate, bool):
        raise ShapeError(f"{name}: attn_output_gate must be a bool, got {attn_output_gate!r}")
    if attn_output_gate and mla is not None:
        raise ShapeError(f"{name}: attn_output_gate and mla: a gated latent attention is not "
                         "modelled")  # fmt: skip
    if gdn is None:
        return
    if not isinstance(gdn, GatedDeltaNetSpec):
        raise ShapeError(f"{name}: gdn must be a GatedDeltaNetSpec, got {gdn!r}")
    gdn.check(f"{name}.gdn")
    if gdn.num_layers >= num_layers:
        raise ShapeError(
            f"{name}.gdn: num_layers ({gdn.num_layers}) must leave at least one of the "
            f"model's {num_layers} layers full attention"
        )
    if mla is not None:
        raise ShapeError(f"{name}: gdn and mla together are not modelled")
    if sliding_window:
        raise ShapeError(f"{name}: gdn and sliding_window together are not modelled")
