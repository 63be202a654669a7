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


def dump_model(model: LatencyModel) -> bytes:
    parts = {
        "accelerator": model.accelerator,
        "source": model.source,
        "ops": [
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
            )
            for op, m in model.ops.items()
        ],
        "overhead_s": model.overhead_s,
        "num_mixed": model.num_mixed,
        "op_scale": model.op_scale,
    }
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
    ops = {}
    for value, coef, residual, dtype_bytes, num, models, gpus, square, *rest in parts["ops"]:
        op = OpKind(value)
        features = int(rest[0]) if version >= 3 else 1
        ops[op] = OpModel(op, coef, residual, dtype_bytes, num, models, gpus, square, features)
    overhead = parts.get("overhead_s") if version >= 2 else None
    return LatencyModel(
        parts["accelerator"],
        parts["source"],
        ops,
        overhead_s=None if overhead is None else float(overhead),
        num_mixed=int(parts.get("num_mixed", 0)),
        op_scale=float(parts["op_scale"]) if version >= 3 else 1.0,
    )


def feature_names(model: LatencyModel) -> tuple[str, ...]:
    """What the model was fitted on, for the stored record."""
    return tuple(
        f"{op.value}:flops,bytes,log-shape v{m.feature_version}" for op, m in model.ops.items()
    )
