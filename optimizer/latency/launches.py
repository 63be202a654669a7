"""The host's side of a step: kernel launches outside CUDA graphs (vLLM V1).

vLLM V1 runs a step in one of three ways (`CompilationConfig.cudagraph_mode`
FULL_AND_PIECEWISE, the default):

- a decode-only step of at most the largest capture size (512 tokens) replays one
  captured CUDA graph: the host launches next to nothing;
- a step with prefill chunks of at most that size replays *piecewise* graphs, the model
  split at its attention operators (`CompilationConfig.splitting_ops`: unified attention,
  MLA, `gdn_attention_core`, ...). The pieces replay from graphs; the splitting operators
  run eagerly, and the host launches each of their kernels;
- a larger step runs without graphs: the host launches every kernel of the forward.

Each launch costs the host time (Python, the dispatcher, Triton's launcher, the driver),
while the GPU runs what it was given. A forward whose GPU work is shorter than the host's
launches lasts as long as the launches: `max(GPU, launches x per-launch time)`. For a
dense 32B model at 8 GPUs, or a MoE of 3B active parameters at any TP degree, that is
most of a prefill step. The per-launch time is the engine generation's
(`EngineGeneration.host_launch_s`), fitted on measured steps; the counts below are read
off vLLM's model code (0.20), per layer, with what runs outside piecewise graphs in
parentheses:

- GQA attention, 5: QKV GEMM, the QK norms and RoPE (one Inductor kernel: `custom_ops`
  none), the KV-cache write, attention, output GEMM (the KV-cache write and attention: 2).
  Qwen3.5's output gate adds its sigmoid-multiply, 1.
- MLA attention, 10: q_a, q norm, q_b, kv_a, kv norm, RoPE, KV-cache write, attention as
  two kernels (latent absorb, attend), output GEMM (KV-cache write and attention: 3).
- DeepSeek sparse attention adds its indexer to MLA's, 12: wq_b, wk, the key norm, RoPE,
  weights_proj, the query's FP8 quantisation and, in `sparse_attn_indexer` (a splitting
  op: outside the graphs, 5), the key's quantise-and-cache, the index buffer's fill, and
  per prefill chunk the key gather, the FP8 MQA logits and the per-row top-k.
- Gated DeltaNet (`gdn_linear_attn.py`), 7 + its core: in_proj_qkvz, in_proj_ba, two
  copies to contiguous b and a, the zeroed output, the gated RMSNorm, out_proj. The core
  (`gdn_attention_core`, all outside the graphs), 20: the causal conv1d, three copies to
  contiguous q/k/v, the gating, the initial state's gather and the zeroing of new
  sequences' (3), FLA's chunked delta rule (two L2 norms, cumsum, KK^T, triangular
  solve, W/U, state recurrence, output: 8), the final state's scatter, the output copy.
- Dense MLP, 3: gate/up GEMM, SiLU-and-mul, down GEMM.
- MoE MLP, 8: router GEMM, top-k, token-to-expert alignment, the output's zeroing, two
  expert GEMMs, activation, weighted sum; shared experts 5 more (gate/up, activation,
  down, their gate's GEMM, gate-multiply-add). With dp > 1 the experts' tokens come and go
  through vLLM's default all2all (`AgRsAll2AllManager`): the hidden states, top-k weights
  and ids are all-gathered and the output reduce-scattered, and PyNccl's variable-size
  gather and scatter call NCCL once per rank of the group: 4 x dp (DeepEP's dispatch and
  combine: 2). With sequence-parallel MoE (`ExpertLayout.sequence_parallel`: EP, dp > 1,
  tp > 1) the group is the tp x dp EP group, and the output's all-gather over tp adds 1.
- Each block's end: the residual add + RMSNorm, and with tp > 1 the all-reduce before it.
  Where FlashInfer fuses the two (vLLM >= 0.17, small messages) the count keeps two.

Plus the embedding, final norm and LM head once, and one graph replay per piece in a
piecewise step. The sampler runs eagerly in every step: it is part of the engine's CPU
work per step (`EngineGeneration.cpu`), not counted here.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.engines import StepRules
from optimizer.latency.moe import DEFAULT_ALL2ALL
from optimizer.parallel import ExpertLayout
from optimizer.shapes import ModelShape

GQA_ATTENTION = 5  # QKV GEMM, QK norms + RoPE, KV-cache write, attention, output GEMM
GQA_SPLIT = 2  # KV-cache write, attention: outside the piecewise graphs
OUTPUT_GATE = 1  # Qwen3.5's gated attention output
MLA_ATTENTION = 10
MLA_SPLIT = 3
DSA_INDEXER = 12  # a sparse-attention layer's indexer (`dsa`)
DSA_SPLIT = 5  # sparse_attn_indexer: outside the piecewise graphs
GDN_PROJECTIONS = 7  # in_proj_qkvz, in_proj_ba, 2 copies, zeroed output, gated norm, out_proj
GDN_CORE = 20  # gdn_attention_core: all of it outside the piecewise graphs
DENSE_MLP = 3
MOE_MLP = 8
SHARED_EXPERTS = 5
DP_EXCHANGE = 4  # per dp rank: 3 tensors all-gathered, 1 reduce-scattered (PyNccl v-ops)
DEEPEP_EXCHANGE = 2  # DeepEP's dispatch and combine kernels
ONCE = 3  # embedding, final norm, LM head


@dataclass(frozen=True, slots=True)
class HostFloor:
    """The least time a step's forward takes because of the host's launches (seconds):
    `piecewise_s` for a step with prefill chunks of at most `graph_tokens` tokens,
    `eager_s` for any larger step; a decode-only step within `graph_tokens` replays one
    graph (no floor). `graph_tokens` 0: no floor at all (an engine priced without it)."""

    graph_tokens: int = 0
    piecewise_s: float = 0.0
    eager_s: float = 0.0

    def floor_s(self, num_tokens: int, has_prefill: bool) -> float:
        if not self.graph_tokens:
            return 0.0
        if num_tokens > self.graph_tokens:
            return self.eager_s
        return self.piecewise_s if has_prefill else 0.0


NO_HOST_FLOOR = HostFloor()


@dataclass(frozen=True, slots=True)
class LaunchCount:
    """Kernel launches of one forward: eagerly, and in a piecewise-graph step."""

    eager: int
    piecewise: int


def count_launches(
    shape: ModelShape, tp: int, layout: ExpertLayout, all2all: str = DEFAULT_ALL2ALL
) -> LaunchCount:
    """The host's kernel launches of one forward of `shape` on one GPU (module table), the
    dp ranks' tokens exchanged by `all2all` (`moe.ALL2ALL_BACKENDS`)."""
    block_end = 2 if tp > 1 else 1  # (all-reduce +) add + RMSNorm
    gdn = 0 if shape.gdn is None else shape.gdn.num_layers
    full = shape.num_layers - gdn
    if shape.mla is not None:
        attention, split = MLA_ATTENTION, MLA_SPLIT
    else:
        attention, split = GQA_ATTENTION, GQA_SPLIT
    if shape.attn_output_gate:
        attention += OUTPUT_GATE
    if shape.dsa is not None:
        attention, split = attention + DSA_INDEXER, split + DSA_SPLIT
    eager = full * (attention + block_end) + gdn * (GDN_PROJECTIONS + GDN_CORE + block_end)
    piecewise = full * split + gdn * GDN_CORE + shape.num_layers + 1  # + graph replays
    moe = shape.moe
    num_moe = 0 if moe is None else moe.num_moe_layers(shape.num_layers)
    mlp = MOE_MLP + (SHARED_EXPERTS if moe is not None and moe.shared_intermediate_size else 0)
    if layout.dp > 1:
        group = layout.ep_size(tp) if layout.sequence_parallel(tp) else layout.dp
        mlp += DEEPEP_EXCHANGE if all2all == "deepep" else DP_EXCHANGE * group
    if layout.sequence_parallel(tp):
        mlp += 1  # the output's all-gather over tp
    eager += num_moe * (mlp + block_end) + (shape.num_layers - num_moe) * (DENSE_MLP + block_end)
    return LaunchCount(eager + ONCE, piecewise)


def host_floor(
    shape: ModelShape,
    tp: int,
    layout: ExpertLayout,
    rules: StepRules,
    host_launch_s: float,
    all2all: str = DEFAULT_ALL2ALL,
) -> HostFloor:
    """The host floor of a table priced with `rules` at `host_launch_s` per launch (none
    without CUDA graphs in the rules or without a per-launch time)."""
    if not rules.cuda_graph_tokens or host_launch_s <= 0.0:
        return NO_HOST_FLOOR
    n = count_launches(shape, tp, layout, all2all)
    return HostFloor(rules.cuda_graph_tokens, n.piecewise * host_launch_s, n.eager * host_launch_s)
