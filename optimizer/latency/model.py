"""Per-operator latency regressors: a roofline-shaped base times a learned correction.

For each operator the model is

    t(x) = base(x) * exp(r(x)),   base(x) = c0 + c1 * FLOPs(x) + c2 * bytes(x)

with c >= 0 fitted by non-negative least squares on *relative* error, and r a
gradient-boosted tree ensemble on log-scaled shape features fitted to
log(t / base). The base carries the physics (time grows linearly with work),
so predictions beyond the profiled grid extrapolate along it: trees hold the
correction constant at the grid's edge instead of flattening the latency.

An operator may have two fitted variants: its 16-bit (or the profile's own
dtype) model and an FP8 one (GEMMs with FP8 weights, attention over an FP8 KV
cache; `features.is_fp8`), fitted separately on the samples of each
(`group_samples`). A batch is priced by the variant of its own format, never by
the other: a model without an FP8 variant refuses FP8 batches (pricing then
falls back to the roofline, see `compose.Pricing`).

Fitting uses scikit-learn; predicting a single iteration never should (the
simulator uses `optimizer.latency.table`, compiled from these models).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from optimizer.latency import dsa_module, gdn_module
from optimizer.latency.features import (
    FEATURE_VERSION,
    FP8_DTYPE,
    LOW_BIT_BYTES,
    MODELLED_OPS,
    OpBatch,
    feature_matrix,
    op_format,
    work,
)
from optimizer.records import KernelSample, OpKind

if TYPE_CHECKING:  # scipy and scikit-learn are imported by the fitting functions only
    from sklearn.ensemble import HistGradientBoostingRegressor

MIN_SAMPLES = 8

# An operator's samples of one format: (op, format). format "fp8": FP8 weights (GEMMs,
# MoE) or an FP8 KV cache (attention), i.e. KernelSample.dtype == "fp8"; a 4-bit weight
# format of `features.LOW_BIT_BYTES` ("fp4", "mxfp4", "int4"); "" the profile's own dtype.
OpGroup = tuple[OpKind, str]


class LatencyModelError(ValueError):
    """Samples that cannot be fitted, or an operator the model does not know."""


@dataclass(frozen=True, slots=True)
class FitOptions:
    """Gradient-boosting settings for the residual (defaults measured on the
    AIConfigurator and Vidur tables; see benchmarks/bench_latency_model.py)."""

    max_iter: int = 400
    learning_rate: float = 0.1
    max_leaf_nodes: int = 31
    min_samples_leaf: int = 5
    seed: int = 0
    num_threads: int = 1  # OpenMP threads; more oversubscribes a shared machine badly
    feature_version: int = FEATURE_VERSION  # residual feature set (older ones for comparison)


@dataclass(frozen=True, slots=True)
class OpModel:
    """A fitted latency model of one operator (milliseconds)."""

    op: OpKind
    coef: np.ndarray  # ms per [1, FLOP, byte]
    residual: HistGradientBoostingRegressor | None
    dtype_bytes: float
    num_samples: int
    models: tuple[str, ...] = ()  # model shapes of per-model samples ("" = generic)
    num_gpus: tuple[int, ...] = ()  # all-reduce group sizes measured
    square_attention: bool = False  # prefill samples all had kv_len == q_len (no cached prefix)
    feature_version: int = FEATURE_VERSION  # residual's feature set (features.FEATURE_VERSION)
    fp8: bool = False  # fitted on FP8 samples (FP8 weights / FP8 KV cache)
    weight_format: str = ""  # fitted on 4-bit weights of this format ("fp4", "mxfp4", "int4")
    # The shapes measured and the ranges of their size axes (GDN and DSA ops only:
    # `gdn_module.measured_grid`, `dsa_module.measured_grid`); pricing trusts the model
    # inside it only
    grid: tuple[tuple[float, ...], ...] = ()

    @property
    def format(self) -> str:
        """The variant's format: "", "fp8" or a 4-bit weight format."""
        return self.weight_format or (FP8_DTYPE if self.fp8 else "")

    @property
    def name(self) -> str:
        """The operator and, for a quantised variant, ":fp8" / ":fp4" ... (as hold-out
        metrics name it)."""
        return op_name(self.op, self.format)

    def base_ms(self, batch: OpBatch) -> np.ndarray:
        flops, moved = work(batch)
        return self.coef[0] + self.coef[1] * flops + self.coef[2] * moved

    def predict_ms(self, batch: OpBatch) -> np.ndarray:
        if batch.op != self.op:
            raise LatencyModelError(f"model of {self.op.value!r} asked to price {batch.op.value!r}")
        if op_format(batch) != self.format:
            raise LatencyModelError(
                f"model of {self.name!r} asked to price {op_name(batch.op, op_format(batch))!r}: "
                "16-bit, FP8 and 4-bit variants are fitted and priced apart"
            )
        base = self.base_ms(batch)
        if self.residual is None or len(batch) == 0:
            return base
        features = feature_matrix(batch, self.feature_version)
        return base * np.exp(self.residual.predict(features))


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """Fitted operator models of one accelerator (one profile run).

    A step costs `overhead_s + op_scale x (sum of its operators)`, both fitted
    on the profile's measured mixed iterations (`mixed_fit.fit_composition`).
    `overhead_s` is the per-iteration cost the operators do not explain; None
    when the profile has none (compiled tables then assume a default).
    `op_scale` is how much slower operators run inside a whole forward than
    alone (consecutive operators evict each other's weights and activations
    from cache); 1 without mixed iterations. `ops` holds the operators in the
    profile's own dtype (16-bit on GPUs), `fp8_ops` their FP8 variants where the
    profile measured some (FP8 GEMMs, attention over an FP8 KV cache).
    """

    accelerator: str
    source: str
    ops: dict[OpKind, OpModel] = field(default_factory=dict)
    overhead_s: float | None = None
    num_mixed: int = 0  # mixed iterations the overhead was fitted on
    op_scale: float = 1.0
    fp8_ops: dict[OpKind, OpModel] = field(default_factory=dict)
    # 4-bit weight variants (MoE, GEMMs) by (op, format of features.LOW_BIT_BYTES)
    low_bit_ops: dict[tuple[OpKind, str], OpModel] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (np.isfinite(self.op_scale) and self.op_scale > 0):
            raise LatencyModelError(
                f"{self.accelerator}: op_scale must be > 0, got {self.op_scale}"
            )

    def op_model(self, op: OpKind, fmt: bool | str = False) -> OpModel | None:
        """The fitted model of `op` in format `fmt` (True or "fp8": FP8; a 4-bit weight
        format; False or "": the profile's own dtype); None: not fitted."""
        if fmt in LOW_BIT_BYTES:
            return self.low_bit_ops.get((op, str(fmt)))
        return (self.fp8_ops if fmt in (True, FP8_DTYPE) else self.ops).get(op)

    def has(self, op: OpKind, fmt: bool | str = False) -> bool:
        return self.op_model(op, fmt) is not None

    def all_op_models(self) -> tuple[OpModel, ...]:
        return (*self.ops.values(), *self.fp8_ops.values(), *self.low_bit_ops.values())

    def op_names(self) -> tuple[str, ...]:
        """Every fitted operator, quantised variants as "<op>:fp8", "<op>:fp4" ..."""
        return tuple(m.name for m in self.all_op_models())

    def predict_ms(self, batch: OpBatch) -> np.ndarray:
        """`batch` priced by the model of its op and format (FP8 batches by FP8 models
        only, 4-bit ones by their format's; LatencyModelError when that one is not fitted)."""
        fmt = op_format(batch)
        model = self.op_model(batch.op, fmt)
        if model is None:
            raise LatencyModelError(
                f"no fitted model of {op_name(batch.op, fmt)!r} for {self.accelerator}; "
                f"have {sorted(self.op_names())}"
            )
        return model.predict_ms(batch)


def op_name(op: OpKind, fmt: bool | str) -> str:
    """`op`'s value, with ":<format>" for a quantised variant (True means "fp8")."""
    if fmt is True:
        fmt = FP8_DTYPE
    return f"{op.value}:{fmt}" if fmt else op.value


def _fit_base(batch: OpBatch, t: np.ndarray) -> np.ndarray:
    from scipy.optimize import nnls

    flops, moved = work(batch)
    a = np.column_stack([np.ones_like(t), flops, moved])
    scale = np.maximum(np.abs(a).max(axis=0), 1e-30)
    coef, _ = nnls((a / scale) / t[:, None], np.ones_like(t))
    return coef / scale


def fit_op_model(
    batch: OpBatch, latency_ms: np.ndarray, options: FitOptions, models: tuple[str, ...] = ()
) -> OpModel:
    """Fit one operator's model on its instances and measured median latencies (ms), in
    the batch's format (an FP8 batch gives an FP8 variant)."""
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_limits

    t = np.asarray(latency_ms, dtype=np.float64)
    if len(batch) != t.shape[0]:
        raise LatencyModelError(f"{batch.op}: {len(batch)} instances but {t.shape[0]} latencies")
    if len(batch) < MIN_SAMPLES:
        raise LatencyModelError(
            f"{batch.op}: {len(batch)} samples, need at least {MIN_SAMPLES} to fit"
        )
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise LatencyModelError(f"{batch.op}: latencies must be finite and > 0")
    coef = _fit_base(batch, t)
    flops, moved = work(batch)
    base = coef[0] + coef[1] * flops + coef[2] * moved
    residual = HistGradientBoostingRegressor(
        max_iter=options.max_iter,
        learning_rate=options.learning_rate,
        max_leaf_nodes=options.max_leaf_nodes,
        min_samples_leaf=min(options.min_samples_leaf, max(2, len(batch) // 20)),
        early_stopping=False,
        random_state=options.seed,
    )
    with threadpool_limits(limits=options.num_threads):
        features = feature_matrix(batch, options.feature_version)
        residual.fit(features, np.log(t) - np.log(np.maximum(base, 1e-9)))
    return OpModel(
        batch.op,
        coef,
        residual,
        batch.dtype_bytes,
        len(batch),
        models=models,
        num_gpus=tuple(sorted({int(g) for g in batch.num_gpus if g > 0})),
        square_attention=bool(np.all(batch.q_len == batch.kv_len)),
        feature_version=options.feature_version,
        fp8=op_format(batch) == FP8_DTYPE,
        weight_format=batch.weight_format,
        grid=_measured_grid(batch),
    )


def _measured_grid(batch: OpBatch) -> tuple[tuple[float, ...], ...]:
    if batch.op in gdn_module.GDN_OPS:
        return gdn_module.measured_grid(batch)
    if batch.op in dsa_module.DSA_OPS:
        return dsa_module.measured_grid(batch)
    return ()


def sample_group(sample: KernelSample) -> OpGroup:
    if sample.dtype == FP8_DTYPE or sample.dtype in LOW_BIT_BYTES:
        return sample.op, sample.dtype
    return sample.op, ""


def group_samples(samples: Sequence[KernelSample]) -> dict[OpGroup, tuple[OpBatch, np.ndarray]]:
    """Samples of every modelled operator, per (operator, format) group (16-bit first), as
    (parameters, median latency ms). Each group is one format; the 16-bit group still
    refuses a mix of dtypes (bfloat16 with float16)."""
    rows_of: dict[OpGroup, list[KernelSample]] = {}
    for s in samples:
        if s.op in MODELLED_OPS:
            rows_of.setdefault(sample_group(s), []).append(s)
    out: dict[OpGroup, tuple[OpBatch, np.ndarray]] = {}
    for group in sorted(rows_of, key=lambda g: (g[1] != "", g[1], g[0])):
        rows = rows_of[group]
        out[group] = (OpBatch.from_samples(group[0], rows), np.array([s.median_ms for s in rows]))
    return out


def models_of(samples: Sequence[KernelSample], group: OpGroup) -> tuple[str, ...]:
    """Model shapes the per-model samples of `group` were measured on."""
    return tuple(sorted({s.model for s in samples if sample_group(s) == group and s.model}))
