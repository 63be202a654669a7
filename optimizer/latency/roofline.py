"""Roofline operator prices from an accelerator's spec alone: an *estimate*.

Each operator costs max(FLOPs / (peak FLOP/s x compute efficiency),
bytes / (HBM bandwidth x memory efficiency)) plus a kernel launch; an
all-reduce costs its ring bus bytes over the intra-node link plus a fixed
latency. Efficiency factors are typical of well-tuned kernels (assumptions,
not measurements); use them for what-if questions about hardware nobody has
profiled. Everything built from this pricer reports `is_estimate=True` and is
labelled "roofline estimate".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from optimizer.hardware import Accelerator
from optimizer.latency.features import MODELLED_OPS, OpBatch, work
from optimizer.records import OpKind

ROOFLINE_LABEL = "roofline estimate"


@dataclass(frozen=True, slots=True)
class RooflineOptions:
    compute_efficiency: float = 0.7  # share of peak bf16 FLOP/s a GEMM/attention kernel reaches
    memory_efficiency: float = 0.8  # share of HBM bandwidth a streaming kernel reaches
    link_efficiency: float = 0.7  # share of NVLink bandwidth an all-reduce reaches
    launch_ms: float = 0.004  # per kernel launch
    all_reduce_latency_ms: float = 0.01
    overhead_s: float = 0.0005  # engine per-iteration overhead (scheduling, sampling)

    def __post_init__(self) -> None:
        for name in ("compute_efficiency", "memory_efficiency", "link_efficiency"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"RooflineOptions.{name} must be in (0, 1], got {value!r}")
        for name in ("launch_ms", "all_reduce_latency_ms", "overhead_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"RooflineOptions.{name} must be >= 0")


@dataclass(frozen=True, slots=True)
class RooflinePricer:
    """Prices any modelled operator on `accelerator` from its spec (milliseconds)."""

    accelerator: Accelerator
    options: RooflineOptions = field(default_factory=RooflineOptions)

    def has(self, op: OpKind) -> bool:
        return op in MODELLED_OPS

    def predict_ms(self, batch: OpBatch) -> np.ndarray:
        flops, moved = work(batch)
        o, acc = self.options, self.accelerator
        if batch.op is OpKind.ALL_REDUCE:
            link = acc.link_gb_s * 1e9 * o.link_efficiency
            return o.all_reduce_latency_ms + 1e3 * moved / link
        compute_s = flops / (acc.flops_per_s * o.compute_efficiency)
        memory_s = moved / (acc.hbm_bytes_per_s * o.memory_efficiency)
        return o.launch_ms + 1e3 * np.maximum(compute_s, memory_s)
