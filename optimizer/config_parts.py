"""The parts a `ServingConfig` is made of: one engine instance's knobs
(`InstanceConfig`), speculation, the KV link, the config's enums and `ConfigError`.
Each part checks itself (`check(where)`), naming the dotted path of a bad field;
`optimizer.config` assembles them and checks the whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from optimizer.hardware import ACCELERATORS, Accelerator, HardwareError, get_accelerator
from optimizer.memory import (
    DraftFootprint,
    draft_model_footprint,
    eagle_head_footprint,
)
from optimizer.parallel import ExpertLayout
from optimizer.shapes import (
    ModelShape,
    ShapeError,
    get_shape,
)


class RejectReason(StrEnum):
    """Why a config cannot serve the workload (what `explain` counts trials by)."""

    RULE = "rule"  # a field, model or engine rule broken (e.g. tp must divide the heads)
    MEMORY = "memory"  # the weights, or a request's KV cache, do not fit the GPUs
    REQUESTS = "requests"  # it cannot hold the workload's longest requests
    BUDGET = "budget"  # it needs more GPUs than the budget


class ConfigError(ValueError):
    """A serving config is invalid: bad field, vLLM rule broken, or the model does not fit.
    `reason` says which kind (`RejectReason`)."""

    def __init__(self, message: str, reason: RejectReason = RejectReason.RULE) -> None:
        super().__init__(message)
        self.reason = reason


class ServingMode(StrEnum):
    COLOCATED = "colocated"
    DISAGGREGATED = "disaggregated"


class SpecMethod(StrEnum):
    NONE = "none"
    DRAFT = "draft"
    EAGLE = "eagle"
    NGRAM = "ngram"


class RoutingPolicy(StrEnum):
    ROUND_ROBIN = "round_robin"
    LEAST_OUTSTANDING_TOKENS = "least_outstanding_tokens"


class Role(StrEnum):
    REPLICA = "replica"
    PREFILL = "prefill"
    DECODE = "decode"


def _positive_int(where: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{where}: expected a positive integer, got {value!r}")


def _positive_number(where: str, value: object, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        expected = "a non-negative number" if allow_zero else "a positive number"
        raise ConfigError(f"{where}: expected {expected}, got {value!r}")


SCHEDULING_POLICIES = ("mixed", "prefill_first")


@dataclass(frozen=True, slots=True)
class InstanceConfig:
    """One serving instance (a replica, or one prefill/decode server): engine knobs per role."""

    accelerator: str = "h100"
    tp: int = 1
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    price_per_gpu_hour: float | None = None  # USD; None = the accelerator's own price, if any
    # "mixed": vLLM v1 (and SGLang): running requests first, prompts fill the rest of each
    # step. "prefill_first": vLLM v0 without chunked prefill: a step prefills waiting
    # prompts when any can be admitted, else decodes (the two never share a step).
    scheduling: str = "mixed"
    # MoE models only (`optimizer.parallel`): attention data-parallel ranks inside the
    # instance (vLLM's --data-parallel-size; the instance has tp x dp GPUs) and whole
    # experts sharded over them (--enable-expert-parallel).
    dp: int = 1
    expert_parallel: bool = False

    @property
    def layout(self) -> ExpertLayout:
        return ExpertLayout(self.dp, self.expert_parallel)

    @property
    def num_gpus(self) -> int:
        """GPUs of one instance: tp x dp."""
        return self.tp * self.dp

    def check(self, where: str) -> None:
        if not isinstance(self.accelerator, str) or not self.accelerator:
            raise ConfigError(f"{where}.accelerator: expected a name, got {self.accelerator!r}")
        for name in ("tp", "dp", "max_num_batched_tokens", "max_num_seqs", "block_size"):
            _positive_int(f"{where}.{name}", getattr(self, name))
        if self.tp & (self.tp - 1):
            raise ConfigError(f"{where}.tp: expected a power of two, got {self.tp}")
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ConfigError(f"{where}.enable_chunked_prefill: expected a bool")
        if not isinstance(self.expert_parallel, bool):
            raise ConfigError(
                f"{where}.expert_parallel: expected a bool, got {self.expert_parallel!r}"
            )
        u = self.gpu_memory_utilization
        _positive_number(f"{where}.gpu_memory_utilization", u)
        if u > 1.0:
            raise ConfigError(
                f"{where}.gpu_memory_utilization: expected a value in (0, 1], got {u}"
            )
        if self.block_size & (self.block_size - 1) or self.block_size > 256:
            raise ConfigError(
                f"{where}.block_size: expected a power of two <= 256, got {self.block_size}"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                f"{where}: max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs}) (vLLM rule)"
            )
        if self.price_per_gpu_hour is not None:
            _positive_number(
                f"{where}.price_per_gpu_hour", self.price_per_gpu_hour, allow_zero=True
            )
        if self.scheduling not in SCHEDULING_POLICIES:
            raise ConfigError(
                f"{where}.scheduling: expected one of {list(SCHEDULING_POLICIES)}, got "
                f"{self.scheduling!r}"
            )
        if self.scheduling == "prefill_first" and self.enable_chunked_prefill:
            raise ConfigError(
                f"{where}.scheduling: prefill_first is vLLM v0 without chunked prefill; set "
                "enable_chunked_prefill to false"
            )

    def check_layout(self, shape: ModelShape, where: str) -> None:
        """The MoE split against the model: dp and expert_parallel only for a MoE model; its
        experts must split over the instance's tp x dp GPUs."""
        moe = shape.moe
        if moe is None:
            if self.dp != 1 or self.expert_parallel:
                raise ConfigError(
                    f"{where}: dp={self.dp}, expert_parallel={self.expert_parallel} given for "
                    f"{shape.name}, a dense model: dp/expert_parallel are for MoE models; a "
                    "dense model scales out with num_replicas"
                )
            return
        layout = self.layout
        n = layout.num_gpus(self.tp)
        if self.expert_parallel and moe.num_experts < n:
            # vLLM's determine_expert_map (fused_moe) gives rank r num_experts // ep (+1 for
            # the first num_experts % ep ranks): an uneven split is allowed, an empty rank is
            # not useful and is refused here.
            raise ConfigError(
                f"{where}: expert_parallel over tp x dp = {n} GPUs needs at least {n} experts; "
                f"{shape.name} has {moe.num_experts}"
            )
        if not self.expert_parallel and moe.expert_intermediate_size % n:
            # Without EP vLLM tensor-splits every expert over tp x dp GPUs
            # (FusedMoEParallelConfig: moe TP = tp x dp), so its width must divide.
            raise ConfigError(
                f"{where}: without expert_parallel each expert of {shape.name} is split over "
                f"tp x dp = {n} GPUs, but its width {moe.expert_intermediate_size} is not "
                f"divisible by {n} (enable expert_parallel or pick another tp/dp)"
            )

    def resolve_accelerator(self, where: str = "instance") -> Accelerator:
        try:
            return get_accelerator(self.accelerator)
        except HardwareError as exc:
            raise ConfigError(f"{where}.accelerator: {exc}") from exc


def check_weight_format(quantization: str, acc: Accelerator, where: str) -> None:
    """Refuse a weight format the GPU cannot run as this project prices it (vLLM's rules):
    - "fp4" is NVFP4 W4A4 on FP4 tensor cores: Blackwell only (`fp4_tflops`). On older GPUs
      vLLM falls back to weight-only FP4 through Marlin ("Your GPU does not have native
      support for FP4 computation", marlin_utils_fp4.py), a different precision: refused.
    - "mxfp4" (gpt-oss): vLLM's Mxfp4Config.get_min_capability() is 80: native on
      Blackwell, weight-only W4A16 (Marlin / Triton) on Hopper and Ampere.
    - "int4" weight-only: the GPTQ/AWQ Marlin kernels (get_min_capability 80): Ampere+.
      A part with no compute capability (the Intel B60, a spec file that omits it) is
      refused both: its own kernels for them are not modelled.
    - "fp8" is never refused: without FP8 tensor cores (A100, B60) FP8 weights run
      weight-only at the bf16 peak (`fp8_tflops` None), as AIConfigurator measured them.
    """
    if quantization == "fp4" and acc.fp4_tflops is None:
        with_fp4 = ", ".join(a.name for a in ACCELERATORS.values() if a.fp4_tflops is not None)
        raise ConfigError(
            f"{where}.accelerator: quantization fp4 (NVFP4 W4A4) needs FP4 tensor cores "
            f"(Blackwell: {with_fp4}); {acc.name} has none (for 4-bit weights on a CUDA "
            "GPU of compute capability 8.0 or newer use mxfp4 or int4, which run weight-only)"
        )
    if quantization in ("mxfp4", "int4"):
        cc = acc.capability
        if cc is None or cc < (8, 0):
            stated = (
                "states no compute_capability (not a CUDA GPU, or one whose spec omits it)"
                if cc is None
                else f"is {cc[0]}.{cc[1]}"
            )
            raise ConfigError(
                f"{where}.accelerator: quantization {quantization} runs on vLLM's Marlin "
                f"kernels, which need compute capability >= 8.0 (Ampere or newer); "
                f"{acc.name} {stated}"
            )


@dataclass(frozen=True, slots=True)
class SpeculationConfig:
    """Speculative decoding. Acceptance is i.i.d. per token with rate `acceptance_rate` (α),
    or per request from the trace's acceptance lengths when `use_trace_acceptance`."""

    method: SpecMethod = SpecMethod.NONE
    num_speculative_tokens: int = 0  # K
    acceptance_rate: float = 0.7  # α in [0, 1]
    use_trace_acceptance: bool = False
    draft_model: str | None = None  # a model shape name, for method=draft
    draft_relative_cost: float = 0.05  # one draft step / one target decode step

    @property
    def enabled(self) -> bool:
        return self.method is not SpecMethod.NONE

    @property
    def draft_shape(self) -> ModelShape | None:
        """The draft model's shape when it is a separate model (method=draft)."""
        return get_shape(self.draft_model) if self.draft_model is not None else None

    def footprint(self, shape: ModelShape, tp: int) -> DraftFootprint | None:
        """What the drafter adds per GPU of an instance that speculates (None: n-gram
        lookup, or no speculation)."""
        if self.method is SpecMethod.EAGLE:
            return eagle_head_footprint(shape, tp)
        if self.method is SpecMethod.DRAFT and self.draft_model is not None:
            return draft_model_footprint(get_shape(self.draft_model), tp)
        return None

    def check(self, where: str) -> None:
        if not isinstance(self.method, SpecMethod):
            raise ConfigError(f"{where}.method: expected one of {[m.value for m in SpecMethod]}")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ConfigError(f"{where}.num_speculative_tokens: expected an int >= 0, got {k!r}")
        if self.enabled and k == 0:
            raise ConfigError(f"{where}: method {self.method} needs num_speculative_tokens >= 1")
        if not self.enabled and k != 0:
            raise ConfigError(f"{where}: num_speculative_tokens={k} given but method is none")
        a = self.acceptance_rate
        _positive_number(f"{where}.acceptance_rate", a, allow_zero=True)
        if a > 1.0:
            raise ConfigError(f"{where}.acceptance_rate: expected a value in [0, 1], got {a}")
        _positive_number(f"{where}.draft_relative_cost", self.draft_relative_cost, allow_zero=True)
        if self.draft_model is not None:
            if self.method is not SpecMethod.DRAFT:
                raise ConfigError(f"{where}.draft_model: only used with method=draft")
            try:
                get_shape(self.draft_model)
            except ShapeError as exc:
                raise ConfigError(f"{where}.draft_model: {exc}") from exc


@dataclass(frozen=True, slots=True)
class KVLinkConfig:
    """The link KV caches cross from prefill to decode instances (one per prefill instance)."""

    bandwidth_gb_s: float = 50.0  # per direction, 1e9 bytes/s (InfiniBand NDR ≈ 50)
    latency_ms: float = 0.02

    def check(self, where: str) -> None:
        _positive_number(f"{where}.bandwidth_gb_s", self.bandwidth_gb_s)
        _positive_number(f"{where}.latency_ms", self.latency_ms, allow_zero=True)
