"""A tiny analytic latency model for tests and as a development stand-in.

`LinearLatency` prices a step as
    base_s + per_token_s x num_tokens + per_kv_token_s x decode_kv_tokens
    + per_prefill_attn_s x sum(q x kv over prefill chunks) + per_seq_s x num_logits
which is enough to hand-work golden cases (a constant model is
`LinearLatency(base_s=c)`) and to look roughly like a real GPU (e.g. Llama-3.1-8B
on H100: ~7 ms base, ~27 us per token, ~40 ns per decode KV token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.engines import DEFAULT_RELEASE, EngineRelease
from optimizer.latency.base import StepLatency, StepLoad, TableReach
from optimizer.parallel import DENSE_LAYOUT, ExpertLayout
from optimizer.shapes import DEFAULT_PRECISION, Precision


@dataclass(frozen=True, slots=True)
class LinearLatency:
    """Constant + per-token + per-KV-token step cost (implements `StepLatency`)."""

    base_s: float
    per_token_s: float = 0.0
    per_kv_token_s: float = 0.0
    per_prefill_attn_s: float = 0.0
    per_seq_s: float = 0.0
    estimate: bool = True

    def __post_init__(self) -> None:
        for name in ("base_s", "per_token_s", "per_kv_token_s", "per_prefill_attn_s", "per_seq_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(
                    f"LinearLatency.{name} must be a finite number >= 0, got {value!r}"
                )
        if self.base_s <= 0:
            raise ValueError(
                f"LinearLatency.base_s must be > 0 (steps take time), got {self.base_s}"
            )

    @property
    def is_estimate(self) -> bool:
        return self.estimate

    def step_time_s(self, load: StepLoad) -> float:
        t = (
            self.base_s
            + self.per_token_s * load.num_tokens
            + self.per_kv_token_s * load.decode_kv_tokens
        )
        if self.per_seq_s:
            t += self.per_seq_s * load.num_logits
        if self.per_prefill_attn_s and load.prefill_q:
            t += self.per_prefill_attn_s * sum(
                q * kv for q, kv in zip(load.prefill_q, load.prefill_kv, strict=True)
            )
        return t


@dataclass(frozen=True, slots=True)
class SingleLatencySource:
    """Hands the same `StepLatency` to every role, accelerator and TP degree."""

    latency: StepLatency

    def for_instance(
        self,
        accelerator: str,
        tp: int,
        reach: TableReach | None = None,
        precision: Precision = DEFAULT_PRECISION,
        engine: EngineRelease = DEFAULT_RELEASE,
        layout: ExpertLayout = DENSE_LAYOUT,
    ) -> StepLatency:
        return self.latency


@dataclass(frozen=True, slots=True)
class MappingLatencySource:
    """One `StepLatency` per (accelerator, tp), e.g. for heterogeneous PD tests."""

    latencies: tuple[tuple[str, int, StepLatency], ...]

    def for_instance(
        self,
        accelerator: str,
        tp: int,
        reach: TableReach | None = None,
        precision: Precision = DEFAULT_PRECISION,
        engine: EngineRelease = DEFAULT_RELEASE,
        layout: ExpertLayout = DENSE_LAYOUT,
    ) -> StepLatency:
        for acc, t, latency in self.latencies:
            if acc == accelerator.lower() and t == tp:
                return latency
        known = [(a, t) for a, t, _ in self.latencies]
        raise LookupError(
            f"no latency model for accelerator {accelerator!r} at tp={tp}; have {known}"
        )
