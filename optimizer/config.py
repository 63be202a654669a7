"""`ServingConfig`: the one serving-config schema (simulator, search, storage, API).

A config describes a fleet serving one model: colocated replicas, or
disaggregated prefill and decode instances (each role on its own accelerator
type and TP degree, as Splitwise proposes), plus speculation, prefix caching,
the KV link and routing. Construction validates everything (vLLM's rules from
DOMAIN.md §5 and KV capacity from §3); an invalid config raises `ConfigError`,
never yields a silent result.

JSON round trip: `to_dict()` / `ServingConfig.from_dict()` carry
`schema_version`; unknown keys and wrong types are rejected with the dotted
path of the offending field (the strict codec is `optimizer.plain`).
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field

from optimizer.config_parts import (
    SCHEDULING_POLICIES,
    ConfigError,
    InstanceConfig,
    KVLinkConfig,
    RejectReason,
    Role,
    RoutingPolicy,
    ServingMode,
    SpecMethod,
    SpeculationConfig,
    _positive_int,
    check_weight_format,
)

# The parts are part of this module's interface: `from optimizer.config import ...`.
__all__ = [
    "CONFIG_SCHEMA_VERSION",
    "SCHEDULING_POLICIES",
    "ConfigError",
    "InstanceConfig",
    "KVLinkConfig",
    "RejectReason",
    "Role",
    "RolePlan",
    "RoutingPolicy",
    "ServingConfig",
    "ServingMode",
    "SpecMethod",
    "SpeculationConfig",
]
from optimizer.engines import ENGINES, EngineError, EngineRelease
from optimizer.memory import (
    DraftFootprint,
    activation_reserve_bytes,
    kv_capacity_blocks,
    state_blocks_per_sequence,
    weight_bytes_per_gpu,
)
from optimizer.parallel import DENSE_LAYOUT
from optimizer.plain import PlainDataError, from_plain, to_plain
from optimizer.shapes import (
    KV_CACHE_DTYPES,
    QUANTIZATIONS,
    ModelShape,
    Precision,
    ShapeError,
    get_shape,
)

CONFIG_SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class RolePlan:
    """One role of a config as the simulator sees it."""

    role: Role
    instance: InstanceConfig
    count: int
    kv_blocks: int  # KV blocks per DP rank (each rank has its own cache; dp 1: the instance)
    state_blocks: int = 0  # blocks each running sequence holds for its Gated DeltaNet state


@dataclass(frozen=True, slots=True)
class ServingConfig:
    """A fleet serving `model` (a `optimizer.shapes` preset or HF config path).

    Colocated: `replica` x `num_replicas`. Disaggregated: `prefill` x
    `num_prefill` plus `decode` x `num_decode`; `kv_link` prices the KV hand-off.
    `routing` spreads arrivals over replicas (or prefill instances) and
    prefilled requests over decode instances. An instance of a MoE model may have dp
    attention ranks (tp x dp GPUs, `optimizer.parallel`) that share its arrivals.
    Validated on construction.
    """

    model: str  # a shape preset, a Hugging Face id (FP8 checkpoints too) or a config.json
    mode: ServingMode = ServingMode.COLOCATED
    replica: InstanceConfig | None = None
    num_replicas: int | None = None  # None: as the mode has it (1 colocated, 0 disaggregated)
    prefill: InstanceConfig | None = None
    num_prefill: int = 0
    decode: InstanceConfig | None = None
    num_decode: int = 0
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)
    enable_prefix_caching: bool = False
    kv_link: KVLinkConfig = field(default_factory=KVLinkConfig)
    routing: RoutingPolicy = RoutingPolicy.ROUND_ROBIN
    max_model_len: int | None = None  # None: limited by KV capacity (and the budget if unchunked)
    # Weights: "none" | "fp8"; None: as the checkpoint is (an FP8 checkpoint is "fp8").
    # "fp8" on a 16-bit checkpoint is vLLM's on-the-fly --quantization fp8.
    quantization: str | None = None
    kv_cache_dtype: str = "auto"  # "auto": as the checkpoint (its KV quantisation, else 16-bit)
    # The engine that runs it and its version (`optimizer.engines`): the generation whose
    # step rules and overhead price it. None: the current release line (CURRENT_VLLM).
    engine: str = "vllm"
    engine_version: str | None = None

    def __post_init__(self) -> None:
        if self.num_replicas is None:
            default = 0 if self.mode is ServingMode.DISAGGREGATED else 1
            object.__setattr__(self, "num_replicas", default)
        _validate(self)

    @classmethod
    def colocated(
        cls,
        model: str,
        instance: InstanceConfig | None = None,
        num_replicas: int = 1,
        **kw: typing.Any,
    ) -> ServingConfig:
        return cls(
            model=model, replica=instance or InstanceConfig(), num_replicas=num_replicas, **kw
        )

    @classmethod
    def disaggregated(
        cls,
        model: str,
        prefill: InstanceConfig | None = None,
        decode: InstanceConfig | None = None,
        num_prefill: int = 1,
        num_decode: int = 1,
        **kw: typing.Any,
    ) -> ServingConfig:
        return cls(
            model=model,
            mode=ServingMode.DISAGGREGATED,
            prefill=prefill or InstanceConfig(),
            decode=decode or InstanceConfig(),
            num_prefill=num_prefill,
            num_decode=num_decode,
            **kw,
        )

    @property
    def shape(self) -> ModelShape:
        """The model in this deployment's number formats: the checkpoint's, or those the
        config sets (`quantization`, and `kv_cache_dtype` other than "auto", which is the
        checkpoint's KV format, as vLLM's --kv-cache-dtype auto is)."""
        base = get_shape(self.model)
        kv = base.kv_cache_dtype if self.kv_cache_dtype == "auto" else self.kv_cache_dtype
        return base.with_precision(Precision(self.quantization or base.quantization, kv))

    @property
    def engine_release(self) -> EngineRelease:
        """The engine release that runs this config; vLLM runs speculation with a separate
        draft model or n-gram lookup without async scheduling (`optimizer.engines`)."""
        synchronous = self.speculation.method in (SpecMethod.DRAFT, SpecMethod.NGRAM)
        return EngineRelease.of(self.engine, self.engine_version, synchronous)

    @property
    def checkpoint_quantization(self) -> str:
        """The weight format of the checkpoint itself ("fp8" for a pre-quantised one)."""
        return get_shape(self.model).quantization

    def roles(self) -> tuple[RolePlan, ...]:
        """The instance roles with their counts and KV capacity, in simulator order."""
        shape = self.shape
        if self.mode is ServingMode.COLOCATED:
            assert self.replica is not None
            parts = ((Role.REPLICA, self.replica, self.num_replicas),)
        else:
            assert self.prefill is not None and self.decode is not None
            parts = (
                (Role.PREFILL, self.prefill, self.num_prefill),
                (Role.DECODE, self.decode, self.num_decode),
            )
        plans = []
        for role, inst, n in parts:
            draft = self.drafter(role, inst)
            blocks = kv_capacity_blocks(shape, inst, draft)
            plans.append(
                RolePlan(role, inst, n, blocks, state_blocks_per_sequence(shape, inst, draft))
            )
        return tuple(plans)

    def drafter(self, role: Role, inst: InstanceConfig) -> DraftFootprint | None:
        """The drafter on one instance of `role` (a prefill instance does not speculate)."""
        if role is Role.PREFILL:
            return None
        return self.speculation.footprint(self.shape, inst.tp)

    @property
    def num_gpus(self) -> int:
        """GPUs of the fleet: tp x dp per instance."""
        return sum(p.instance.num_gpus * p.count for p in self.roles())

    def price_per_hour(self) -> float | None:
        """Fleet price in USD per hour, or None when some role has no price."""
        total = 0.0
        for p in self.roles():
            price = p.instance.price_per_gpu_hour
            if price is None:
                price = p.instance.resolve_accelerator().price_per_hour
            if price is None:
                return None
            total += price * p.instance.num_gpus * p.count
        return total

    def to_dict(self) -> dict[str, typing.Any]:
        """JSON-ready dict with `schema_version`; enums as their string values."""
        out = to_plain(self)
        assert isinstance(out, dict)
        return {"schema_version": CONFIG_SCHEMA_VERSION, **out}

    @classmethod
    def from_dict(cls, data: object) -> ServingConfig:
        """Strict inverse of `to_dict` (schema_version optional; unknown keys rejected)."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"config: expected a mapping, got {type(data).__name__}")
        data = dict(data)
        version = data.pop("schema_version", CONFIG_SCHEMA_VERSION)
        if version != CONFIG_SCHEMA_VERSION:
            raise ConfigError(
                f"config.schema_version: {version!r} is not supported "
                f"(this build reads version {CONFIG_SCHEMA_VERSION})"
            )
        try:
            built = from_plain(cls, data, "config")
        except PlainDataError as exc:
            raise ConfigError(str(exc)) from None
        assert isinstance(built, ServingConfig)
        return built


# ----------------------------------------------------------------------------- validation


def _validate(cfg: ServingConfig) -> None:
    if not isinstance(cfg.model, str) or not cfg.model:
        raise ConfigError(f"config.model: expected a model shape name, got {cfg.model!r}")
    try:
        shape = get_shape(cfg.model)
    except ShapeError as exc:
        raise ConfigError(f"config.model: {exc}") from exc
    for name, enum in (("mode", ServingMode), ("routing", RoutingPolicy)):
        if not isinstance(getattr(cfg, name), enum):
            raise ConfigError(f"config.{name}: expected one of {[m.value for m in enum]}")
    if cfg.mode is ServingMode.COLOCATED:
        if cfg.replica is None:
            raise ConfigError("config.replica: required in colocated mode")
        _positive_int("config.num_replicas", cfg.num_replicas)
        if cfg.prefill is not None or cfg.decode is not None or cfg.num_prefill or cfg.num_decode:
            raise ConfigError("config: prefill/decode roles are only for disaggregated mode")
        roles = (("config.replica", cfg.replica),)
    else:
        if cfg.prefill is None or cfg.decode is None:
            raise ConfigError("config: disaggregated mode needs both prefill and decode roles")
        _positive_int("config.num_prefill", cfg.num_prefill)
        _positive_int("config.num_decode", cfg.num_decode)
        if cfg.replica is not None:
            raise ConfigError(
                "config.replica: only for colocated mode (a disaggregated fleet has prefill "
                "and decode roles)"
            )
        if cfg.num_replicas:
            raise ConfigError(
                f"config.num_replicas: {cfg.num_replicas} is only for colocated mode (a "
                "disaggregated fleet counts num_prefill and num_decode; leave num_replicas "
                "out or 0)"
            )
        roles = (("config.prefill", cfg.prefill), ("config.decode", cfg.decode))
    if not isinstance(cfg.speculation, SpeculationConfig):
        raise ConfigError("config.speculation: expected a SpeculationConfig")
    cfg.speculation.check("config.speculation")
    if not isinstance(cfg.kv_link, KVLinkConfig):
        raise ConfigError("config.kv_link: expected a KVLinkConfig")
    cfg.kv_link.check("config.kv_link")
    if not isinstance(cfg.enable_prefix_caching, bool):
        raise ConfigError("config.enable_prefix_caching: expected a bool")
    if cfg.quantization is not None and cfg.quantization not in QUANTIZATIONS:
        raise ConfigError(
            f"config.quantization: expected one of {list(QUANTIZATIONS)} (or null: as the "
            f"checkpoint), got {cfg.quantization!r}"
        )
    if cfg.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError(
            f"config.kv_cache_dtype: expected one of {list(KV_CACHE_DTYPES)}, got "
            f"{cfg.kv_cache_dtype!r}"
        )
    if cfg.quantization == "none" and get_shape(cfg.model).quantization == "fp8":
        raise ConfigError(
            f"config.quantization: {cfg.model} is an FP8 checkpoint; it cannot run unquantised"
        )
    if cfg.max_model_len is not None:
        _positive_int("config.max_model_len", cfg.max_model_len)
    deployed = cfg.shape  # in the deployment's formats: what the GPUs hold
    if not isinstance(cfg.engine, str):
        raise ConfigError(f"config.engine: expected a name, got {cfg.engine!r}")
    if cfg.engine_version is not None and not isinstance(cfg.engine_version, str):
        raise ConfigError(
            f"config.engine_version: expected a version string such as '0.12.0', got "
            f"{cfg.engine_version!r}"
        )
    try:
        cfg.engine_release  # noqa: B018 (validates the name and the version)
    except EngineError as exc:
        field_name = "engine" if cfg.engine not in ENGINES else "engine_version"
        raise ConfigError(f"config.{field_name}: {exc}") from exc
    for where, inst in roles:
        if not isinstance(inst, InstanceConfig):
            raise ConfigError(f"{where}: expected an InstanceConfig")
        inst.check(where)
        acc = inst.resolve_accelerator(where)
        inst.check_layout(shape, where)
        check_weight_format(deployed.quantization, acc, where)
        if shape.num_heads % inst.tp or (
            shape.num_kv_heads % inst.tp and inst.tp % shape.num_kv_heads
        ):
            raise ConfigError(
                f"{where}.tp: {inst.tp} does not divide {shape.name}'s {shape.num_heads} "
                f"attention heads / {shape.num_kv_heads} KV heads"
            )
        gdn = shape.gdn
        if gdn is not None and (gdn.num_key_heads % inst.tp or gdn.num_value_heads % inst.tp):
            raise ConfigError(
                f"{where}.tp: {inst.tp} does not divide {shape.name}'s Gated DeltaNet "
                f"{gdn.num_key_heads} key heads / {gdn.num_value_heads} value heads"
            )
        role = Role.PREFILL if where == "config.prefill" else Role.DECODE
        blocks = kv_capacity_blocks(deployed, inst, cfg.drafter(role, inst))
        if blocks <= 0:
            split = f"tp={inst.tp}"
            if inst.layout != DENSE_LAYOUT:
                split += f", dp={inst.dp}{', expert parallel' if inst.expert_parallel else ''}"
            raise ConfigError(
                f"{where}: {shape.name} ({deployed.precision.label}) does not fit on "
                f"{acc.name} at {split}: "
                f"{weight_bytes_per_gpu(deployed, inst.tp, inst.layout) / 1e9:.1f} GB of "
                "weights per GPU + "
                f"{activation_reserve_bytes(deployed, inst) / 1e9:.1f} GB reserve > "
                f"{acc.memory_gib:g} GiB x gpu_memory_utilization {inst.gpu_memory_utilization} "
                "leaves no room for the KV cache",
                RejectReason.MEMORY,
            )
        mml = cfg.max_model_len
        if (
            mml is not None
            and not inst.enable_chunked_prefill
            and inst.max_num_batched_tokens < mml
        ):
            raise ConfigError(
                f"{where}: with chunked prefill off, max_num_batched_tokens "
                f"({inst.max_num_batched_tokens}) must be >= max_model_len ({mml}) (vLLM rule)"
            )
        # One sequence's Gated DeltaNet state comes out of the same blocks (0 without).
        tokens = blocks - state_blocks_per_sequence(deployed, inst, cfg.drafter(role, inst))
        tokens *= inst.block_size
        if mml is not None and mml > tokens:
            raise ConfigError(
                f"{where}: max_model_len {mml} exceeds the KV cache capacity of "
                f"{tokens} tokens (vLLM refuses to start)",
                RejectReason.MEMORY,
            )
