"""What a tuning job is asked (`TuneRequest`) and what it reports while running."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from optimizer.search.space import SearchSpace, SearchSpaceError
from optimizer.sim import SLO

REQUEST_SCHEMA_VERSION = 1


class TuneRequestError(ValueError):
    """A tuning request is invalid (the message names the field and what was expected)."""


@dataclass(frozen=True, slots=True)
class TuneRequest:
    trace_id: int
    model: str  # model shape preset or HF config path
    gpus: tuple[str, ...]  # accelerator types on offer
    gpu_budget: int
    slo_ttft_ms: float
    slo_tpot_ms: float
    attainment: float = 0.9
    n_trials: int = 100
    seed: int = 0
    search_space: Mapping[str, Any] = field(default_factory=dict)  # SearchSpace overrides
    max_requests: int = 600  # evaluation window: the trace's first requests, at its own rate
    slo_e2e_ms: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.trace_id, int) or self.trace_id <= 0:
            raise TuneRequestError(f"trace_id: expected a positive id, got {self.trace_id!r}")
        for name in ("slo_ttft_ms", "slo_tpot_ms"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise TuneRequestError(f"{name}: expected a positive number of ms, got {v!r}")
        if not 0 < self.attainment <= 1:
            raise TuneRequestError(f"attainment: expected a share in (0, 1], got {self.attainment}")
        if not isinstance(self.n_trials, int) or not 1 <= self.n_trials <= 10_000:
            raise TuneRequestError(f"n_trials: expected 1 to 10000, got {self.n_trials!r}")
        if not isinstance(self.max_requests, int) or self.max_requests < 20:
            raise TuneRequestError(f"max_requests: expected >= 20, got {self.max_requests!r}")
        object.__setattr__(self, "gpus", tuple(self.gpus))
        self.space()  # validates model, gpus, budget and the overrides

    @property
    def slo(self) -> SLO:
        e2e = self.slo_e2e_ms / 1e3 if self.slo_e2e_ms else None
        return SLO(self.slo_ttft_ms / 1e3, self.slo_tpot_ms / 1e3, e2e)

    def space(self) -> SearchSpace:
        from optimizer.config import ConfigError, ServingConfig

        try:
            ServingConfig.colocated(self.model)
        except ConfigError as exc:
            if "config.model" in str(exc):
                raise TuneRequestError(f"model: {exc}") from exc
        try:
            base = SearchSpace(self.model, self.gpus, self.gpu_budget)
            return base.with_overrides(dict(self.search_space))
        except SearchSpaceError as exc:
            raise TuneRequestError(str(exc)) from exc

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": REQUEST_SCHEMA_VERSION,
            "trace_id": self.trace_id,
            "model": self.model,
            "gpus": list(self.gpus),
            "gpu_budget": self.gpu_budget,
            "slo_ttft_ms": self.slo_ttft_ms,
            "slo_tpot_ms": self.slo_tpot_ms,
            "slo_e2e_ms": self.slo_e2e_ms,
            "attainment": self.attainment,
            "n_trials": self.n_trials,
            "seed": self.seed,
            "search_space": dict(self.search_space),
            "max_requests": self.max_requests,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TuneRequest:
        data = dict(data)
        version = data.pop("schema_version", REQUEST_SCHEMA_VERSION)
        if version != REQUEST_SCHEMA_VERSION:
            raise TuneRequestError(f"schema_version: {version!r} is not supported")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise TuneRequestError(f"unknown keys {unknown}; expected some of {sorted(known)}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise TuneRequestError(str(exc)) from exc


@dataclass(frozen=True, slots=True)
class TuneProgress:
    trials_done: int
    trials_total: int
    best_per_gpu_goodput: float | None
    eta_s: float | None
