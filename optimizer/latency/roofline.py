"""Roofline operator prices from an accelerator's spec alone: an *estimate*.

Each operator costs max(FLOPs / (peak FLOP/s x compute efficiency),
bytes / (HBM bandwidth x memory efficiency)) plus a kernel launch; an
all-reduce costs its ring bus bytes over the intra-node link plus a fixed
latency. Efficiency factors are typical of well-tuned kernels (assumptions,
not measurements); use them for what-if questions about hardware nobody has
profiled. Everything built from this pricer reports `is_estimate=True` and is
labelled "roofline estimate".

Number formats come with the batch (`features.work`): FP8 weights move 1 byte
each, an FP8 KV cache 1 byte per element. An FP8 GEMM computes at the
accelerator's `fp8_tflops` when it has FP8 tensor cores, else at its bf16 peak
(an A100 runs FP8 checkpoints weight-only: weights stored in FP8, multiplied in
16 bits). A fused MoE layer (`OpKind.MOE`) is priced alike from its routed tokens'
expert GEMMs and the expert weights they touch (`features.work`). Its 4-bit weight
formats move their packed widths with scales (`features.LOW_BIT_BYTES`); NVFP4 ("fp4",
W4A4) computes at twice the FP8 peak on parts with FP4 tensor cores (`fp4_tflops`), else at
the FP8 peak; MXFP4 and INT4 as vLLM runs them here are weight-only (dequantised to
16 bits: the bf16 peak). Expert-parallel dispatch / combine cost their link bytes like
an all-reduce. Attention over an FP8 KV cache computes at the bf16 peak (only its
bytes shrink): a conservative choice, as FlashAttention-3 may run its FP8 path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from optimizer.engines import EngineOverhead
from optimizer.hardware import Accelerator
from optimizer.latency.features import (
    A2A_OPS,
    COLLECTIVE_OPS,
    MODELLED_OPS,
    WEIGHT_OPS,
    OpBatch,
    is_fp8,
    work,
)
from optimizer.records import OpKind

ROOFLINE_LABEL = "roofline estimate"
# dense FP4 peak over the FP8 one on parts with FP4 tensor cores (`fp4_tflops`, Blackwell)
FP4_OVER_FP8 = 2.0


@dataclass(frozen=True, slots=True)
class RooflineOptions:
    compute_efficiency: float = 0.7  # share of peak bf16 FLOP/s a GEMM/attention kernel reaches
    memory_efficiency: float = 0.8  # share of HBM bandwidth a streaming kernel reaches
    link_efficiency: float = 0.7  # share of NVLink bandwidth an all-reduce reaches
    launch_ms: float = 0.004  # per kernel launch
    all_reduce_latency_ms: float = 0.01
    # the engine's own time per step; None: the engine release's (`optimizer.engines`)
    overhead: EngineOverhead | None = None

    def __post_init__(self) -> None:
        for name in ("compute_efficiency", "memory_efficiency", "link_efficiency"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"RooflineOptions.{name} must be in (0, 1], got {value!r}")
        for name in ("launch_ms", "all_reduce_latency_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"RooflineOptions.{name} must be >= 0")


@dataclass(frozen=True, slots=True)
class RooflinePricer:
    """Prices any modelled operator on `accelerator` from its spec (milliseconds)."""

    accelerator: Accelerator
    options: RooflineOptions = field(default_factory=RooflineOptions)

    def __post_init__(self) -> None:
        fp8 = self.accelerator.fp8_tflops
        if fp8 is not None and not fp8 > 0:
            raise ValueError(f"{self.accelerator.name}: fp8_tflops must be > 0 or absent")

    def has(self, op: OpKind) -> bool:
        return op in MODELLED_OPS

    def peak_flops_per_s(self, batch: OpBatch) -> float:
        """The compute peak `batch` runs at: FP8 tensor cores for an FP8 GEMM when the
        accelerator has them, else the bf16 peak."""
        acc = self.accelerator
        if batch.op not in WEIGHT_OPS or acc.fp8_tflops is None:
            return acc.flops_per_s
        if is_fp8(batch):
            return acc.fp8_tflops * 1e12
        if batch.weight_format == "fp4":
            return acc.fp8_tflops * 1e12 * (FP4_OVER_FP8 if acc.fp4_tflops is not None else 1.0)
        return acc.flops_per_s

    def predict_ms(self, batch: OpBatch) -> np.ndarray:
        flops, moved = work(batch)
        o, acc = self.options, self.accelerator
        if batch.op in COLLECTIVE_OPS or batch.op in A2A_OPS:
            link = acc.link_gb_s * 1e9 * o.link_efficiency
            return o.all_reduce_latency_ms + 1e3 * moved / link
        compute_s = flops / (self.peak_flops_per_s(batch) * o.compute_efficiency)
        memory_s = moved / (acc.hbm_bytes_per_s * o.memory_efficiency)
        return o.launch_ms + 1e3 * np.maximum(compute_s, memory_s)
