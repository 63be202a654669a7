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


def make_plan(*, trace_id: int | None = 1, seed: int = 0):
    """A small real `FleetPlan` (a linear latency model, 600 requests, two 2-min windows)."""
    from optimizer.config import InstanceConfig, ServingConfig
    from optimizer.latency.analytic import LinearLatency, SingleLatencySource
    from optimizer.plan import PlanRequest, UnitChoice, UnitSource, build_plan, check_inputs
    from optimizer.search.outcome import LatencyInfo
    from optimizer.workload import FixedLength, synthetic_workload

    trace = synthetic_workload(
        600, 2.4, input_lengths=FixedLength(300), output_lengths=FixedLength(30), seed=seed
    )
    request = PlanRequest(
        model="llama-3.1-8b",
        gpu="h100",
        slo_ttft_ms=1000,
        slo_tpot_ms=60,
        trace_id=trace_id,
        window_s=120,
        gpu_budget=8,
        cold_start_s=20,
        price_per_gpu_hour=2.0,
    )
    unit = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_seqs=32))
    latency = SingleLatencySource(LinearLatency(base_s=0.02, per_token_s=2e-4))
    return build_plan(
        request,
        trace,
        check_inputs(request, trace),
        UnitChoice(unit, UnitSource.GIVEN, "given"),
        latency,
        LatencyInfo("linear", True),
    )


def make_sim_request(
    rid: int = 0, prompt: int = 20, output: int = 4, *, stop_at: int | None = None, **kw
):
    """A simulator request arriving at 0 s that stops after its whole output (`stop_at=1`:
    a PD prefill); `kw` sets any other `SimRequest` field."""
    from optimizer.sim.request import SimRequest

    arrival_s = kw.pop("arrival_s", 0.0)
    return SimRequest(rid, arrival_s, prompt, output, output if stop_at is None else stop_at, **kw)


def make_sim_scheduler(*, general: bool = False, num_requests: int = 8, **kw):
    """One instance's simulator scheduler with small limits (64-token budget, 4 sequences,
    10 blocks of 16 tokens, 10 ms steps): the aggregate-decode fast path, or with
    `general` the per-request one; `kw` overrides any constructor argument."""
    from random import Random

    from optimizer.sim.metrics import RunLog
    from optimizer.sim.schedule_fast import AggregateDecodeScheduler
    from optimizer.sim.schedule_general import PerRequestScheduler

    args = {
        "role": "replica",
        "index": 0,
        "max_num_batched_tokens": 64,
        "max_num_seqs": 4,
        "enable_chunked_prefill": True,
        "block_size": 16,
        "num_blocks": 10,
        "num_spec": 0,
        "log": RunLog(num_requests),
        "rng": Random(0),
        "price": lambda load: 0.010,
    }
    args.update(kw)
    cls = PerRequestScheduler if general else AggregateDecodeScheduler
    return cls(**args)


def azure_workload(shared_data, name: str = "conv"):
    """The shared Azure 2023 trace `name` (conv or code) as a `Workload`, in arrival order
    from 0 s."""
    import polars as pl

    from optimizer.workload import Workload

    path = shared_data / "traces" / "azure2023" / f"AzureLLMInferenceTrace_{name}.csv"
    df = pl.read_csv(path, schema_overrides={"TIMESTAMP": pl.Utf8})
    ts = df["TIMESTAMP"].str.to_datetime("%Y-%m-%d %H:%M:%S%.f").dt.epoch("us").to_numpy()
    order = np.argsort(ts, kind="stable")
    return Workload(
        (ts[order] - ts[order][0]) / 1e6,
        df["ContextTokens"].to_numpy()[order],
        df["GeneratedTokens"].to_numpy()[order],
    )
