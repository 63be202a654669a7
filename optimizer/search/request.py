"""What a tuning job is asked (`TuneRequest`) and what it reports while running
(`TuneProgress`): the one contract of the CLI, the REST API, the job queue and storage.

The workload is a stored trace (`trace_id`), a stream's recent window
(`stream`, `window_s`: the service resolves it to its uploads when the job is
created), or a closed-loop benchmark (`workload`: `vllm bench serve` parameters
with a `max_concurrency` below `num_prompts`, `optimizer.bench_serve`; an
open-loop one is a trace, stored as one by `servetune tune --workload`). JSON
round trip: `to_dict()` / `TuneRequest.from_dict()` carry `schema_version`;
unknown keys and wrong types are rejected with the field's name. Version 1
documents (written before the CLI and the service shared this type: `gpus`,
`n_trials`) are read too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from optimizer.bench_serve import BenchServeError, BenchServeSpec
from optimizer.plain import PlainDataError, from_plain, to_plain
from optimizer.search.evaluation import EvalSettings
from optimizer.search.space import SearchSpace, SearchSpaceError
from optimizer.sim import SLO

REQUEST_SCHEMA_VERSION = 2
MAX_NAME = 200
MAX_GPU_BUDGET = 4096


class TuneRequestError(ValueError):
    """A tuning request is invalid (the message names the field and what was expected)."""


def _positive(name: str, value: object) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value <= 0:
        raise TuneRequestError(f"{name}: expected a positive finite number, got {value!r}")


def _int_in(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise TuneRequestError(f"{name}: expected an integer from {low} to {high}, got {value!r}")


@dataclass(frozen=True, slots=True)
class TuneRequest:
    """One tuning request: the workload, the deployment (model, GPU types on offer and the
    GPU budget), the SLOs (DOMAIN.md §2) and the search's settings.

    `search_space` overrides `SearchSpace` fields (e.g. `{"tp": [1, 2]}`, or
    `{"spec_method": "eagle", "spec_k": [0, 2, 4]}` for speculation).

    The whole trace is evaluated unless `max_requests` cuts it to its first
    requests. Trials screen units on the busiest `screen_requests` consecutive
    requests (0: the whole trace); the best are verified as whole fleets on the
    whole trace. `gpu_budget` is a budget: fleets are sized for the busiest
    `peak_window_s` seconds' rate x `headroom`.
    """

    model: str  # model shape preset or HF config path
    gpu_types: tuple[str, ...]  # accelerator types on offer
    gpu_budget: int  # GPUs the fleet may use
    slo_ttft_ms: float
    slo_tpot_ms: float
    trace_id: int | None = None
    stream: str | None = None  # a named series of uploads: tune on its recent window
    # a closed-loop `vllm bench serve` run: its parameters that differ from the client's
    workload: Mapping[str, Any] | None = None
    window_s: float = 3600.0  # the stream's window
    slo_e2e_ms: float | None = None
    attainment: float = 0.9  # share of requests that must meet every SLO
    num_trials: int = 100
    seed: int = 0
    search_space: Mapping[str, Any] = field(default_factory=dict)
    max_requests: int | None = None
    screen_requests: int = 2000
    headroom: float = 1.0
    peak_window_s: float = 60.0
    # Speculation is searched (depth 0-5) when a drafter is named: a model shape preset or
    # config.json path (a draft model), or an EAGLE head's Hugging Face id (has "eagle").
    draft_model: str | None = None
    acceptance_rate: float | None = None  # per drafted token; None: the trace's, else 0.7
    # The deployment this tunes for: its calibration prices the search. With no trace_id,
    # stream or workload, the workload is its observed window (a deployment schedule
    # rebuilds it and pins the job to that trace).
    deployment_id: int | None = None

    def __post_init__(self) -> None:
        given = [v is not None for v in (self.trace_id, self.stream, self.workload)]
        if sum(given) > 1 or (sum(given) == 0 and self.deployment_id is None):
            raise TuneRequestError(
                "give exactly one of trace_id (a stored trace), stream (a name) or workload "
                "(closed-loop vllm bench serve parameters), or deployment_id alone (its "
                "observed window)"
            )
        if self.deployment_id is not None:
            _int_in("deployment_id", self.deployment_id, 1, 2**31 - 1)
        if self.workload is not None:
            object.__setattr__(self, "workload", self.bench_spec().to_plain())
        if self.trace_id is not None:
            _int_in("trace_id", self.trace_id, 1, 2**31 - 1)
        if self.stream is not None and not (
            isinstance(self.stream, str) and 1 <= len(self.stream) <= MAX_NAME
        ):
            raise TuneRequestError(f"stream: expected a name of 1 to {MAX_NAME} characters")
        if not isinstance(self.model, str) or not 1 <= len(self.model) <= MAX_NAME:
            raise TuneRequestError(f"model: expected a name of 1 to {MAX_NAME} characters")
        gpus = tuple(self.gpu_types) if isinstance(self.gpu_types, (list, tuple)) else ()
        if not gpus or any(not isinstance(g, str) or not 1 <= len(g) <= MAX_NAME for g in gpus):
            raise TuneRequestError(
                f"gpu_types: expected a list of accelerator names, got {self.gpu_types!r}"
            )
        object.__setattr__(self, "gpu_types", gpus)
        from optimizer.hardware import HardwareError, get_accelerator

        for g in gpus:
            try:
                get_accelerator(g)
            except HardwareError as exc:
                raise TuneRequestError(f"gpu_types: {exc}") from None
        _int_in("gpu_budget", self.gpu_budget, 1, MAX_GPU_BUDGET)
        for name in ("slo_ttft_ms", "slo_tpot_ms", "window_s"):
            _positive(name, getattr(self, name))
        if self.slo_e2e_ms is not None:
            _positive("slo_e2e_ms", self.slo_e2e_ms)
        if not (isinstance(self.attainment, (int, float)) and 0 < self.attainment <= 1):
            raise TuneRequestError(f"attainment: expected a share in (0, 1], got {self.attainment}")
        _int_in("num_trials", self.num_trials, 1, 10_000)
        _int_in("seed", self.seed, 0, 2**32 - 1)
        if self.max_requests is not None:
            _int_in("max_requests", self.max_requests, 20, 50_000_000)
        _int_in("screen_requests", self.screen_requests, 0, 50_000_000)
        if self.screen_requests and self.screen_requests < 100:
            raise TuneRequestError(
                f"screen_requests: expected 0 (screen on the whole trace) or at least 100, "
                f"got {self.screen_requests}"
            )
        _positive("peak_window_s", self.peak_window_s)
        if self.draft_model is not None and not (
            isinstance(self.draft_model, str) and 1 <= len(self.draft_model) <= MAX_NAME
        ):
            raise TuneRequestError(f"draft_model: expected a name of 1 to {MAX_NAME} characters")
        if self.acceptance_rate is not None:
            a = self.acceptance_rate
            if not (isinstance(a, (int, float)) and not isinstance(a, bool) and 0 <= a <= 1):
                raise TuneRequestError(f"acceptance_rate: expected a share in [0, 1], got {a!r}")
            if self.draft_model is None:
                raise TuneRequestError(
                    "acceptance_rate: give draft_model too (the drafter it describes)"
                )
        _positive("headroom", self.headroom)
        if self.headroom < 1:
            raise TuneRequestError(f"headroom: expected a factor >= 1, got {self.headroom!r}")
        if not isinstance(self.search_space, Mapping):
            raise TuneRequestError("search_space: expected a mapping of SearchSpace overrides")
        object.__setattr__(self, "search_space", dict(self.search_space))
        _check_space(self)  # validates model, GPU types, budget and the overrides

    @property
    def slo(self) -> SLO:
        e2e = self.slo_e2e_ms / 1e3 if self.slo_e2e_ms else None
        return SLO(self.slo_ttft_ms / 1e3, self.slo_tpot_ms / 1e3, e2e)

    def bench_spec(self) -> BenchServeSpec:
        """The closed-loop benchmark of `workload` (TuneRequestError when it is none)."""
        if not isinstance(self.workload, Mapping):
            raise TuneRequestError("workload: expected a mapping of vllm bench serve parameters")
        try:
            spec = BenchServeSpec.from_dict(self.workload)
        except BenchServeError as exc:
            raise TuneRequestError(str(exc)) from None
        if spec.is_open_loop:
            raise TuneRequestError(
                "workload: every request goes at its send time (no max_concurrency below "
                "num_prompts), an open loop: that is a trace; store it and give trace_id "
                "(servetune tune --workload does)"
            )
        return spec

    @property
    def source(self) -> str:
        """The workload as one string: `trace:ID`, `stream:NAME`, `workload:DESCRIPTION` or
        `deployment:ID` (its observed window, before a schedule pins it to a trace)."""
        if self.workload is not None:
            return f"workload:{self.bench_spec().describe()}"
        if self.trace_id is not None:
            return f"trace:{self.trace_id}"
        return (
            f"stream:{self.stream}"
            if self.stream is not None
            else f"deployment:{self.deployment_id}"
        )

    def eval_settings(self) -> EvalSettings:
        """How this request's configs are scored (the same from the CLI, REST and
        quickstart)."""
        return EvalSettings(
            slo=self.slo,
            attainment=self.attainment,
            gpu_budget=self.gpu_budget,
            screen_requests=self.screen_requests,
            max_requests=self.max_requests,
            headroom=self.headroom,
            peak_window_s=self.peak_window_s,
            seed=self.seed,
        )

    def space(
        self, *, trace_has_prefix_hashes: bool = False, trace_has_acceptance: bool = False
    ) -> SearchSpace:
        """The search space: defaults, then `search_space`'s overrides. Prefix caching is
        searched (on and off) when the trace carries prefix hashes and the overrides do not
        fix it; without hashes no reuse can be simulated, so it is off. With a
        `draft_model`, speculation depths 0-5 are searched, at `acceptance_rate`, else the
        trace's measured acceptance lengths, else 0.7 per drafted token."""
        base = base_space(
            self.model,
            self.gpu_types,
            self.gpu_budget,
            trace_has_prefix_hashes=trace_has_prefix_hashes,
        )
        try:
            if self.draft_model is not None:
                base = replace(base, **self._speculation(trace_has_acceptance))
            return base.with_overrides(dict(self.search_space))
        except SearchSpaceError as exc:
            raise TuneRequestError(f"search_space: {exc}") from exc

    def _speculation(self, trace_has_acceptance: bool) -> dict[str, Any]:
        from optimizer.config import SpecMethod
        from optimizer.shapes import ShapeError, get_shape

        name = self.draft_model
        assert name is not None
        method, shape = SpecMethod.EAGLE, None
        try:
            get_shape(name)
            method, shape = SpecMethod.DRAFT, name
        except ShapeError:
            if "eagle" not in name.lower():
                raise TuneRequestError(
                    f"draft_model: {name!r} is neither a model shape preset or config.json "
                    "path (a draft model) nor an EAGLE head's Hugging Face id (containing "
                    "'eagle')"
                ) from None
        return {
            "spec_method": method,
            "spec_k": (0, 1, 2, 3, 4, 5),
            "draft_model": shape,
            "acceptance_rate": 0.7 if self.acceptance_rate is None else self.acceptance_rate,
            "use_trace_acceptance": self.acceptance_rate is None and trace_has_acceptance,
        }

    def to_dict(self) -> dict[str, Any]:
        out = to_plain(self)
        assert isinstance(out, dict)
        return {"schema_version": REQUEST_SCHEMA_VERSION, **out}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TuneRequest:
        if not isinstance(data, Mapping):
            raise TuneRequestError(f"request: expected a mapping, got {type(data).__name__}")
        data = dict(data)
        version = data.pop("schema_version", REQUEST_SCHEMA_VERSION)
        if version == 1:
            data = _from_version_1(data)
        elif version != REQUEST_SCHEMA_VERSION:
            raise TuneRequestError(f"schema_version: {version!r} is not supported")
        try:
            built = from_plain(cls, data, "request")
        except PlainDataError as exc:
            raise TuneRequestError(str(exc)) from None
        assert isinstance(built, TuneRequest)
        return built


def base_space(
    model: str,
    gpu_types: tuple[str, ...],
    gpu_budget: int,
    *,
    trace_has_prefix_hashes: bool = False,
) -> SearchSpace:
    """The default space for a model, GPU types and budget (before speculation and
    overrides): both modes from two GPUs up; prefix caching searched (on and off) when
    the trace carries prefix hashes, else off (no reuse can be simulated). `tune` and
    `plan` build their spaces from it."""
    from optimizer.config import ConfigError, ServingConfig, ServingMode

    try:
        ServingConfig.colocated(model)
    except ConfigError as exc:
        if "config.model" in str(exc):
            raise TuneRequestError(f"model: {exc}") from exc
    try:
        modes = (ServingMode.COLOCATED, ServingMode.DISAGGREGATED)
        if gpu_budget < 2:  # one GPU: nothing to split
            modes = (ServingMode.COLOCATED,)
        base = SearchSpace(model, gpu_types, gpu_budget, modes=modes)
        if trace_has_prefix_hashes:
            base = replace(base, prefix_caching=(True, False))
        return base
    except SearchSpaceError as exc:
        raise TuneRequestError(f"search_space: {exc}") from exc


def _from_version_1(data: dict[str, Any]) -> dict[str, Any]:
    """A version-1 request (the CLI's: `gpus`, `n_trials`) in today's names."""
    renames = {"gpus": "gpu_types", "n_trials": "num_trials"}
    return {renames.get(k, k): v for k, v in data.items()}


@dataclass(frozen=True, slots=True)
class TuneProgress:
    """Reported after each finished trial (counted across every worker of the study), then
    at each step of the verification that follows the trials, and once when the answer is
    built (`stage` "done", with the recommended fleet's verified GPUs)."""

    trials_done: int
    trials_total: int
    best_goodput_per_gpu: float | None = None  # best feasible screen so far, req/s per GPU
    eta_s: float | None = None  # of the trials
    # The smallest fleet a feasible screen estimates: an estimate, before verification.
    screened_fewest_gpus: int | None = None
    stage: str = "searching"  # then what the verification is doing; "done" at the end
    recommended_gpus: int | None = None  # "done": the verified recommendation's (None: none)


# The requests whose space was built without error, by what `space()` reads (bounded).
_CHECKED: set[str] = set()
_MAX_CHECKED = 4096


def _check_space(request: TuneRequest) -> None:
    """`request.space()`, built once per distinct model, GPUs, budget, drafter and overrides:
    building it checks them (~0.25 ms), which every decode of a stored request would pay
    again (each read of a job or schedule). A pure check: only which inputs passed is
    noted, and any other request is checked in full."""
    try:
        key = json.dumps(
            [request.model, request.gpu_types, request.gpu_budget, request.draft_model,
             request.acceptance_rate, request.search_space],
            sort_keys=True,
        )  # fmt: skip
    except (TypeError, ValueError):  # overrides JSON cannot hold: check them every time
        request.space()
        return
    if key in _CHECKED:
        return
    request.space()
    if len(_CHECKED) >= _MAX_CHECKED:
        _CHECKED.clear()
    _CHECKED.add(key)
