"""Serving engines and their generations: how a release of vLLM or SGLang runs one step.

A deployment names its engine and version (`ServingConfig.engine`, `engine_version`;
default: the engine's `CURRENT` line). A version belongs to a *generation*, and each generation is
priced by its own rules, each from vLLM's source, and its own step overhead,
calibrated only on measurements of that generation:

- `vllm-v0` (< 0.8): synchronous; separate elementwise kernels and NCCL all-reduces;
  overhead calibrated on 754 offline batch runs of vLLM 0.5-0.6 (LLM-Inference-Bench).
- `vllm-v1` (0.8 - 0.13): synchronous; torch.compile fusion, vLLM's all-reduce, CUDA
  graphs; overhead calibrated on closed-loop runs of vLLM 0.12 (the development set's
  training half).
- `vllm-v1-async` (>= 0.14): asynchronous; the same rules, plus the FlashInfer
  all-reduce + RMSNorm fusion from 0.17; overhead calibrated on per-step timings of
  vLLM 0.20.1 on B300.
- `sglang` (SGLang >= 0.4): its overlap scheduler (asynchronous, on by default), sgl-kernel's
  fused residual add + RMSNorm and SiLU-and-mul, its own custom all-reduce (measured by
  AIConfigurator's `comm/sglang` tables, in a CUDA graph and eagerly), CUDA graphs for
  steps of up to `SGLANG_CUDA_GRAPH_TOKENS` tokens. Not calibrated: no measured SGLang
  serving run is at hand, so its step costs its kernels alone, no engine overhead, and
  every output says so (`EngineGeneration.calibrated_on`).

What the rules mean (`StepRules`):

- `fused_elementwise`: V1 compiles the model with torch.compile (`custom_ops: none`),
  so Inductor fuses each residual add with the RMSNorm after it and SiLU with the
  multiply; a layer runs 4 elementwise kernels (add+norm twice, SiLU-and-mul, RoPE)
  instead of 6 separate ones.
- `vllm_all_reduce`: a TP all-reduce goes through vLLM's communicator, which picks its
  custom all-reduce, symmetric memory or NCCL by message size; AIConfigurator's
  `comm/vllm` tables measure that very call, inside a CUDA graph and eagerly.
- `cuda_graph_tokens`: steps of at most this many tokens run in CUDA graphs captured
  at the sizes 1, 2, 4, 8, 16, ..., 256, then every 16 up to 512 (a step is padded up to
  the next one); larger steps run eagerly. vLLM's default largest capture size is
  min(2 x max_num_seqs, 512); servetune tabulates one table per GPU and TP degree, so it
  takes 512, the default for max_num_seqs >= 256.
- `fused_allreduce_norm`: vLLM >= 0.17 at its default optimisation level replaces an
  all-reduce and the residual add + RMSNorm after it with one FlashInfer kernel for
  messages up to a limit per GPU and TP degree (`ALLREDUCE_NORM_FUSION_MB`).
- asynchronous scheduling (>= 0.14): the scheduler plans step n+1 while the GPU runs
  step n. Its CPU work is hidden behind the GPU (a step lasts max(GPU + the exposed
  part, CPU)), and a request that arrives during step n is first scheduled in step n+2.
  vLLM turns it off for speculation with a separate draft model or n-gram lookup.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

ENGINES = ("vllm", "sglang")
CURRENT_VLLM = "0.20"  # the release line `engine_version` defaults to (its per-step data)
CURRENT_SGLANG = "0.5.14"  # the release AIConfigurator's SGLang tables measured
CURRENT = {"vllm": CURRENT_VLLM, "sglang": CURRENT_SGLANG}  # by engine
ENGINE_TITLES = {"vllm": "vLLM", "sglang": "SGLang"}

# FlashInfer all-reduce + RMSNorm fusion limits (MB of message) by compute capability and
# TP degree, vLLM 0.17-0.20 (`compilation/collective_fusion.py`); no entry: not fused.
ALLREDUCE_NORM_FUSION_MB: dict[str, dict[int, float]] = {
    "9.0": {2: 64.0, 4: 2.0, 8: 0.5},
    "10.0": {2: 64.0, 4: 32.0, 8: 1.0},
    "10.3": {2: 64.0, 4: 64.0, 8: 2.0},
}
# ... of which FlashInfer runs messages up to these sizes one-shot (each GPU pushes its
# message to the others), larger ones two-shot (`_FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB`).
ALLREDUCE_ONE_SHOT_MB: dict[str, dict[int, float]] = {
    "9.0": {2: 32.0, 4: 2.0, 8: 0.5},
    "10.0": {2: 32.0, 4: 4.0, 8: 1.0},
    "10.3": {2: 32.0, 4: 4.0, 8: 2.0},
}
# Compute capability of the accelerator presets whose chips vLLM fuses for (vLLM keys the
# limits by the device's capability: a GB200 reports 10.0 as a B200 does, a GB300 10.3;
# the RTX PRO 6000's 12.0 has no entry, so it is not fused).
COMPUTE_CAPABILITY = {
    "h100": "9.0",
    "h200": "9.0",
    "gh200": "9.0",
    "b200": "10.0",
    "b300": "10.3",
    "gb200": "10.0",
    "gb300": "10.3",
}

CUDA_GRAPH_MAX_TOKENS = 512
# SGLang captures decode batches up to --cuda-graph-max-bs, which it sizes by GPU memory
# and TP degree; servetune tabulates one table per GPU and TP and takes 256 (its value on
# 80 GB-class GPUs at small TP). SGLang runs prefill and mixed steps eagerly: servetune's
# tables are by token count, so a small prefill step is priced as if captured (its
# all-reduce from the graph table), an approximation that errs on small steps only.
SGLANG_CUDA_GRAPH_TOKENS = 256


# ----------------------------------------------------------------------------- overhead
# The engine's own time per step, beside the GPU kernels. Each vLLM step spends CPU time
# the operator tables never see: the scheduler walks the running and waiting queues, the
# model runner builds the input tensors for every sequence and token, the sampler and the
# output processor handle every sequence's new token. Part of it is fixed per step, part
# grows with the sequences in the batch and part with the tokens:
#
#     overhead(step) = base_s + per_seq_s x sequences + per_token_s x tokens
#
# A synchronous engine's GPU waits for all of it; with async scheduling most of it runs
# while the GPU computes the previous step (`EngineGeneration.cpu`).


@dataclass(frozen=True, slots=True)
class EngineOverhead:
    """Per-step engine time in seconds: base + per sequence + per scheduled token.

    `per_seq_forward` is a share, not seconds: each sequence adds that share of the
    model's one-token forward outside its MoE blocks (`CompiledStepLatency.forward_s`),
    work that grows with the batch where the operator tables are flat. A compiled table
    holds it `resolved` into `per_seq_s` for its shape and TP degree."""

    base_s: float = 0.0
    per_seq_s: float = 0.0
    per_token_s: float = 0.0
    per_seq_forward: float = 0.0

    def __post_init__(self) -> None:
        for name in ("base_s", "per_seq_s", "per_token_s", "per_seq_forward"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"EngineOverhead.{name} must be a finite number >= 0, got {value!r}"
                )

    @classmethod
    def constant(cls, seconds: float) -> EngineOverhead:
        return cls(base_s=float(seconds))

    def resolved(self, forward_s: float) -> EngineOverhead:
        """In seconds for a model whose one-token forward outside its MoE blocks lasts
        `forward_s`: `per_seq_forward` folded into `per_seq_s`."""
        if not self.per_seq_forward:
            return self
        per_seq = self.per_seq_s + self.per_seq_forward * forward_s
        return EngineOverhead(self.base_s, per_seq, self.per_token_s)

    def step_s(self, num_seqs: float, num_tokens: float) -> float:
        """Seconds for a step (`per_seq_forward` counts only once `resolved`)."""
        return self.base_s + self.per_seq_s * num_seqs + self.per_token_s * num_tokens

    def describe(self) -> str:
        parts = [f"{self.base_s * 1e3:.3f} ms/step"]
        if self.per_seq_s:
            parts.append(f"{self.per_seq_s * 1e6:.2f} us/sequence")
        if self.per_seq_forward:
            parts.append(
                f"{self.per_seq_forward:.2%} of the one-token forward (outside MoE blocks) "
                "per sequence"
            )
        if self.per_token_s:
            parts.append(f"{self.per_token_s * 1e9:.2f} ns/token")
        return " + ".join(parts)


NO_OVERHEAD = EngineOverhead()


class EngineError(ValueError):
    """An engine name or version servetune cannot price."""


@dataclass(frozen=True, slots=True)
class StepRules:
    """Which operators an engine fuses and how it runs them (module docstring)."""

    fused_elementwise: bool = False
    vllm_all_reduce: bool = False
    cuda_graph_tokens: int = 0  # steps up to this many tokens run in padded CUDA graphs
    fused_allreduce_norm: bool = False

    def fused_norm_limit_bytes(
        self, accelerator_family: str, tp: int, *, one_shot: bool = False
    ) -> float:
        """The largest all-reduce message fused with its add + RMSNorm (0: none), or with
        `one_shot` the largest of those FlashInfer reduces one-shot."""
        if not self.fused_allreduce_norm:
            return 0.0
        cc = COMPUTE_CAPABILITY.get(accelerator_family, "")
        limits = ALLREDUCE_ONE_SHOT_MB if one_shot else ALLREDUCE_NORM_FUSION_MB
        fused = ALLREDUCE_NORM_FUSION_MB.get(cc, {}).get(tp, 0.0)
        return min(limits.get(cc, {}).get(tp, 0.0), fused) * 1024 * 1024


LEGACY_RULES = StepRules()  # how the servetune reference engine and vLLM V0 are priced


@dataclass(frozen=True, slots=True)
class EngineGeneration:
    """A family of releases priced alike (module docstring).

    A step of this generation lasts `kernel_scale` x its kernels (the tables' isolated
    timings; a sustained forward runs its compute-bound kernels slower) + `overhead` (the
    engine work the GPU waits for even with async scheduling), + `cpu` (the scheduler's,
    input preparation's and output processing's work per step) for a synchronous engine;
    with async scheduling the CPU work overlaps the GPU's and a step lasts at least `cpu`.
    """

    key: str
    title: str
    first_version: tuple[int, ...]  # within `engine`'s releases
    rules: StepRules
    overhead: EngineOverhead
    cpu: EngineOverhead
    async_scheduling: bool
    calibrated_on: str
    # By accelerator preset (its chip): measured per-step timings / the tables' kernels.
    kernel_scales: tuple[tuple[str, float], ...] = ()
    # The host's time per kernel launch outside CUDA graphs: a forward lasts at least its
    # launches (`optimizer.latency.launches`); 0: not priced (not measured for the release).
    host_launch_s: float = 0.0
    # A Gated DeltaNet (Mamba) hybrid with prefix caching cuts its prompt chunks on its
    # block boundaries (vLLM's mamba_cache_mode "align", its default then:
    # `optimizer.sim.scheduler.BaseScheduler.aligned_chunk`).
    aligned_hybrid_prefill: bool = False
    engine: str = "vllm"  # whose releases these are
    calibrated: bool = True  # False: no measured run priced its overhead (none is added)

    def kernel_scale(self, accelerator_family: str) -> float:
        """The kernels' scale on this chip in a sustained forward (1 where unmeasured)."""
        return dict(self.kernel_scales).get(accelerator_family, 1.0)


# Fitted by benchmarks/bench_devset.py (see each `calibrated_on`). V0: non-negative least
# squares on relative error of the batch latency, kernel time from the AIConfigurator
# tables held fixed, on half the (GPU, TP, model, length) groups; on the other half the
# median error is 6.5% (A100), 9.4% (GH200), 5.7% (H100).
V0_OVERHEAD = EngineOverhead(base_s=1.32e-3, per_seq_s=76e-6, per_token_s=2.93e-6)
# V1 with async scheduling: fitted on the per-step timings of vLLM 0.20.1 on B300
# (benchmarks/step_fit.py). On every step of Qwen3-32B at TP 1/2/4/8, each (TP degree,
# step type) weighed alike: the kernels run 7.4% slower in the engine than the B300 tables
# measured them alone; each sequence adds 0.70% of the one-token forward outside MoE
# blocks that async scheduling does not hide (`EngineOverhead.per_seq_forward`: the work
# grows with the batch on the GPU where the tables are flat; Qwen3-32B's decode steps
# gain 125/49/31/21 us per sequence at TP 1/2/4/8, with its forward, while the MoE's
# gain none: a fixed time per sequence, 36 us, priced both wrong); the CPU work, 1.75 ms
# a step, shows on a step with nothing to overlap it with (after an idle gap, or of
# fresh prompts only). The host spends 25.5 us per kernel launch outside CUDA graphs
# (`optimizer.latency.launches`: a forward lasts at least its launches): picked by the
# prefill and mixed steps of Qwen3.6-35B-A3B at TP 2/4/8 with and without EP that do not
# follow an idle gap, which the host binds (Qwen3-32B's only bound it), the rest refitted
# on Qwen3-32B at each value. The MoE's DP + EP runs, and all its decode steps, are left
# out and check it. The kernel scale is the B300's; other chips have no per-step
# measurements and keep their tables' timings.
V1_HOST_LAUNCH_S = 25.5e-6
V1_EXPOSED = EngineOverhead(per_seq_forward=0.0070)
V1_CPU = EngineOverhead(base_s=1.75e-3)
V1_KERNEL_SCALES = (("b300", 1.074),)
V1_ASYNC_CALIBRATION = (
    "per-step timings of vLLM 0.20.1 serving Qwen3-32B (TP 1/2/4/8) and Qwen3.6-35B-A3B "
    "(TP 2/4/8, with and without EP) on B300 (AIConfigurator's forward-pass metrics)"
)
# V1 with synchronous scheduling (vLLM 0.8-0.13): its CPU work adds to every step; fitted
# on the training half of the closed-loop runs of vLLM 0.12 (Qwen3-32B on H100, the
# development set), each replayed under the protocol it was run with (10 x C requests after
# 2 x C drained warm-ups; the peer generator's C + isl + 1,500-token budget and C
# sequences, inferred: `optimizer.validation.devset`): the point of least median |TPOT
# error| on a grid of 0.5-2.0 ms x 0-60 us (benchmarks/bench_devset.py --fit), 1.6% on the
# training half and 1.8% on the held-out one.
V1_SYNC_OVERHEAD = EngineOverhead(base_s=1.0e-3, per_seq_s=40e-6)
V1_SYNC_CALIBRATION = (
    "closed-loop runs of vLLM 0.12 serving Qwen3-32B on H100 (AIConfigurator's sample, the "
    "development set's training half, replayed under the protocol they were run with)"
)

GENERATIONS = (
    EngineGeneration(
        key="vllm-v0",
        title="V0 engine",
        first_version=(0,),
        rules=LEGACY_RULES,
        overhead=V0_OVERHEAD,
        cpu=NO_OVERHEAD,
        async_scheduling=False,
        calibrated_on="754 offline batch runs of vLLM 0.5-0.6 on A100/H100/GH200 "
        "(LLM-Inference-Bench), half of them",
    ),
    EngineGeneration(
        key="vllm-v1",
        title="V1 with synchronous scheduling",
        first_version=(0, 8),
        rules=StepRules(True, True, CUDA_GRAPH_MAX_TOKENS, False),
        overhead=V1_SYNC_OVERHEAD,
        cpu=NO_OVERHEAD,
        async_scheduling=False,
        calibrated_on=V1_SYNC_CALIBRATION,
        kernel_scales=V1_KERNEL_SCALES,
    ),
    EngineGeneration(
        key="vllm-v1-async",
        title="V1 with async scheduling",
        first_version=(0, 14),
        rules=StepRules(True, True, CUDA_GRAPH_MAX_TOKENS, True),
        overhead=V1_EXPOSED,
        cpu=V1_CPU,
        async_scheduling=True,
        calibrated_on=V1_ASYNC_CALIBRATION,
        kernel_scales=V1_KERNEL_SCALES,
        host_launch_s=V1_HOST_LAUNCH_S,
        aligned_hybrid_prefill=True,
    ),
)
SGLANG_CALIBRATION = (
    "not calibrated: no measured SGLang serving run; a step costs its kernels alone"
)
SGLANG = EngineGeneration(
    key="sglang",
    title="overlap scheduler",
    first_version=(0, 4),
    rules=StepRules(True, True, SGLANG_CUDA_GRAPH_TOKENS, False),
    overhead=NO_OVERHEAD,
    cpu=NO_OVERHEAD,
    async_scheduling=True,
    calibrated_on=SGLANG_CALIBRATION,
    engine="sglang",
    calibrated=False,
)
_BY_KEY = {g.key: g for g in (*GENERATIONS, SGLANG)}
FUSED_NORM_FROM = (0, 17)  # the FlashInfer all-reduce + RMSNorm fusion's first release


def vllm_server_budget(accelerator_gib: float, accelerator_family: str) -> tuple[int, int]:
    """vLLM's API-server defaults (max_num_batched_tokens, max_num_seqs) on a GPU of
    `accelerator_gib` GiB as the device reports them: 8,192 and 1,024 from 70 GiB on, other
    than an A100 (H100, H200, GH200, B200, B300), else 2,048 and 256
    (EngineArgs._set_default_args; its test_defaults_with_usage_context)."""
    if accelerator_gib >= 70.0 and accelerator_family != "a100":
        return 8192, 1024
    return 2048, 256


def parse_version(text: str) -> tuple[int, ...]:
    """'0.12.0', 'v0.20', '0.5.3.post1' -> (0, 12, 0), (0, 20), (0, 5, 3)."""
    match = re.fullmatch(r"v?(\d+(?:\.\d+){0,2})(?:[.+-]?(?:post|rc|dev|a|b)\w*)?", text.strip())
    if match is None:
        raise EngineError(
            f"engine_version {text!r}: expected a release number such as '0.12.0' or '0.20'"
        )
    return tuple(int(p) for p in match.group(1).split("."))


@dataclass(frozen=True, slots=True)
class EngineRelease:
    """The engine a deployment runs: its name, version and generation."""

    engine: str = "vllm"
    version: str = CURRENT_VLLM
    synchronous: bool = False  # async scheduling turned off (speculation vLLM runs synchronously)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise EngineError(
                f"engine {self.engine!r}: servetune prices {list(ENGINES)} (TensorRT-LLM's "
                "kernel tables import, but its step rules are not modelled)"
            )
        parse_version(self.version)
        if self.engine == "sglang" and self.version_tuple < SGLANG.first_version:
            raise EngineError(
                f"engine_version {self.version!r}: servetune prices SGLang from 0.4 on "
                "(its overlap scheduler)"
            )

    @classmethod
    def of(cls, engine: str, version: str | None, synchronous: bool = False) -> EngineRelease:
        """`engine` at `version` (None: the engine's current line, `CURRENT`)."""
        if engine not in ENGINES:
            cls(engine)  # raises the unknown-engine error
        return cls(engine, version or CURRENT[engine], synchronous)

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return parse_version(self.version)

    @property
    def generation(self) -> EngineGeneration:
        if self.engine == "sglang":
            return SGLANG
        v = self.version_tuple
        chosen = GENERATIONS[0]
        for g in GENERATIONS:
            if v >= g.first_version:
                chosen = g
        if self.synchronous and chosen.async_scheduling:
            return _BY_KEY["vllm-v1"]  # vLLM runs this speculation synchronously
        return chosen

    @property
    def rules(self) -> StepRules:
        g = self.generation
        if g.rules.fused_allreduce_norm and self.version_tuple < FUSED_NORM_FROM:
            return StepRules(g.rules.fused_elementwise, g.rules.vllm_all_reduce,
                             g.rules.cuda_graph_tokens, False)  # fmt: skip
        return g.rules

    @property
    def key(self) -> str:
        """What a compiled table depends on: the generation, its rules and overheads."""
        g = self.generation
        return (
            f"{g.key}|{self.rules!r}|{g.kernel_scales!r}|{g.overhead!r}|{g.cpu!r}"
            f"|{g.host_launch_s!r}"
        )

    @property
    def label(self) -> str:
        """How every output names the pricing: 'vLLM 0.20, V1 with async scheduling'."""
        title = self.generation.title
        if self.engine == "sglang":
            return f"SGLang {self.version}, {title} (engine overhead not calibrated)"
        if self.synchronous and self.version_tuple >= _BY_KEY["vllm-v1-async"].first_version:
            title += " (vLLM turns async scheduling off for this speculation)"
        return f"vLLM {self.version}, {title}"


DEFAULT_RELEASE = EngineRelease()
