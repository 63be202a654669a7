"""A compiled table as bytes, and back: one .npz document (NumPy's format, no pickle) of
float64 arrays and JSON metadata. What a table's numbers depend on is in its store key
(`catalog.LatencyCatalog`), not here."""

from __future__ import annotations

import io
import json
from dataclasses import asdict

import numpy as np

from optimizer.engines import EngineOverhead
from optimizer.latency.launches import HostFloor
from optimizer.latency.table import CompiledStepLatency, TableGrid

_TABLES = ("dense_ms", "lm_head_ms", "prefill_ms")
# Of table_to_bytes (bump when the document's layout changes). 2: tables honour the
# shape's precision (FP8 GEMMs, FP8 KV cache) and record it. 4: the hidden (async) CPU
# work and the engine release; an optional "layout" entry (the MoE layout's key). 5: the
# host floor (`HostFloor`). 6: the token tables hold 1-7 tokens exactly (`token_index`).
# 7: the one-token forward (`forward_s`) the exposed time per sequence was resolved on.
TABLE_FORMAT = 7


def table_to_bytes(table: CompiledStepLatency) -> bytes:
    """A compiled table as one .npz document (float64 arrays + JSON metadata)."""
    meta = {
        "format": TABLE_FORMAT,
        "shape_name": table.shape_name,
        "accelerator": table.accelerator,
        "tp": table.tp,
        "is_estimate": table.is_estimate,
        "label": table.label,
        "estimated_ops": list(table.estimated_ops),
        "overhead": asdict(table.overhead),
        "ppo": table.ppo,
        "n_kv": table.n_kv,
        "n_q": table.n_q,
        "n_b": table.n_b,
        "grid": asdict(table.grid),
        "precision": table.precision,
        "hidden": asdict(table.hidden),
        "engine": table.engine,
        "host": asdict(table.host),
        "forward_s": table.forward_s,
    }
    if table.layout:
        meta["layout"] = table.layout
    arrays = {name: np.asarray(getattr(table, name), dtype=np.float64) for name in _TABLES}
    arrays["decode_ms"] = np.asarray(table.decode_ms, dtype=np.float64)
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    return buf.getvalue()


def table_from_bytes(data: bytes) -> CompiledStepLatency:
    """Inverse of `table_to_bytes`; ValueError when the document is not one."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            meta = json.loads(npz["meta"].tobytes().decode())
            arrays = {name: npz[name].tolist() for name in (*_TABLES, "decode_ms")}
    except (OSError, KeyError, ValueError) as exc:
        raise ValueError(f"not a compiled latency table: {exc}") from exc
    if meta.get("format") != TABLE_FORMAT:
        raise ValueError(f"compiled table format {meta.get('format')!r}, expected {TABLE_FORMAT}")
    return CompiledStepLatency(
        shape_name=meta["shape_name"],
        accelerator=meta["accelerator"],
        tp=meta["tp"],
        is_estimate=meta["is_estimate"],
        label=meta["label"],
        estimated_ops=tuple(meta["estimated_ops"]),
        overhead=EngineOverhead(**meta["overhead"]),
        ppo=meta["ppo"],
        n_kv=meta["n_kv"],
        n_q=meta["n_q"],
        n_b=meta["n_b"],
        grid=TableGrid(**meta["grid"]),
        precision=meta["precision"],
        hidden=EngineOverhead(**meta["hidden"]),
        engine=meta["engine"],
        layout=meta.get("layout", ""),
        host=HostFloor(**meta["host"]),
        forward_s=meta["forward_s"],
        **arrays,
    )
