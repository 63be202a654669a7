"""`ModelShape`: the dimensions that decide what a transformer step costs, and the weight
and KV-cache bytes they make.

A `ModelShape` is the single description of a decoder-only transformer used by the
profiler (to build kernels), the latency model (to compute features) and the simulator
(to size the KV cache): dense, or mixture-of-experts (`moe`), with GQA or multi-head
latent attention (`mla`), optionally sliding-window on some layers or with Gated
DeltaNet linear attention in place of softmax attention on some layers (`gdn`: a fixed
state per sequence instead of a KV cache), with its number formats: activations
(`dtype`), linear-layer weights (`quantization`, over `quantized_scope`) and KV cache
(`kv_cache_dtype`). Torch-free.

Parameter counts leave out biases (gpt-oss's attention and expert biases, 0.04% of its
weights), attention sinks, QK norms, shared-expert gates (Qwen's hidden x 1 per MoE
layer) and MTP modules; they count every projection matrix, router, norm, convolution
filter and embedding table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from optimizer.parallel import DENSE_LAYOUT, ExpertLayout
from optimizer.shape_parts import (
    DEFAULT_INT4_GROUP_SIZE,
    DTYPE_BYTES,
    KV_CACHE_DTYPES,
    QUANTIZATIONS,
    QUANTIZED_SCOPES,
    DSASpec,
    GatedDeltaNetSpec,
    MLASpec,
    MoESpec,
    Precision,
    ShapeError,
    check_layer_mix,
    check_positive,
    weight_element_bytes,
)

_POSITIVE_FIELDS = (
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "int4_group_size",
)


def _number(value: Fraction) -> float:
    """An exact byte width as the int it is when whole (dense formats stay ints)."""
    return int(value) if value.denominator == 1 else float(value)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Dimensions of a decoder-only transformer (GQA when `num_kv_heads < num_heads`).

    With `moe`, the MoE layers replace their dense MLP (`intermediate_size` wide, kept for
    the dense layers before and between them) by routed and shared experts. With `mla`,
    attention is latent: `head_dim` is then the query/key head width
    (qk_nope_head_dim + qk_rope_head_dim) and `num_kv_heads` the number of heads the
    latent is expanded to (= num_heads). With `gdn`, gdn.num_layers of the layers are Gated
    DeltaNet and the other `num_full_attention_layers` softmax attention (the only ones
    with a KV cache). `attn_output_gate` (Qwen3-Next, Qwen3.5): the query projection also
    yields a per-head sigmoid gate on the attention output (q_proj h x 2·a·d).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool = True
    tie_word_embeddings: bool = False  # the LM head reuses the embedding table
    dtype: str = "bfloat16"  # activations (and weights unless quantised)
    quantization: str = "none"  # linear-layer weights and their GEMMs: fp8, fp4, mxfp4, int4
    kv_cache_dtype: str = "auto"  # "fp8": the KV cache in FP8 ("auto": `dtype`)
    moe: MoESpec | None = None  # None: every layer has a dense MLP of intermediate_size
    mla: MLASpec | None = None  # None: standard (GQA) attention of num_kv_heads x head_dim
    # Sliding-window attention: `sliding_window_layers` of the layers attend to the last
    # `sliding_window` tokens only (gpt-oss: every other layer, 128 tokens); 0: none.
    sliding_window: int = 0
    sliding_window_layers: int = 0
    # Which weights `quantization` covers (QUANTIZED_SCOPES): "linear", all linear layers;
    # "experts", the routed experts only (gpt-oss MXFP4, Kimi-K2-Thinking INT4).
    quantized_scope: str = "linear"
    int4_group_size: int = DEFAULT_INT4_GROUP_SIZE  # weights per 16-bit scale ("int4")
    gdn: GatedDeltaNetSpec | None = None  # None: every layer is softmax attention
    attn_output_gate: bool = False  # q_proj also yields a gate on the attention output
    dsa: DSASpec | None = None  # None: MLA layers attend to every cached key

    def __post_init__(self) -> None:
        check_positive(self.name, **{f: getattr(self, f) for f in _POSITIVE_FIELDS})
        if self.num_heads % self.num_kv_heads:
            raise ShapeError(
                f"{self.name}: num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        for field, allowed in (
            ("dtype", tuple(DTYPE_BYTES)),
            ("quantization", QUANTIZATIONS),
            ("kv_cache_dtype", KV_CACHE_DTYPES),
            ("quantized_scope", QUANTIZED_SCOPES),
        ):
            value = getattr(self, field)
            if value not in allowed:
                raise ShapeError(f"{self.name}: {field} {value!r} is not one of {allowed}")
        check_layer_mix(
            self.name,
            self.num_layers,
            moe=self.moe,
            mla=self.mla,
            gdn=self.gdn,
            sliding_window=self.sliding_window,
            sliding_window_layers=self.sliding_window_layers,
            quantized_scope=self.quantized_scope,
            attn_output_gate=self.attn_output_gate,
            dsa=self.dsa,
        )

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def num_full_attention_layers(self) -> int:
        """Layers of softmax attention (all but the Gated DeltaNet ones): those with KV."""
        return self.num_layers - (0 if self.gdn is None else self.gdn.num_layers)

    # -- number formats ------------------------------------------------------------------

    @property
    def dtype_bytes(self) -> int:
        """Bytes per activation element (and per weight unless quantised)."""
        return DTYPE_BYTES[self.dtype]

    def _expert_element_bytes(self) -> Fraction:
        return weight_element_bytes(self.quantization, self.dtype_bytes, self.int4_group_size)

    def _dense_element_bytes(self) -> Fraction:
        if self.quantized_scope == "experts":
            return Fraction(self.dtype_bytes)
        return self._expert_element_bytes()

    @property
    def weight_dtype_bytes(self) -> float:
        """Bytes per weight of the quantised linear layers, scales included (fp8: 1;
        NVFP4 0.5625; MXFP4 0.53125; INT4 0.5 + 2 / int4_group_size; none: `dtype`). An int
        for whole widths. With quantized_scope "experts" only the routed experts have it:
        see `dense_weight_dtype_bytes` for the rest."""
        return _number(self._expert_element_bytes())

    @property
    def expert_weight_dtype_bytes(self) -> float:
        """Bytes per weight of a routed expert's projections (= `weight_dtype_bytes`)."""
        return _number(self._expert_element_bytes())

    @property
    def dense_weight_dtype_bytes(self) -> float:
        """Bytes per weight of attention, dense-MLP and shared-expert projections: the
        activation dtype's when quantized_scope is "experts", else `weight_dtype_bytes`."""
        return _number(self._dense_element_bytes())

    @property
    def kv_dtype_bytes(self) -> int:
        """Bytes per KV-cache element."""
        return 1 if self.kv_cache_dtype == "fp8" else self.dtype_bytes

    @property
    def precision(self) -> Precision:
        return Precision(self.quantization, self.kv_cache_dtype)

    def with_precision(self, precision: Precision) -> ModelShape:
        """The shape in other number formats. A checkpoint's quantized_scope holds for its
        own format; another weight format applies to every linear layer ("linear"), as
        vLLM's online --quantization does."""
        scope = self.quantized_scope if precision.weights == self.quantization else "linear"
        return replace(
            self,
            quantization=precision.weights,
            kv_cache_dtype=precision.kv_cache,
            quantized_scope=scope,
        )

    def with_dtype(self, dtype: str) -> ModelShape:
        return replace(self, dtype=dtype)

    # -- parameters ----------------------------------------------------------------------

    @property
    def attention_params(self) -> int:
        """Projection weights of one full-attention layer. GQA: QKV h x (a + 2g) x d (with
        `attn_output_gate`, h x (2a + 2g) x d: the query projection also yields the gate)
        and output a x d x h. MLA: query (h x q_lora + q_lora x a x qk, or h x a x qk
        without a query latent), the KV down-projection h x (kv_lora + rope), its
        up-projection kv_lora x a x (nope + v) and output a x v x h."""
        h, a = self.hidden_size, self.num_heads
        if self.mla is None:
            d, q = self.head_dim, (2 if self.attn_output_gate else 1) * a
            return h * (q + 2 * self.num_kv_heads) * d + a * d * h
        m = self.mla
        if m.q_lora_rank:
            query = h * m.q_lora_rank + m.q_lora_rank * a * m.qk_head_dim
        else:
            query = h * a * m.qk_head_dim
        kv_down = h * (m.kv_lora_rank + m.qk_rope_head_dim)
        kv_up = m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
        indexer = 0 if self.dsa is None else self.dsa.projection_params(h, m.q_lora_rank)
        return query + kv_down + kv_up + a * m.v_head_dim * h + indexer

    @property
    def gdn_layer_params(self) -> int:
        """Weights of one Gated DeltaNet layer (0 without `gdn`): its linear layers
        in_proj_qkvz h x (2 key_dim + 2 value_dim), in_proj_ba h x 2 value heads and
        out_proj value_dim x h, which count as linear layers (quantised like attention's
        projections), plus the conv1d filters (conv_dim x conv_kernel), A_log and dt_bias
        (one per value head) and the gated norm (value_head_dim), which stay in `dtype`."""
        gdn = self.gdn
        return 0 if gdn is None else gdn.projection_params(self.hidden_size) + gdn.small_params

    @property
    def indexer_params(self) -> int:
        """The sparse-attention indexers' linear layers, all layers (0 without `dsa`);
        vLLM replicates them on every TP rank."""
        if self.dsa is None or self.mla is None:
            return 0
        per_layer = self.dsa.projection_params(self.hidden_size, self.mla.q_lora_rank)
        return self.num_full_attention_layers * per_layer

    @property
    def _mlp_factor(self) -> int:
        return 3 if self.gated_mlp else 2  # gate, up, down (or up, down)

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is MoE (0 for a dense model)."""
        return 0 if self.moe is None else self.moe.num_moe_layers(self.num_layers)

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense MLP of `intermediate_size`."""
        return self.num_layers - self.num_moe_layers

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert (gate, up, down: 3 x hidden x expert width)."""
        if self.moe is None:
            return 0
        return self._mlp_factor * self.hidden_size * self.moe.expert_intermediate_size

    @property
    def routed_expert_params(self) -> int:
        """Weights of all routed experts of all MoE layers (what EP shards)."""
        if self.moe is None:
            return 0
        return self.num_moe_layers * self.moe.num_experts * self.expert_params

    @property
    def shared_expert_params(self) -> int:
        """Weights of the shared experts of all MoE layers (every token runs them)."""
        if self.moe is None:
            return 0
        width = self.moe.shared_intermediate_size
        return self.num_moe_layers * self._mlp_factor * self.hidden_size * width

    @property
    def router_params(self) -> int:
        """Router weights of all MoE layers (hidden x num_experts each; kept 16-bit)."""
        if self.moe is None:
            return 0
        return self.num_moe_layers * self.hidden_size * self.moe.num_experts

    @property
    def num_linear_params(self) -> int:
        """Parameters of the linear layers (what weight quantisation covers at most:
        attention, Gated DeltaNet projections, dense MLPs, shared and routed experts); the
        rest (embedding, LM head, norms, routers, GDN convolutions) stays in `dtype`, as in
        vLLM's quantised checkpoints."""
        dense_mlp = self._mlp_factor * self.hidden_size * self.intermediate_size
        gdn = self.gdn
        gdn_linear = 0 if gdn is None else gdn.num_layers * gdn.projection_params(self.hidden_size)
        return (
            self.num_full_attention_layers * self.attention_params
            + gdn_linear
            + self.num_dense_layers * dense_mlp
            + self.shared_expert_params
            + self.routed_expert_params
        )

    @property
    def _norm_params(self) -> int:
        """Norm weights: two per layer (plus MLA's query and KV latent norms), one final;
        with the Gated DeltaNet layers' other small weights (conv1d, A_log, dt_bias, gated
        norm)."""
        per_layer = 2 * self.hidden_size
        if self.mla is not None:
            per_layer += self.mla.q_lora_rank + self.mla.kv_lora_rank
        gdn = 0 if self.gdn is None else self.gdn.num_layers * self.gdn.small_params
        return self.num_layers * per_layer + self.hidden_size + gdn

    @property
    def embedding_params(self) -> int:
        """The input embedding table (vocab x hidden); tied, it is also the LM head."""
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """All parameters: linear layers, routers, norms, GDN convolutions, embedding and LM
        head (one table when tied). Biases, sinks, QK norms, shared-expert gates and MTP
        modules are left out."""
        tables = 1 if self.tie_word_embeddings else 2
        return (
            self.num_linear_params
            + self.router_params
            + self._norm_params
            + tables * self.embedding_params
        )

    @property
    def num_active_params(self) -> int:
        """Parameters one token's forward pass multiplies by: attention, dense MLPs, shared
        experts, its `experts_per_token` routed experts per MoE layer, routers, norms and
        the LM head. The input embedding is a row lookup and is not counted (untied; tied,
        the table counts once, as the LM head), as OpenAI counts gpt-oss's active
        parameters; Qwen and DeepSeek count it (add `embedding_params`)."""
        lookup = 0 if self.tie_word_embeddings else self.embedding_params
        return self.num_params - self.routed_expert_params + self.active_expert_params - lookup

    @property
    def active_expert_params(self) -> int:
        """Weights of the routed experts one token runs: `experts_per_token` per MoE layer."""
        if self.moe is None:
            return 0
        return self.num_moe_layers * self.moe.experts_per_token * self.expert_params

    @property
    def active_weight_bytes(self) -> float:
        """Bytes of the `num_active_params` at their formats' widths (scales included): what
        one token's forward pass reads, all GPUs together. Attention, Gated DeltaNet,
        dense-MLP and shared-expert projections at `dense_weight_dtype_bytes`, the token's
        routed experts at `expert_weight_dtype_bytes`, routers, norms and the LM head at
        `dtype`; the input embedding is a row lookup and is not counted (untied)."""
        dense = self.num_linear_params - self.routed_expert_params
        experts = self.active_expert_params
        rest = self.num_active_params - dense - experts  # routers, norms, LM head
        widths = (
            dense * self._dense_element_bytes()
            + experts * self._expert_element_bytes()
            + rest * self.dtype_bytes
        )
        return float(widths)

    # -- bytes per GPU -------------------------------------------------------------------

    def weight_bytes(self, tp: int = 1, layout: ExpertLayout = DENSE_LAYOUT) -> int:
        """Bytes of weights one GPU holds in an instance of tensor-parallel degree `tp` and
        expert layout `layout`: attention, dense MLPs, shared experts, routers, norms,
        embedding and LM head split over tp (and replicated on each of the layout's dp
        ranks), sparse-attention indexers whole; the routed experts sharded over all
        tp x dp GPUs, whole experts with expert parallelism or each expert tensor-split
        without (the same bytes). Linear
        layers count at their quantised width, scales included (`weight_dtype_bytes`).
        With expert parallelism over GPUs that do not divide the experts, vLLM gives the
        first num_experts % ep ranks one more (`determine_expert_map`): the busiest GPU
        (ceil(num_experts / ep) experts) is counted."""
        routed = self.routed_expert_params
        indexer = self.indexer_params  # whole on every TP rank
        linear = self.num_linear_params - routed - indexer
        rest = self.num_params - self.num_linear_params
        replicated = linear * self._dense_element_bytes() + rest * self.dtype_bytes
        whole = int(indexer * self._dense_element_bytes())
        experts = routed * self._expert_element_bytes()
        gpus = layout.num_gpus(tp)
        if layout.expert_parallel and self.moe is not None and self.moe.num_experts % gpus:
            busiest = -(-self.moe.num_experts // gpus)
            return replicated // tp + whole + experts * busiest // self.moe.num_experts
        return replicated // tp + whole + experts // gpus

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV-cache bytes per token on one GPU, over the full-attention layers only (Gated
        DeltaNet layers hold a fixed state instead: `gdn_state_bytes_per_sequence`).

        GQA: 2 x layers x kv_heads x head_dim x KV dtype / tp (KV heads are replicated
        when tp exceeds them). MLA: layers x (kv_lora_rank + qk_rope_head_dim) x KV dtype,
        the latent and rotary key every head shares, held whole by every TP rank (as
        vLLM's MLA backends do), plus with `dsa` the indexer's FP8 keys (`DSASpec`).
        Sliding-window layers are counted in full, as if they kept every token: an upper
        bound (they keep `sliding_window` tokens per sequence; gpt-oss's 128-token window
        makes its true per-token cost about half this at long context).
        """
        layers = self.num_full_attention_layers
        if self.mla is not None:
            indexer = 0 if self.dsa is None else self.dsa.cache_bytes
            return layers * (self.mla.cache_width * self.kv_dtype_bytes + indexer)
        kv_heads_per_gpu = max(1, self.num_kv_heads // tp)
        return 2 * layers * kv_heads_per_gpu * self.head_dim * self.kv_dtype_bytes

    def kv_bytes_per_sequence(self, num_tokens: int, tp: int = 1) -> int:
        """KV-cache bytes one sequence of `num_tokens` tokens holds on one GPU, with its
        sliding-window layers keeping only their last `sliding_window` tokens (block
        rounding left out); without sliding layers, num_tokens x `kv_bytes_per_token`."""
        if num_tokens < 0:
            raise ShapeError(f"{self.name}: num_tokens must be >= 0, got {num_tokens}")
        per_layer = self.kv_bytes_per_token(tp) // self.num_full_attention_layers
        full_layers = self.num_full_attention_layers - self.sliding_window_layers
        windowed = min(num_tokens, self.sliding_window)
        return per_layer * (full_layers * num_tokens + self.sliding_window_layers * windowed)

    def gdn_state_bytes_per_sequence(self, tp: int = 1) -> int:
        """The fixed state one running sequence holds on one GPU in the Gated DeltaNet
        layers, whatever its length: per layer (num_value_heads / tp) x key_head_dim x
        value_head_dim in gdn.ssm_dtype (float32: 4 B) plus (conv_dim / tp) x
        (conv_kernel - 1) in `dtype` (`GatedDeltaNetSpec.state_bytes`); 0 without `gdn`.
        Speculative decoding's extra conv slots (vLLM: conv_kernel - 1 + K) are left out."""
        gdn = self.gdn
        if gdn is None:
            return 0
        if tp < 1 or gdn.num_key_heads % tp or gdn.num_value_heads % tp:
            raise ShapeError(
                f"{self.name}: tp {tp} must divide gdn num_key_heads ({gdn.num_key_heads}) "
                f"and num_value_heads ({gdn.num_value_heads})"
            )
        return gdn.num_layers * gdn.state_bytes(tp, self.dtype_bytes)

    def hybrid_block_tokens(self, tp: int = 1) -> int:
        """The attention block, in tokens, vLLM gives a Gated DeltaNet hybrid so that one
        page of a full-attention layer's KV holds one GDN layer's state of a sequence
        (`HybridAttentionMambaModelConfig`): 16 x ceil(state / (16 x KV bytes per token
        and layer)); 0 without `gdn`. Qwen3.6-35B-A3B: 1,056 at TP 2, 528 at TP 4."""
        gdn = self.gdn
        if gdn is None:
            return 0
        state = self.gdn_state_bytes_per_sequence(tp) // gdn.num_layers  # one layer's
        per_token = self.kv_bytes_per_token(tp) // self.num_full_attention_layers
        return 16 * -(-state // (16 * per_token))
