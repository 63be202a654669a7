"""The search space: which `ServingConfig`s a study may try (DOMAIN.md §5).

One builder, `build_config(space, chooser)`, turns a sequence of choices into a
`ServingConfig` *unit*: one replica, or one group of prefill and decode instances in
one of `pd_ratios`. The search never picks how many units run: the evaluator sizes the
fleet to the traffic (`optimizer.search.sizing`). An Optuna trial drives it through
`TrialChooser` (define-by-run, so conditional knobs such as the P:D ratio only exist
in disaggregated mode); `enumerate_grid` replays it over every path, so the grid the
benchmark evaluates and the space the sampler explores are the same by construction.

Ordinal knobs (TP degree, token budget, batch limit, speculation depth) are sampled as
integer indices into their choice tuples so the sampler sees their order; the chosen
values are recorded on each trial as user attributes. A choice that yields an invalid
config (a vLLM rule broken, the model not fitting) raises `ConfigError`; the study
records it as a violated constraint, so such a config can never be recommended.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from optimizer.config import (
    ConfigError,
    InstanceConfig,
    KVLinkConfig,
    RejectReason,
    ServingConfig,
    ServingMode,
    SpecMethod,
    SpeculationConfig,
)
from optimizer.engines import EngineError, EngineRelease
from optimizer.search.choosers import Chooser, FixedChooser, PathChooser, TrialChooser, pick
from optimizer.shapes import KV_CACHE_DTYPES, ShapeError, get_shape

SPACE_SCHEMA_VERSION = 1
__all__ = [
    "SPACE_SCHEMA_VERSION",
    "Chooser",
    "FixedChooser",
    "GridPoint",
    "SearchSpace",
    "SearchSpaceError",
    "TrialChooser",
    "build_config",
    "config_key",
    "enumerate_grid",
]


class SearchSpaceError(ValueError):
    """A search space (or an override of it) is invalid."""


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """Defaults plus user overrides; every tuple lists the values a knob may take."""

    model: str
    accelerators: tuple[str, ...]  # the GPU types on offer (several: heterogeneous PD roles)
    gpu_budget: int  # GPUs the whole fleet may use
    modes: tuple[ServingMode, ...] = (ServingMode.COLOCATED, ServingMode.DISAGGREGATED)
    tp: tuple[int, ...] = (1, 2, 4, 8)
    # MoE models only (dense models' spaces ignore them): attention data-parallel ranks per
    # instance and experts sharded whole or tensor-split, within the budget (tp x dp GPUs)
    dp: tuple[int, ...] = (1, 2, 4, 8)
    expert_parallel: tuple[bool, ...] = (False, True)
    max_num_batched_tokens: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
    max_num_seqs: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)
    chunked_prefill: tuple[bool, ...] = (True, False)
    # prefill:decode instances in one disaggregated unit
    pd_ratios: tuple[tuple[int, int], ...] = (
        (1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 3), (3, 1), (3, 2),
    )  # fmt: skip
    spec_method: SpecMethod = SpecMethod.NONE  # fixed by the user's deployment
    spec_k: tuple[int, ...] = (0,)  # speculation depths; 0 = off
    acceptance_rate: float = 0.7
    use_trace_acceptance: bool = False  # the trace's measured acceptance lengths
    draft_model: str | None = None
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_model_len: int | None = None
    # prefix caching on/off: both searched when the trace carries prefix hashes (the service
    # widens the default), else off (with no hashes no reuse can be simulated)
    prefix_caching: tuple[bool, ...] = (False,)
    # KV-cache formats: ("auto", "fp8") lets the search trade KV precision for capacity
    # (off by default: FP8 KV changes the model's numerics, the user's call)
    kv_cache_dtype: tuple[str, ...] = ("auto",)
    quantization: str | None = None  # weights: None as the checkpoint; "fp8" on the fly
    # the engine the fleet will run ("vllm" or "sglang", `optimizer.engines`) and its release
    # (None: the engine's current line); fixed, not searched
    engine: str = "vllm"
    engine_version: str | None = None
    kv_link: KVLinkConfig = field(default_factory=KVLinkConfig)
    prices: tuple[tuple[str, float], ...] = ()  # (accelerator, USD per GPU-hour)

    def __post_init__(self) -> None:
        if not self.accelerators:
            raise SearchSpaceError("accelerators: offer at least one GPU type")
        if not isinstance(self.gpu_budget, int) or self.gpu_budget <= 0:
            raise SearchSpaceError(
                f"gpu_budget: expected a positive integer, got {self.gpu_budget!r}"
            )
        for name in (
            "modes",
            "tp",
            "dp",
            "expert_parallel",
            "max_num_batched_tokens",
            "max_num_seqs",
            "chunked_prefill",
            "spec_k",
            "pd_ratios",
        ):
            values = getattr(self, name)
            if not values:
                raise SearchSpaceError(f"{name}: expected at least one value")
            if len(set(values)) != len(values):
                raise SearchSpaceError(f"{name}: duplicate values in {list(values)}")
        if any(not isinstance(v, bool) for v in self.expert_parallel):
            raise SearchSpaceError(
                f"expert_parallel: expected booleans, e.g. [false, true], got "
                f"{list(self.expert_parallel)}"
            )
        for name in ("tp", "dp", "max_num_batched_tokens", "max_num_seqs"):
            values = getattr(self, name)
            if any(not isinstance(v, int) or isinstance(v, bool) or v <= 0 for v in values):
                raise SearchSpaceError(f"{name}: expected positive integers, got {list(values)}")
            if list(values) != sorted(values):
                raise SearchSpaceError(f"{name}: expected ascending values, got {list(values)}")
        # The config's own rules, checked once here rather than failing every trial.
        if any(t & (t - 1) for t in self.tp):
            raise SearchSpaceError(f"tp: expected powers of two, got {list(self.tp)}")
        b = self.block_size
        if not isinstance(b, int) or isinstance(b, bool) or b <= 0 or b & (b - 1) or b > 256:
            raise SearchSpaceError(f"block_size: expected a power of two <= 256, got {b!r}")
        u = self.gpu_memory_utilization
        if not isinstance(u, (int, float)) or isinstance(u, bool) or not 0 < u <= 1:
            raise SearchSpaceError(f"gpu_memory_utilization: expected a value in (0, 1], got {u!r}")
        if any(
            len(r) != 2 or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in r)
            for r in self.pd_ratios
        ):
            raise SearchSpaceError(
                f"pd_ratios: expected [prefill, decode] pairs of instance counts >= 1, "
                f"got {[list(r) for r in self.pd_ratios]}"
            )
        if any(not isinstance(k, int) or not 0 <= k <= 8 for k in self.spec_k):
            raise SearchSpaceError(f"spec_k: expected depths in 0..8, got {list(self.spec_k)}")
        if self.spec_method is SpecMethod.NONE and self.spec_k != (0,):
            raise SearchSpaceError(
                "spec_k: speculation depths need a spec_method (eagle, draft or ngram)"
            )
        pc = self.prefix_caching
        if not pc or any(not isinstance(v, bool) for v in pc) or len(set(pc)) != len(pc):
            raise SearchSpaceError(
                f"prefix_caching: expected distinct booleans, e.g. [true, false], got {list(pc)}"
            )
        kv = self.kv_cache_dtype
        if not kv or any(v not in KV_CACHE_DTYPES for v in kv) or len(set(kv)) != len(kv):
            raise SearchSpaceError(
                f"kv_cache_dtype: expected distinct values of {list(KV_CACHE_DTYPES)}, got "
                f"{list(kv)}"
            )
        if self.engine_version is not None and not isinstance(self.engine_version, str):
            raise SearchSpaceError(
                f"engine_version: expected a release string such as '0.12.0', got "
                f"{self.engine_version!r}"
            )
        if not isinstance(self.engine, str):
            raise SearchSpaceError(f"engine: expected a name such as 'vllm', got {self.engine!r}")
        try:
            self.release  # noqa: B018 (validates the engine and the version)
        except EngineError as exc:
            raise SearchSpaceError(str(exc)) from None
        if ServingMode.DISAGGREGATED in self.modes and self.gpu_budget < 2:
            raise SearchSpaceError("modes: disaggregated serving needs a gpu_budget of at least 2")
        if min(self.tp) > self.gpu_budget:
            raise SearchSpaceError(
                f"tp: every degree in {list(self.tp)} exceeds the gpu_budget {self.gpu_budget}"
            )

    def price_of(self, accelerator: str) -> float | None:
        for name, price in self.prices:
            if name == accelerator:
                return price
        return None

    def with_overrides(self, overrides: Mapping[str, Any]) -> SearchSpace:
        """A copy with some fields replaced (lists become tuples); unknown keys rejected."""
        names = {f.name for f in fields(self)}
        overrides = dict(overrides)
        if "enable_prefix_caching" in overrides:  # spaces stored before 2026-12
            overrides.setdefault("prefix_caching", [overrides.pop("enable_prefix_caching")])
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise SearchSpaceError(
                f"search-space overrides: unknown keys {unknown}; expected some of {sorted(names)}"
            )
        changes: dict[str, Any] = {}
        for key, value in overrides.items():
            if key == "modes":
                value = tuple(_enum(ServingMode, v, key) for v in value)
            elif key == "spec_method":
                value = _enum(SpecMethod, value, key)
            elif key == "kv_link":
                value = KVLinkConfig(**value) if isinstance(value, Mapping) else value
            elif key == "prices":
                value = tuple((str(a), float(p)) for a, p in value)
            elif key == "pd_ratios":
                value = tuple(tuple(r) if isinstance(r, (list, tuple)) else r for r in value)
            elif isinstance(value, list):
                value = tuple(value)
            changes[key] = value
        try:
            return replace(self, **changes)
        except TypeError as exc:
            raise SearchSpaceError(f"search-space overrides: {exc}") from exc

    @property
    def release(self) -> EngineRelease:
        """The engine release every config of the space runs."""
        return EngineRelease.of(self.engine, self.engine_version)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema_version": SPACE_SCHEMA_VERSION}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "kv_link":
                value = {"bandwidth_gb_s": value.bandwidth_gb_s, "latency_ms": value.latency_ms}
            elif f.name in ("prices", "pd_ratios"):
                value = [list(p) for p in value]
            elif isinstance(value, tuple):
                value = [str(v) if isinstance(v, ServingMode) else v for v in value]
            elif isinstance(value, SpecMethod):
                value = value.value
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchSpace:
        data = dict(data)
        version = data.pop("schema_version", SPACE_SCHEMA_VERSION)
        if version != SPACE_SCHEMA_VERSION:
            raise SearchSpaceError(f"search space schema_version {version!r} is not supported")
        for key in ("model", "accelerators", "gpu_budget"):
            if key not in data:
                raise SearchSpaceError(f"search space: missing key {key!r}")
        base = cls(
            model=data.pop("model"),
            accelerators=tuple(data.pop("accelerators")),
            gpu_budget=data.pop("gpu_budget"),
        )
        return base.with_overrides(data)


def _enum(enum: type, value: object, where: str) -> Any:
    try:
        return enum(value)
    except ValueError:
        raise SearchSpaceError(
            f"{where}: expected one of {[m.value for m in enum]}, got {value!r}"
        ) from None


def _is_moe(model: str) -> bool:
    try:
        return get_shape(model).is_moe
    except ShapeError:  # the config reports it
        return False


def _instance(
    space: SearchSpace, chooser: Chooser, role: str, budget: int, spec_k: int
) -> InstanceConfig:
    """One role's engine knobs. A prefill server's batch limit and a decode server's token
    budget follow from the other knob (they barely matter there), so they are derived.
    A MoE model's instance also picks its dp ranks (tp x dp within `budget`) and whether
    its experts are sharded whole; a dense model's never asks (its space is unchanged)."""
    acc = pick(chooser, f"{role}.accelerator", space.accelerators)
    tps = tuple(t for t in space.tp if t <= budget) or (min(space.tp),)
    tp = pick(chooser, f"{role}.tp", tps)
    dp, ep = 1, False
    if _is_moe(space.model):
        dps = tuple(d for d in space.dp if tp * d <= budget) or (min(space.dp),)
        dp = pick(chooser, f"{role}.dp", dps)
        ep = pick(chooser, f"{role}.expert_parallel", space.expert_parallel)
    chunked = True
    if role != "decode":
        chunked = pick(chooser, f"{role}.chunked", space.chunked_prefill)
    if role == "decode":
        seqs = pick(chooser, f"{role}.max_seqs", space.max_num_seqs)
        tokens = max(2048, seqs * (1 + spec_k))
    else:
        tokens = pick(chooser, f"{role}.batched_tokens", space.max_num_batched_tokens)
        if role == "prefill":
            seqs = min(max(space.max_num_seqs), tokens)
        else:
            seqs = pick(chooser, f"{role}.max_seqs", space.max_num_seqs)
    return InstanceConfig(
        accelerator=acc,
        tp=tp,
        max_num_batched_tokens=tokens,
        max_num_seqs=seqs,
        enable_chunked_prefill=chunked,
        gpu_memory_utilization=space.gpu_memory_utilization,
        block_size=space.block_size,
        price_per_gpu_hour=space.price_of(acc),
        dp=dp,
        expert_parallel=ep,
    )


def build_config(space: SearchSpace, chooser: Chooser) -> ServingConfig:
    """The config the choices describe; raises `ConfigError` when it is invalid."""
    mode = pick(chooser, "mode", space.modes)
    k = pick(chooser, "spec_k", space.spec_k)
    spec = SpeculationConfig()
    if k:
        spec = SpeculationConfig(
            method=space.spec_method,
            num_speculative_tokens=k,
            acceptance_rate=space.acceptance_rate,
            use_trace_acceptance=space.use_trace_acceptance,
            draft_model=space.draft_model,
        )
    caching = space.prefix_caching[0]
    if len(space.prefix_caching) > 1:
        caching = pick(chooser, "prefix_caching", space.prefix_caching)
    kv_dtype = space.kv_cache_dtype[0]
    if len(space.kv_cache_dtype) > 1:
        kv_dtype = pick(chooser, "kv_cache_dtype", space.kv_cache_dtype)
    common = {
        "speculation": spec,
        "enable_prefix_caching": caching,
        "kv_cache_dtype": kv_dtype,
        "quantization": space.quantization,
        "engine": space.engine,
        "engine_version": space.engine_version,
        "kv_link": space.kv_link,
        "max_model_len": space.max_model_len,
    }
    if mode is ServingMode.COLOCATED:
        inst = _instance(space, chooser, "replica", space.gpu_budget, k)
        return ServingConfig.colocated(space.model, inst, num_replicas=1, **common)
    ratios = tuple(r for r in space.pd_ratios if sum(r) <= space.gpu_budget)
    if not ratios:
        raise ConfigError(
            f"disaggregated: no P:D ratio of {[list(r) for r in space.pd_ratios]} fits "
            f"{space.gpu_budget} GPUs at tp 1",
            RejectReason.BUDGET,
        )
    num_prefill, num_decode = pick(chooser, "pd_ratio", ratios)
    prefill = _instance(space, chooser, "prefill", space.gpu_budget // num_prefill, k)
    rest = space.gpu_budget - num_prefill * prefill.num_gpus
    decode = _instance(space, chooser, "decode", max(1, rest // num_decode), k)
    gpus = num_prefill * prefill.num_gpus + num_decode * decode.num_gpus
    if gpus > space.gpu_budget:
        split = f"tp {prefill.tp}/{decode.tp}"
        if prefill.dp > 1 or decode.dp > 1:
            split += f" x dp {prefill.dp}/{decode.dp}"
        raise ConfigError(
            f"P:D unit {num_prefill}:{num_decode} at {split} needs {gpus} GPUs, more than the "
            f"budget of {space.gpu_budget}",
            RejectReason.BUDGET,
        )
    return ServingConfig.disaggregated(
        space.model, prefill, decode, num_prefill=num_prefill, num_decode=num_decode, **common
    )


@dataclass(frozen=True, slots=True)
class GridPoint:
    params: tuple[tuple[str, int], ...]  # the choice indices, as a trial would record them
    config: ServingConfig | None  # None when the choices are invalid
    error: str = ""


def enumerate_grid(space: SearchSpace) -> Iterator[GridPoint]:
    """Every choice path of the space once, in a fixed order (invalid ones included)."""
    stack: list[list[int]] = [[]]
    while stack:
        start = stack.pop()
        chooser = PathChooser(list(start))
        try:
            point = GridPoint(tuple(chooser.params.items()), build_config(space, chooser))
        except ConfigError as exc:
            point = GridPoint(tuple(chooser.params.items()), None, str(exc))
        point = GridPoint(tuple(chooser.params.items()), point.config, point.error)
        yield point
        for i in range(len(chooser.fanout) - 1, len(start) - 1, -1):
            for v in range(chooser.fanout[i] - 1, 0, -1):
                stack.append([*chooser.path[:i], v])


def config_key(config: ServingConfig) -> str:
    """A canonical string for a config (cache and duplicate detection)."""
    import json

    return json.dumps(config.to_dict(), sort_keys=True, separators=(",", ":"))
