"""`PlanRequest`: what a fleet plan is asked for, the one contract the CLI, storage, the
REST API and the job queue share; `PlanProgress`: what a plan job reports while it runs.

A plan cuts a trace into windows of `window_s` seconds and sizes fleets of one unit for
them. The unit is `unit` (one replica or one P:D group), else the one `tune` would
recommend (the service looks it up, or screens the default space). Configs are scored
as `tune` scores them: `eval_settings()` and `space()` are `TuneRequest`'s, for the
same model, GPU, budget, SLOs, attainment and seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from optimizer.config import ConfigError, ServingConfig, ServingMode
from optimizer.hardware import HardwareError, get_accelerator
from optimizer.plain import PlainDataError, from_plain, to_plain
from optimizer.plan.errors import PlanError
from optimizer.search.evaluation import EvalSettings
from optimizer.search.request import MAX_GPU_BUDGET, MAX_NAME, TuneRequestError, base_space
from optimizer.search.space import SearchSpace, SearchSpaceError
from optimizer.sim import SLO

PLAN_REQUEST_SCHEMA_VERSION = 1
DEFAULT_WINDOW_S = 900.0
DEFAULT_GPU_BUDGET = 64
MAX_SCREEN_TRIALS = 64


def _positive(name: str, value: object) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value <= 0:
        raise PlanError(f"{name}: expected a positive finite number, got {value!r}")
    return float(value)


def _int_in(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise PlanError(f"{name}: expected an integer from {low} to {high}, got {value!r}")


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """One fleet plan: the trace, the model and GPU, the SLOs (DOMAIN.md §2), the windows
    and the unit. `gpu_budget` caps every fleet (a window whose lower bound needs more
    is refused). `cold_start_s` replaces the default cold start (`optimizer.sim.scaling`).
    `price_per_gpu_hour` prices every role of the unit (else the accelerator's own price,
    if it has one). `screen_trials`: seeded units screened besides vLLM's defaults when
    no unit is given and none is stored. `stream` (the service only): a named series of
    uploads, planned on its newest upload (pinned when the job is queued)."""

    model: str
    gpu: str
    slo_ttft_ms: float
    slo_tpot_ms: float
    trace_id: int | None = None  # None: a trace file, stored with the plan when it succeeds
    gpu_budget: int = DEFAULT_GPU_BUDGET
    window_s: float = DEFAULT_WINDOW_S
    attainment: float = 0.9
    cold_start_s: float | None = None
    unit: ServingConfig | None = None
    price_per_gpu_hour: float | None = None
    seed: int = 0
    screen_trials: int = 8
    stream: str | None = None

    def __post_init__(self) -> None:
        if self.trace_id is not None:
            _int_in("trace_id", self.trace_id, 1, 2**31 - 1)
        if self.stream is not None:
            if not isinstance(self.stream, str) or not 1 <= len(self.stream) <= MAX_NAME:
                raise PlanError(f"stream: expected a name of 1 to {MAX_NAME} characters")
            if self.trace_id is not None:
                raise PlanError("stream: give trace_id (a stored trace) or stream, not both")
        for name in ("model", "gpu"):
            value = getattr(self, name)
            if not isinstance(value, str) or not 1 <= len(value) <= MAX_NAME:
                raise PlanError(f"{name}: expected a name of 1 to {MAX_NAME} characters")
        try:
            get_accelerator(self.gpu)
        except HardwareError as exc:
            raise PlanError(f"gpu: {exc}") from None
        _positive("slo_ttft_ms", self.slo_ttft_ms)
        _positive("slo_tpot_ms", self.slo_tpot_ms)
        _int_in("gpu_budget", self.gpu_budget, 1, MAX_GPU_BUDGET)
        _positive("window_s", self.window_s)
        a = self.attainment
        if not (isinstance(a, (int, float)) and not isinstance(a, bool) and 0 < a <= 1):
            raise PlanError(f"attainment: expected a share in (0, 1], got {a!r}")
        if self.cold_start_s is not None:
            c = self.cold_start_s
            if not (isinstance(c, (int, float)) and math.isfinite(c) and c >= 0):
                raise PlanError(f"cold_start_s: expected seconds >= 0, got {c!r}")
        if self.price_per_gpu_hour is not None:
            _positive("price_per_gpu_hour", self.price_per_gpu_hour)
        _int_in("seed", self.seed, 0, 2**32 - 1)
        _int_in("screen_trials", self.screen_trials, 0, MAX_SCREEN_TRIALS)
        self.space()  # checks the model against the presets and the GPU budget
        if self.unit is not None:
            _check_unit(self.unit, self.model, self.gpu)

    @property
    def slo(self) -> SLO:
        return SLO(self.slo_ttft_ms / 1e3, self.slo_tpot_ms / 1e3)

    def eval_settings(self) -> EvalSettings:
        """How units are scored: `TuneRequest.eval_settings()` for the same model, GPU,
        budget, SLOs, attainment and seed (tune's defaults for the rest)."""
        return EvalSettings(
            slo=self.slo, attainment=self.attainment, gpu_budget=self.gpu_budget, seed=self.seed
        )

    def space(self, *, trace_has_prefix_hashes: bool = False) -> SearchSpace:
        """The default search space `tune` would search for this model, GPU and budget,
        priced at `price_per_gpu_hour` when given."""
        try:
            base = base_space(
                self.model,
                (self.gpu,),
                self.gpu_budget,
                trace_has_prefix_hashes=trace_has_prefix_hashes,
            )
            if self.price_per_gpu_hour is not None:
                base = base.with_overrides({"prices": [[self.gpu, self.price_per_gpu_hour]]})
            return base
        except (TuneRequestError, SearchSpaceError) as exc:
            raise PlanError(str(exc)) from None

    def priced(self, unit: ServingConfig) -> ServingConfig:
        """`unit` with `price_per_gpu_hour` on every role (unchanged without one)."""
        price = self.price_per_gpu_hour
        if price is None:
            return unit

        def at(inst):
            return None if inst is None else replace(inst, price_per_gpu_hour=price)

        return replace(
            unit, replica=at(unit.replica), prefill=at(unit.prefill), decode=at(unit.decode)
        )

    def to_dict(self) -> dict[str, Any]:
        out = to_plain(self)
        assert isinstance(out, dict)
        return {"schema_version": PLAN_REQUEST_SCHEMA_VERSION, **out}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanRequest:
        if not isinstance(data, Mapping):
            raise PlanError(f"request: expected a mapping, got {type(data).__name__}")
        data = dict(data)
        version = data.pop("schema_version", PLAN_REQUEST_SCHEMA_VERSION)
        if version != PLAN_REQUEST_SCHEMA_VERSION:
            raise PlanError(f"request.schema_version: {version!r} is not supported")
        try:
            built = from_plain(cls, data, "request")
        except (PlainDataError, ConfigError) as exc:
            raise PlanError(str(exc)) from None
        assert isinstance(built, PlanRequest)
        return built


@dataclass(frozen=True, slots=True)
class PlanProgress:
    """Reported by a plan job at each step of `build_plan` (its `on_step` messages):
    `steps_done` steps so far, `stage` the step under way."""

    steps_done: int
    stage: str


def _check_unit(unit: ServingConfig, model: str, gpu: str) -> None:
    """A unit is one replica or one P:D group of `model`, on `gpu`."""
    if not isinstance(unit, ServingConfig):
        raise PlanError(f"unit: expected a ServingConfig, got {type(unit).__name__}")
    if unit.model != model:
        raise PlanError(f"unit: the unit serves {unit.model!r}, not the plan's model {model!r}")
    if unit.mode is ServingMode.COLOCATED and unit.num_replicas != 1:
        raise PlanError(
            f"unit: expected one replica (num_replicas: 1; the plan sizes how many run), got "
            f"num_replicas {unit.num_replicas}"
        )
    on = sorted({p.instance.accelerator for p in unit.roles()})
    if gpu not in on:
        raise PlanError(f"unit: the unit runs on {', '.join(on)}; --gpu {gpu} names another GPU")
