"""Iteration time of a batch from per-operator predictions (DOMAIN.md §9).

One step of a dense transformer on one GPU of a TP group costs

    layers x (QKV + attention + output proj + MLP up/gate + MLP down
              + norms, adds, activation, RoPE + 2 all-reduces when tp > 1)
    + embedding + final norm + LM head (rows = sequences sampling)

times the model's `op_scale`, plus a per-iteration engine overhead; both are
fitted on measured mixed iterations when there are some
(`optimizer.latency.mixed_fit`), else the scale is 1 and the overhead is the
engine generation's.

How the engine runs those operators is its `StepRules` (`optimizer.engines`):
legacy pricing (the servetune reference engine, vLLM V0) has six separate
elementwise kernels per layer and NCCL all-reduces; vLLM V1 fuses them into
four (residual add + RMSNorm twice, SiLU-and-mul, RoPE), all-reduces through its
own communicator (`vllm_all_reduce`: in a CUDA graph up to the graph size, eagerly
beyond), pads steps of up to `cuda_graph_tokens` tokens to the next CUDA-graph
capture size, and from 0.17 runs an all-reduce and the add + RMSNorm after it as
one FlashInfer kernel for small messages.

`Pricing` decides which source prices each operator: a learned model when
one covers it, else the roofline (those operators are listed by
`Pricing.estimated_ops`). These functions call scikit-learn; the simulator
uses the compiled tables of `optimizer.latency.table` instead.

The shape's precision decides each operator's format. With `quantization`
"fp8" the projections (QKV, output, MLP up/gate and down) run as FP8 GEMMs;
the LM head and the embedding stay 16-bit, as in FP8 checkpoints. With
`kv_cache_dtype` "fp8" every attention (prefill, decode, verify) reads an FP8
KV cache. An FP8 operator is priced by the learned model's FP8 variant when it
has one, else by the roofline at FP8 widths, and is then listed by
`estimated_ops` as "<op>:fp8": a 16-bit model never prices an FP8 operator. The
4-bit formats ("fp4", "mxfp4", "int4") work alike, as "<op>:fp4" etc.; a shape whose
`quantized_scope` is "experts" (gpt-oss's MXFP4) quantises the MoE experts only.

A mixture-of-experts shape (`ModelShape.moe`) is priced as vLLM runs it under the
instance's `ExpertLayout` (`optimizer.latency.moe`): its MoE layers run the fused MoE
operator, the router and shared experts, and the communication the layout needs; its
dense layers, attention and everything else as above (`sliding_window_layers` attend to
the last `sliding_window` keys only; Gated DeltaNet layers: `optimizer.latency.gdn`).

A multi-head latent attention shape (`ModelShape.mla`) is priced as `optimizer.latency.mla`
says: by vLLM's measured MLA block when the model has it for the shape's dims and formats
(the block then holds the layer's q/kv projections, RoPE and o_proj), else by the
roofline at its latent dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from optimizer.dims import GEMM_OPS, RankDims, sample_nk
from optimizer.engines import LEGACY_RULES, StepRules
from optimizer.latency import dsa, gdn, mla, moe
from optimizer.latency.features import (
    A2A_OPS,
    ALL_REDUCE_OPS,
    ATTENTION_OPS,
    FP8_DTYPE,
    GATHER_OPS,
    LOW_BIT_BYTES,
    OpBatch,
)
from optimizer.latency.iterations import (  # iteration_ms, iterations_ms: re-exported
    cuda_graph_padded,
    iteration_ms,  # noqa: F401
    iterations_ms,  # noqa: F401
)
from optimizer.latency.model import LatencyModel, OpModel, op_name
from optimizer.latency.roofline import RooflinePricer
from optimizer.parallel import DENSE_LAYOUT, ExpertLayout
from optimizer.records import OpKind
from optimizer.shapes import ModelShape


@dataclass(frozen=True, slots=True)
class Pricing:
    """Prices the operators of one (model shape, accelerator, TP degree)."""

    shape: ModelShape
    tp: int
    roofline: RooflinePricer
    learned: LatencyModel | None = None
    rules: StepRules = LEGACY_RULES  # how the engine runs the operators
    kernel_scale: float = 1.0  # the engine's kernels in a sustained forward against the tables'
    # How a MoE shape's experts are split (dp attention ranks, expert parallelism).
    layout: ExpertLayout = DENSE_LAYOUT
    # How the dp ranks' tokens reach the experts (`moe.ALL2ALL_BACKENDS`; vLLM's default).
    all2all: str = moe.DEFAULT_ALL2ALL
    # One rank's share of the shape, in the profiler's per-op conventions (derived).
    dims: RankDims = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # RankDims.of checks that tp splits heads, KV heads and the MLP evenly.
        object.__setattr__(self, "dims", RankDims.of(self.shape, self.tp))
        moe.check_layout(self.shape, self.tp, self.layout)
        if self.all2all not in moe.ALL2ALL_BACKENDS:
            raise ValueError(f"all2all {self.all2all!r}: expected one of {moe.ALL2ALL_BACKENDS}")

    # -- which source prices an operator ------------------------------------------
    def weight_format(self, op: OpKind) -> str:
        """The format `op` runs in for this shape: "", "fp8" or a 4-bit weight format (the
        projections' and the experts' weights; attention's KV cache; see the docstring)."""
        shape = self.shape
        if op in GEMM_OPS:  # the projections; not the LM head
            if shape.quantized_scope == "experts":
                return ""
            return "" if shape.quantization == "none" else shape.quantization
        if op is OpKind.MOE:
            return "" if shape.quantization == "none" else shape.quantization
        if op in ATTENTION_OPS:
            return FP8_DTYPE if shape.kv_cache_dtype == "fp8" else ""
        return ""

    def is_fp8(self, op: OpKind) -> bool:
        """Whether `op` runs in FP8 for this shape (see the module docstring)."""
        return self.weight_format(op) == FP8_DTYPE

    def _widths(self, op: OpKind) -> dict[str, object]:
        """The element sizes `op` moves its weights or KV cache at (None: activations')
        and its 4-bit weight format ("" for none)."""
        shape, fmt = self.shape, self.weight_format(op)
        weights = None
        if op in GEMM_OPS or op is OpKind.MOE:  # unquantised: the activations' width
            weights = LOW_BIT_BYTES.get(fmt) or (
                1.0 if fmt == FP8_DTYPE else float(shape.dtype_bytes)
            )
        return {
            "weight_dtype_bytes": weights,
            "kv_dtype_bytes": float(shape.kv_dtype_bytes) if op in ATTENTION_OPS else None,
            "weight_format": fmt if fmt in LOW_BIT_BYTES else "",
        }

    def _learned(self, op: OpKind, fmt: str) -> OpModel | None:
        if self.learned is None:
            return None
        return self.learned.op_model(op, fmt)

    def _source(self, op: OpKind) -> tuple[OpKind, OpModel | None]:
        """(op kind to price with, learned model in the op's format or None for the
        roofline)."""
        fmt = self.weight_format(op)
        own = self._learned(op, fmt)
        if op in GEMM_OPS or op is OpKind.LM_HEAD:
            if own is not None and self.shape.name in own.models:
                return op, own
            generic = self._learned(OpKind.GEMM, fmt)
            if generic is not None:
                return OpKind.GEMM, generic
            return op, own  # another shape's per-model GEMM: n/k features still apply
        if op in ALL_REDUCE_OPS and own is not None and self.tp not in own.num_gpus:
            return op, None
        if op in GATHER_OPS and own is not None and moe.exchange_gpus(self) not in own.num_gpus:
            return op, None  # the dp exchange's group (`moe`) measured at other sizes only
        if op in ATTENTION_OPS and self.shape.mla is not None:
            return op, None  # MLA: the roofline at its latent dimensions (`mla`)
        if op in A2A_OPS and own is not None and self.layout.ep_size(self.tp) not in own.num_gpus:
            return op, None  # measured at other EP sizes only
        return op, own

    def measured(self, op: OpKind) -> bool:
        """Whether a learned model prices `op` here (else the roofline does)."""
        return self._source(op)[1] is not None

    def all_reduce_kinds(self) -> tuple[OpKind, OpKind]:
        """(in a CUDA graph, eager): vLLM's own all-reduce when the rules say so and the
        model measured it at this TP degree, else NCCL's for both."""
        if self.rules.vllm_all_reduce and self.learned is not None:
            graph = self.learned.op_model(OpKind.VLLM_ALL_REDUCE)
            eager = self.learned.op_model(OpKind.VLLM_ALL_REDUCE_EAGER)
            measured = graph is not None and eager is not None
            if measured and self.tp in graph.num_gpus and self.tp in eager.num_gpus:
                return OpKind.VLLM_ALL_REDUCE, OpKind.VLLM_ALL_REDUCE_EAGER
        return OpKind.ALL_REDUCE, OpKind.ALL_REDUCE

    def estimated_ops(self) -> tuple[str, ...]:
        """Operators priced by the roofline for this shape and TP degree (quantised ones as
        "<op>:fp8", "<op>:fp4" ...), and the parts of a MoE shape priced by assumption
        alone (`moe.estimated_parts`)."""
        ops = [*GEMM_OPS, OpKind.LM_HEAD, OpKind.NORM, OpKind.ADD, OpKind.ACTIVATION]
        ops += [OpKind.ROPE, OpKind.EMBEDDING, OpKind.PREFILL_ATTN, OpKind.DECODE_ATTN]
        if self.tp > 1 or self.layout.num_gpus(self.tp) > 1:
            ops += sorted(set(self.all_reduce_kinds()))
        ops += moe.priced_ops(self)
        if mla.block_models(self) is not None:  # priced by the measured MLA block
            ops = [op for op in ops if op not in mla.BLOCK_OPS | mla.BLOCK_ATTENTION]
        names = [op_name(op, self.weight_format(op)) for op in ops if self._source(op)[1] is None]
        if self.shape.mla is not None:
            names = [f"{n}:mla" if n.split(":")[0] in ATTENTION_NAMES else n for n in names]
        dsa_decode = dsa.decode_label(self) if self.shape.dsa is not None else None
        if dsa_decode is not None:  # the measured DSA block decodes inside its grid (`dsa`)
            names = [dsa_decode if n.startswith("decode_attn") else n for n in names]
        if self.shape.gdn is not None:  # all of a GDN op, or beyond its measured grid
            names += gdn.estimated(self)
        if self.shape.dsa is not None:
            names.append("dsa_indexer")
        return (*names, *moe.estimated_parts(self))

    @property
    def scale(self) -> float:
        """How much slower operators run in a whole forward than alone: the model's own
        fitted scale (whole-step measurements), times the engine's (`kernel_scale`)."""
        own = 1.0 if self.learned is None else self.learned.op_scale
        return own * self.kernel_scale

    def price_ms(self, op: OpKind, **params: object) -> np.ndarray:
        """One operator as it runs inside a step (its isolated time x `scale`)."""
        kind, model = self._source(op)
        act, widths = float(self.shape.dtype_bytes), self._widths(op)
        if model is None:
            alone = self.roofline.predict_ms(OpBatch.make(op, act, **widths, **params))
        else:
            alone = np.maximum(model.predict_ms(OpBatch.make(kind, act, **widths, **params)), 1e-6)
        return alone * self.scale if self.scale != 1.0 else alone

    # -- per-step components, vectorised over token counts ----------------------------
    def _nk(self, op: OpKind) -> dict[str, int]:
        """The (n, k) of `op` on one rank, as the profiler records it (`optimizer.dims`)."""
        n, k = sample_nk(op, self.dims)
        return {"n": n, "k": k}

    def dense_ms(self, num_tokens: np.ndarray) -> np.ndarray:
        """Token-parallel work of one step (all layers, embedding, final norm), ms."""
        m = np.asarray(num_tokens, dtype=np.float64)
        rules = self.rules
        if rules.cuda_graph_tokens:
            m = cuda_graph_padded(m, rules.cuda_graph_tokens)
        nk = self._nk
        once = self.price_ms(OpKind.EMBEDDING, num_tokens=m, **nk(OpKind.EMBEDDING))
        once = once + self.price_ms(OpKind.NORM, num_tokens=m, **nk(OpKind.NORM))
        spec = self.shape.moe
        if self.shape.gdn is not None:
            return gdn.layers_ms(self, m) + once
        if spec is None:
            return self.shape.num_layers * self.layer_ms(m) + once
        num_moe = spec.num_moe_layers(self.shape.num_layers)
        moe_layer = self.layer_ms(m, mlp=False) + moe.moe_block_ms(self, m)
        total = num_moe * moe_layer
        num_dense = self.shape.num_layers - num_moe
        if num_dense:
            total = total + num_dense * self.layer_ms(m)
        return total + once

    def forward_outside_experts_ms(self) -> float:
        """A one-token forward (all layers, LM head) without its MoE blocks, ms: what the
        engine's exposed time per sequence scales with (`EngineOverhead.per_seq_forward`)."""
        one = np.ones(1)
        total = self.dense_ms(one) + self.lm_head_ms(one)
        spec = self.shape.moe
        if spec is not None:
            total = total - spec.num_moe_layers(self.shape.num_layers) * moe.moe_block_ms(self, one)
        return float(total[0])

    def layer_ms(
        self,
        m: np.ndarray,
        mlp: bool = True,
        tp_reduces: int = 2,
        attention: bool = True,
        unfused_reduces: int = 0,
    ) -> np.ndarray:
        """One layer's token-parallel work over `m` (padded) tokens: with `attention` its
        projections and RoPE, the elementwise ops, `tp_reduces` TP all-reduces and, with
        `mlp`, the dense MLP (a MoE layer's experts are `moe.moe_block_ms`, a GDN layer's
        projections `gdn.block_ms`). `unfused_reduces` of the all-reduces keep their add +
        RMSNorm apart where the FlashInfer pass fuses the others (`unfused_reduce_ms`)."""
        rules = self.rules
        nk = self._nk
        ops = (*GEMM_OPS[:2], OpKind.ROPE) if attention else ()
        ops = (*ops, *GEMM_OPS[2:]) if mlp else ops
        dsa_block = self.shape.dsa is not None and dsa.decode_block(self) is not None
        if mla.block_models(self) is not None or dsa_block:  # the block prices them
            ops = tuple(op for op in ops if op not in mla.BLOCK_OPS)
        layer = sum(self.price_ms(op, num_tokens=m, **nk(op)) for op in ops)
        if attention and self.shape.dsa is not None and not dsa_block:  # the indexer's
            layer = layer + self._indexer_projections_ms(m)  # projections (`dsa`)
        norm_n = nk(OpKind.NORM)["n"]
        act_n = nk(OpKind.ACTIVATION)["n"]
        if rules.fused_elementwise:
            # add + RMSNorm (reads x and the residual, writes both) twice; SiLU-and-mul
            # (reads the gate and up halves, writes one)
            add_norm = self.price_ms(OpKind.NORM, num_tokens=m, n=2 * norm_n, k=0)
            if mlp:
                layer = layer + self.price_ms(OpKind.ACTIVATION, num_tokens=m, n=1.5 * act_n, k=0)
        else:
            add_norm = self.price_ms(OpKind.NORM, num_tokens=m, n=norm_n, k=0)
            add_norm = add_norm + self.price_ms(OpKind.ADD, num_tokens=m, **nk(OpKind.ADD))
            if mlp:
                layer = layer + self.price_ms(
                    OpKind.ACTIVATION, num_tokens=m, **nk(OpKind.ACTIVATION)
                )
        if self.tp > 1 and tp_reduces:
            msg = m * self.shape.hidden_size * self.shape.dtype_bytes
            graph, eager = self.all_reduce_kinds()
            common = {"num_gpus": self.tp, "message_bytes": msg, "num_tokens": m}
            reduce = self.price_ms(graph, **common)
            if eager is not graph:
                in_graph = m <= max(rules.cuda_graph_tokens, 0)
                reduce = np.where(in_graph, reduce, self.price_ms(eager, **common))
            family = self.roofline.accelerator.family
            limit = rules.fused_norm_limit_bytes(family, self.tp)
            if limit:
                # One FlashInfer kernel does the all-reduce, the residual add and the
                # RMSNorm. Up to its one-shot size it is priced by the measured
                # all-reduce's latency and bandwidth (`one_shot_all_reduce_ms`), beyond
                # (two-shot) as the measured all-reduce itself.
                one_shot = rules.fused_norm_limit_bytes(family, self.tp, one_shot=True)
                fused = self.one_shot_all_reduce_ms(msg, graph)
                u = min(unfused_reduces, tp_reduces)
                layer = layer + u * (reduce + add_norm)
                reduce = np.where(msg <= one_shot, fused, reduce)
                add_norm = np.where(msg <= limit, 0.0, add_norm)
                return layer + (tp_reduces - u) * reduce + (2 - u) * add_norm
            layer = layer + tp_reduces * reduce
        return layer + 2 * add_norm

    def unfused_reduce_ms(self, m: np.ndarray) -> np.ndarray:
        """What one block end over `m` tokens costs beyond its fused price when its TP
        all-reduce is out of the FlashInfer pass's pattern, so the all-reduce and the
        residual add + RMSNorm after it stay two kernels (0 where nothing is fused): the
        fused MoE's output reduce (inside `moe_forward`, or the shared and routed outputs
        reduced apart and summed, by release: docs/moe.md)."""
        fused = self.layer_ms(m, mlp=False, attention=False, tp_reduces=1)
        apart = self.layer_ms(m, mlp=False, attention=False, tp_reduces=1, unfused_reduces=1)
        return apart - fused

    def _indexer_projections_ms(self, m: np.ndarray) -> np.ndarray:
        """A DSA layer's indexer projections over `m` tokens, replicated on every TP rank:
        wq_b (query latent to heads x dim), wk (hidden to one key) and weights_proj."""
        spec, shape = self.shape.dsa, self.shape
        assert spec is not None and shape.mla is not None
        h, heads, dim = shape.hidden_size, spec.index_n_heads, spec.index_head_dim
        total = self.price_ms(OpKind.QKV_PROJ, num_tokens=m, n=heads * dim, k=shape.mla.q_lora_rank)
        total = total + self.price_ms(OpKind.QKV_PROJ, num_tokens=m, n=dim, k=h)
        return total + self.price_ms(OpKind.QKV_PROJ, num_tokens=m, n=heads, k=h)

    def dsa_projections_ms(self, m: np.ndarray) -> np.ndarray:
        """A DSA layer's projections over `m` tokens, the measured DSA block's share of the
        token-parallel work (`dsa`): q/kv and output projections, RoPE, the indexer's."""
        m = np.asarray(m, dtype=np.float64)
        total = sum(self.price_ms(op, num_tokens=m, **self._nk(op)) for op in mla.BLOCK_OPS)
        return total + self._indexer_projections_ms(m)

    def one_shot_all_reduce_ms(self, message_bytes: np.ndarray, kind: OpKind) -> np.ndarray:
        """An all-reduce priced by `kind`'s measured latency and bandwidth alone: its time
        for one token's message plus the bytes at the rate it reaches on large messages
        (a straight line between the two ends of the measured curve, without the steps
        where vLLM's custom all-reduce switches algorithm)."""
        one = float(self.shape.hidden_size * self.shape.dtype_bytes)
        big = float(ONE_SHOT_SPAN_BYTES)
        ends = self.price_ms(
            kind, num_gpus=self.tp, message_bytes=np.array([one, big]), num_tokens=1.0
        )
        per_byte = max(float(ends[1] - ends[0]), 0.0) / (big - one)
        return ends[0] + per_byte * (np.asarray(message_bytes, dtype=np.float64) - one)

    def lm_head_ms(self, num_logits: np.ndarray) -> np.ndarray:
        m = np.asarray(num_logits, dtype=np.float64)
        return self.price_ms(OpKind.LM_HEAD, num_tokens=m, **self._nk(OpKind.LM_HEAD))

    def _heads(self, decode: bool = False) -> dict[str, object]:
        if self.shape.mla is not None:
            return mla.mla_heads(self.shape, self.tp, decode)
        d = self.dims
        return {"num_heads": d.heads, "num_kv_heads": d.kv_heads, "head_dim": d.head_dim}

    def _prefill_layer_ms(self, q: np.ndarray, kv: np.ndarray) -> np.ndarray:
        block = mla.block_models(self)
        if block is not None:
            return mla.module_prefill_ms(self, block[0], q, kv)
        model = self._source(OpKind.PREFILL_ATTN)[1]
        if model is not None and model.square_attention:
            # Measured without a cached prefix: price the square problem of equal work.
            q = kv = np.sqrt(np.maximum(q * (2.0 * kv - q + 1.0), 1.0))
        return self.price_ms(
            OpKind.PREFILL_ATTN, batch_size=1, q_len=q, kv_len=kv, num_tokens=q, **self._heads()
        )

    def prefill_attn_ms(self, q_len: np.ndarray, kv_len: np.ndarray) -> np.ndarray:
        """One chunk of q_len queries over kv_len keys (kv includes the chunk), all layers.

        A sliding-window layer (window W) is priced as q / W pieces of W queries
        over 2W keys when the chunk is longer than W, else as the chunk over at most
        q + W keys (the keys its queries can see)."""
        q = np.asarray(q_len, dtype=np.float64)
        kv = np.maximum(np.asarray(kv_len, dtype=np.float64), q)
        window = self.shape.sliding_window_layers
        full = self.shape.num_full_attention_layers - window
        if self.shape.gdn is not None:  # a GDN layer's chunk reads its state, not the prefix
            linear = self.shape.num_layers - self.shape.num_full_attention_layers
            return full * self._prefill_layer_ms(q, kv) + linear * gdn.chunk_ms(self, q)
        spec = self.shape.dsa
        if spec is not None:  # each query reads index_topk keys at most, and the indexer
            share = dsa.sparse_share(q, kv, spec.index_topk)
            attention = self._prefill_layer_ms(q, kv) * share
            attention = attention + dsa.indexer_prefill_ms(self, q, kv)
            if dsa.decode_block(self) is not None:  # its projections left layer_ms
                attention = attention + self.dsa_projections_ms(q)
            return full * attention
        if not window:
            return full * self._prefill_layer_ms(q, kv)
        w = float(self.shape.sliding_window)
        q_w = np.minimum(q, w)
        pieces = np.maximum(q / w, 1.0)
        windowed = pieces * self._prefill_layer_ms(q_w, np.minimum(kv, q_w + w))
        return full * self._prefill_layer_ms(q, kv) + window * windowed

    def decode_attn_ms(
        self, num_seqs: np.ndarray, kv_mean: np.ndarray, decode_q: int = 1
    ) -> np.ndarray:
        """`num_seqs` decoding sequences of mean KV length `kv_mean`, all layers (a
        sliding-window layer reads at most its window of keys).

        Verification (decode_q = K+1) scales the measured decode kernel by the
        roofline's ratio of K+1 to 1 query positions.
        """
        b = np.maximum(np.asarray(num_seqs, dtype=np.float64), 1.0)
        kv = np.maximum(np.asarray(kv_mean, dtype=np.float64), 1.0)
        window = self.shape.sliding_window_layers
        full = self.shape.num_full_attention_layers - window
        spec = self.shape.dsa
        if spec is not None:  # index_topk keys at most a sequence, and the indexer
            per = self._decode_layer_ms(b, np.minimum(kv, float(spec.index_topk)), decode_q)
            per = per + dsa.indexer_decode_ms(self, b, kv, decode_q)
            block = dsa.decode_block(self)
            if block is None:
                return full * per
            seqs = b * float(decode_q)  # K+1 queries a sequence as K+1 sequences (`dsa`)
            measured = dsa.block_decode_ms(self, block[0], seqs, kv)
            per = per + self.dsa_projections_ms(seqs)  # outside the grid: the estimate
            return full * np.where(dsa.decode_inside(block[1], seqs, kv), measured, per)
        per = self._decode_layer_ms(b, kv, decode_q)
        if self.shape.gdn is not None:  # decode_q positions update the state in turn
            linear = self.shape.num_layers - self.shape.num_full_attention_layers
            return full * per + linear * decode_q * gdn.decode_ms(self, b)
        if not window:
            return full * per
        kv_w = np.minimum(kv, float(self.shape.sliding_window))
        return full * per + window * self._decode_layer_ms(b, kv_w, decode_q)

    def _decode_layer_ms(self, b: np.ndarray, kv: np.ndarray, decode_q: int) -> np.ndarray:
        block = mla.block_models(self)
        if block is not None:
            return mla.module_decode_ms(self, block[1], b, kv, decode_q)
        per = self.price_ms(
            OpKind.DECODE_ATTN,
            q_len=1,
            batch_size=b,
            kv_len=kv,
            num_tokens=b,
            **self._heads(decode=True),
        )
        if decode_q > 1:
            per = per * self.verify_ratio(b, kv, decode_q)
        return per

    def verify_ratio(self, num_seqs: np.ndarray, kv_mean: np.ndarray, decode_q: int) -> np.ndarray:
        """Roofline cost of decode_q query positions relative to one (16-bit queries, the
        shape's KV format); for the measured MLA block, the block's."""
        block = mla.block_models(self)
        if block is not None:  # the measured MLA block's own ratio (`mla`)
            one = mla.module_decode_ms(self, block[1], num_seqs, kv_mean, 1)
            return mla.module_decode_ms(self, block[1], num_seqs, kv_mean, decode_q) / one
        common = {"batch_size": num_seqs, "kv_len": kv_mean, "num_tokens": num_seqs}
        common |= self._heads(decode=True)
        # The KV width relative to 16-bit queries: 2.0 (as it always was) unless FP8.
        kv = 2.0 * self.shape.kv_dtype_bytes / self.shape.dtype_bytes
        one = OpBatch.make(OpKind.DECODE_ATTN, 2.0, kv_dtype_bytes=kv, q_len=1, **common)
        many = OpBatch.make(OpKind.VERIFY_ATTN, 2.0, kv_dtype_bytes=kv, q_len=decode_q, **common)
        return self.roofline.predict_ms(many) / self.roofline.predict_ms(one)


ATTENTION_NAMES = frozenset(op.value for op in ATTENTION_OPS)
ONE_SHOT_SPAN_BYTES = 1 << 28  # where the bandwidth of a measured all-reduce is read
