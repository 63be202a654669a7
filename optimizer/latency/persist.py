"""Serialise a fitted `LatencyModel` to bytes for storage (and back).

The payload is a pickle of plain parts (accelerator, source, and per operator
the base coefficients, the fitted residual ensemble, dtype and coverage)
prefixed by a magic header with `PAYLOAD_SCHEMA_VERSION`. Only load payloads
this project wrote (pickle executes code from untrusted input).

Version 2 adds the fitted per-iteration overhead (and how many mixed
iterations it was fitted on); version 1 payloads still load, without one.
Version 3 adds each operator's residual feature set
(`features.FEATURE_VERSION`) and the fitted operator scale; version 1 and 2
payloads load as feature set 1, the one they were fitted on, with scale 1, so
they predict exactly as before.

Version 3 was extended, compatibly and without a new number, by an optional
`fp8_ops` part: the FP8 operator variants, rows laid out as `ops`' rows. A
payload without it (every one written before FP8 variants existed) loads with
none, its FP8 operators then priced by the roofline; a reader that predates
the part ignores it, pricing FP8 as it always did. A new number would only
have made such payloads unreadable to those readers for no gain. A second optional
part, `low_bit_ops`, holds the 4-bit weight variants (MoE, GEMMs) the same way, each row
prefixed by its format ("fp4", "mxfp4", "int4"). An operator row may end, likewise
compatibly, in its measured grid (`OpModel.grid`, Gated DeltaNet ops only): rows
without one load with none, and a reader that predates it ignores the trailing item.
"""

from __future__ import annotations

import pickle

from optimizer.latency.model import LatencyModel, OpModel
from optimizer.records import OpKind

PAYLOAD_SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
_MAGIC = b"servetune-latency-model\n"


class PayloadError(ValueError):
    """A stored latency-model payload that cannot be read."""


def _rows(ops: dict[OpKind, OpModel]) -> list[tuple]:
    return [
        (
            op.value,
            m.coef,
            m.residual,
            m.dtype_bytes,
            m.num_samples,
            m.models,
            m.num_gpus,
            m.square_attention,
            m.feature_version,
            *((m.grid,) if m.grid else ()),
        )
        for op, m in ops.items()
    ]


def _op_models(
    rows: list[tuple], version: int, fp8: bool, weight_format: str = ""
) -> dict[OpKind, OpModel]:
    ops = {}
    for value, coef, residual, dtype_bytes, num, models, gpus, square, *rest in rows:
        op = OpKind(value)
        features = int(rest[0]) if version >= 3 else 1
        grid = tuple(tuple(r) for r in rest[1]) if len(rest) > 1 else ()
        ops[op] = OpModel(
            op, coef, residual, dtype_bytes, num, models, gpus, square, features, fp8=fp8,
            weight_format=weight_format, grid=grid,
        )  # fmt: skip
    return ops


def _low_bit_rows(model: LatencyModel) -> list[tuple]:
    return [(fmt, *_rows({op: m})[0]) for (op, fmt), m in model.low_bit_ops.items()]


def _low_bit_models(rows: list[tuple], version: int) -> dict[tuple[OpKind, str], OpModel]:
    out = {}
    for fmt, *row in rows:
        for op, m in _op_models([tuple(row)], version, fp8=False, weight_format=fmt).items():
            out[op, fmt] = m
    return out


def dump_model(model: LatencyModel) -> bytes:
    parts = {
        "accelerator": model.accelerator,
        "source": model.source,
        "ops": _rows(model.ops),
        "overhead_s": model.overhead_s,
        "num_mixed": model.num_mixed,
        "op_scale": model.op_scale,
    }
    if model.fp8_ops:
        parts["fp8_ops"] = _rows(model.fp8_ops)
    if model.low_bit_ops:
        parts["low_bit_ops"] = _low_bit_rows(model)
    return _MAGIC + pickle.dumps((PAYLOAD_SCHEMA_VERSION, parts), protocol=5)


def load_model(payload: bytes, schema_version: int = PAYLOAD_SCHEMA_VERSION) -> LatencyModel:
    if schema_version not in READABLE_VERSIONS or not payload.startswith(_MAGIC):
        raise PayloadError(
            f"latency model payload: expected schema_version in {READABLE_VERSIONS} "
            f"with a servetune header, got schema_version {schema_version}"
        )
    version, parts = pickle.loads(payload[len(_MAGIC) :])
    if version != schema_version:
        raise PayloadError(
            f"latency model payload: stored as schema_version {schema_version} "
            f"but holds version {version}"
        )
    overhead = parts.get("overhead_s") if version >= 2 else None
    return LatencyModel(
        parts["accelerator"],
        parts["source"],
        _op_models(parts["ops"], version, fp8=False),
        overhead_s=None if overhead is None else float(overhead),
        num_mixed=int(parts.get("num_mixed", 0)),
        op_scale=float(parts["op_scale"]) if version >= 3 else 1.0,
        fp8_ops=_op_models(parts.get("fp8_ops", []), version, fp8=True),
        low_bit_ops=_low_bit_models(parts.get("low_bit_ops", []), version),
    )


def feature_names(model: LatencyModel) -> tuple[str, ...]:
    """What the model was fitted on, for the stored record (FP8 variants as "<op>:fp8")."""
    return tuple(
        f"{m.name}:flops,bytes,log-shape v{m.feature_version}" for m in model.all_op_models()
    )
