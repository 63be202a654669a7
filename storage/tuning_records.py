"""What a tuning job is asked, what it reports while running and what it returns.

These frozen dataclasses are the contract between the service (api/), the job
queue (storage/jobs.py) and the tuning executor (optimizer.search). They are
stored as JSON with a `schema_version` and validated by the API directly (no
pydantic twins). Serving configs travel as `ServingConfig.to_dict()` mappings,
so this module stays free of the optimizer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

TUNING_SCHEMA_VERSION = 1


class Engine(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


def _check_positive(name: str, value: float) -> None:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a positive finite number, got {value!r}")


@dataclass(frozen=True, slots=True)
class TuningParams:
    """One tuning request: the workload (a trace, or a stream's recent window), the
    deployment (model, GPU type and budget) and the SLOs (DOMAIN.md §2)."""

    model: str  # model shape preset, e.g. "llama-3.1-8b"
    gpu: str  # accelerator preset, e.g. "h100"
    slo_ttft_ms: float
    slo_tpot_ms: float
    trace_id: int | None = None
    stream: str | None = None  # a named series of uploads; the window below is tuned on
    window_s: float = 3600.0  # rolling window over the stream's uploads
    num_gpus: int = 8
    attainment: float = 0.9  # share of requests that must meet both SLOs
    num_trials: int = 50
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.trace_id is None) == (self.stream is None):
            raise ValueError("give exactly one of trace_id (a stored trace) or stream (a name)")
        if self.trace_id is not None and self.trace_id <= 0:
            raise ValueError(f"trace_id: expected a positive id, got {self.trace_id}")
        if self.stream is not None and not (1 <= len(self.stream) <= 200):
            raise ValueError("stream: expected a name of 1 to 200 characters")
        if not (1 <= len(self.model) <= 100) or not (1 <= len(self.gpu) <= 100):
            raise ValueError("model and gpu: expected preset names of 1 to 100 characters")
        _check_positive("slo_ttft_ms", self.slo_ttft_ms)
        _check_positive("slo_tpot_ms", self.slo_tpot_ms)
        _check_positive("window_s", self.window_s)
        if not 1 <= self.num_gpus <= 4096:
            raise ValueError(f"num_gpus: expected 1 to 4096, got {self.num_gpus}")
        if not (0 < self.attainment <= 1):
            raise ValueError(f"attainment: expected a share in (0, 1], got {self.attainment}")
        if not 1 <= self.num_trials <= 10_000:
            raise ValueError(f"num_trials: expected 1 to 10000, got {self.num_trials}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed: expected 0 <= seed < 2**32, got {self.seed}")

    @property
    def source(self) -> str:
        """The workload as one string: `trace:ID` or `stream:NAME`."""
        return f"trace:{self.trace_id}" if self.trace_id is not None else f"stream:{self.stream}"


@dataclass(frozen=True, slots=True)
class WindowSummary:
    """The workload a job was tuned on, summarised for the drift trigger."""

    trace_ids: tuple[int, ...]
    num_requests: int
    mean_rate: float  # requests/s
    input_mean: float
    input_p90: float
    output_mean: float
    output_p90: float


@dataclass(frozen=True, slots=True)
class JobProgress:
    """Reported by the executor after each completed trial."""

    trials_done: int
    trials_total: int
    best_goodput_per_gpu: float | None = None  # best feasible so far, requests/s per GPU
    eta_s: float | None = None
    message: str = ""
    completed_trials: tuple[int, ...] = ()  # trial numbers, for resume checks


@dataclass(frozen=True, slots=True)
class ParetoPoint:
    trial: int
    goodput_per_gpu: float  # requests/s per GPU at the attainment target
    interactivity_tok_s: float  # median output tokens/s per user
    num_gpus: int
    meets_slo: bool
    config: dict[str, object] = field(default_factory=dict)  # ServingConfig.to_dict()


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    engine: Engine
    role: str  # "replica", "prefill", "decode" or "proxy"
    command: str


@dataclass(frozen=True, slots=True)
class Recommendation:
    trial: int | None  # None: the engine's defaults, kept (no trial beat them by 3%+)
    goodput_per_gpu: float
    interactivity_tok_s: float
    num_gpus: int
    predicted: dict[str, float]  # e.g. ttft_p90_ms, tpot_p90_ms, attainment
    launch_commands: tuple[LaunchCommand, ...]
    config: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Baseline:
    """The engine's untuned defaults on the same trace (DOMAIN.md §5)."""

    description: str
    goodput_per_gpu: float
    interactivity_tok_s: float
    predicted: dict[str, float]
    gain: float  # recommendation goodput per GPU / baseline's


@dataclass(frozen=True, slots=True)
class TuningOutcome:
    pareto: tuple[ParetoPoint, ...]
    recommendation: Recommendation | None  # None: no config meets the SLOs
    baseline: Baseline | None = None
    diagnosis: tuple[str, ...] = ()  # plain-language account, one paragraph each
    num_trials: int = 0
