"""Test factories shared across suites (plain functions, no fixtures)."""

from __future__ import annotations

import numpy as np

from optimizer.records import TokenStats, TraceColumns, TraceStats


def make_columns(n: int = 5, *, seed: int = 0, hashes: bool = False) -> TraceColumns:
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0, 10, n))
    arrival[0] = 0.0
    return TraceColumns(
        arrival_s=arrival,
        input_tokens=rng.integers(1, 4000, n).astype(np.int64),
        output_tokens=rng.integers(1, 400, n).astype(np.int64),
        prefix_hashes=[np.arange(i % 3 + 1, dtype=np.int64) + 7 for i in range(n)]
        if hashes
        else None,
        session_ids=[f"s{i % 2}" for i in range(n)] if hashes else None,
        acceptance_length=np.linspace(1.0, 3.0, n) if hashes else None,
    )


def make_stats(n: int = 5) -> TraceStats:
    t = TokenStats(mean=10.0, p50=9, p90=18, p99=20, max=21, total=10 * n)
    return TraceStats(
        num_requests=n,
        duration_s=10.0,
        mean_rate=n / 10.0,
        interarrival_cv=1.0,
        peak_rate_1s=2.0,
        peak_rate_10s=1.0,
        peak_rate_60s=0.1,
        input_tokens=t,
        output_tokens=t,
    )


def instance_with_blocks(num_blocks: int, *, model: str = "llama-3.1-8b", speculation=None, **kw):
    """An H100 `InstanceConfig` whose gpu_memory_utilization leaves exactly `num_blocks` KV
    blocks for `model` (with `speculation`'s drafter on the GPU too, when given)."""
    from optimizer.config import InstanceConfig
    from optimizer.hardware import get_accelerator
    from optimizer.memory import activation_reserve_bytes, kv_capacity_blocks
    from optimizer.shapes import get_shape

    shape = get_shape(model)
    probe = InstanceConfig(**kw)
    drafter = speculation.footprint(shape, probe.tp) if speculation is not None else None
    per_token = shape.kv_bytes_per_token(probe.tp)
    used = shape.weight_bytes(probe.tp) + activation_reserve_bytes(shape, probe)
    if drafter is not None:
        per_token += drafter.kv_bytes_per_token
        used += drafter.weight_bytes
    per_block = per_token * probe.block_size
    util = (used + (num_blocks + 0.5) * per_block) / get_accelerator("h100").hbm_bytes
    inst = InstanceConfig(gpu_memory_utilization=util, **kw)
    assert kv_capacity_blocks(shape, inst, drafter) == num_blocks
    return inst
