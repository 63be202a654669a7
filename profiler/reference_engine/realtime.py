"""Real-time replay of a trace on the reference engine; per-request TTFT, TPOT, ITL.

The building blocks of a replay (`profiler.reference_engine.serve` puts them
together): the instance a `ServingConfig` describes, the requests, the loop that
releases each request at its arrival time on the wall clock and records when
every output token appears, and the result.
Timestamps come from `time.perf_counter` (CLOCK_MONOTONIC, shared by every
process on the machine), reported relative to the replay's start. On a
shared CPU a colocated replay can instead run on `Clock.CPU` (`CpuClock`):
each step still runs for real, but only the CPU time the engine's thread got
counts, so other processes' load does not inflate the measurement. A
disaggregated replay on `Clock.CPU` runs each process on its own CPU clock and
keeps the two in step conservatively (see `profiler.reference_engine.disagg`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from random import Random

import numpy as np

from optimizer.config import Role, ServingConfig
from optimizer.shapes import get_shape
from profiler.reference_engine.instance import EngineInstance, InstanceSpec, StepRecord
from profiler.reference_engine.scheduler import EngineError, EngineRequest, SchedulerLimits

MAX_POOL_BYTES = 4 * 1024**3  # refuse KV pools larger than this (lower gpu_memory_utilization)


@dataclass(frozen=True, slots=True)
class ReplayRequests:
    """The workload to replay: arrival times (s, sorted) and token counts."""

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if n == 0 or len(self.input_tokens) != n or len(self.output_tokens) != n:
            raise EngineError("replay needs equal, non-empty arrival/input/output arrays")
        if np.any(np.diff(self.arrival_s) < 0):
            raise EngineError("replay arrivals must be sorted")
        if np.any(self.input_tokens <= 0) or np.any(self.output_tokens <= 0):
            raise EngineError("replay token counts must be > 0")


class Clock(StrEnum):
    WALL = "wall"  # time.perf_counter: what a user of the machine would see
    CPU = "cpu"  # each engine thread's CPU time, jumping over idle gaps (see CpuClock)


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    device: str = "cpu"
    num_threads: int = 1  # torch threads per process (CPU), fixed for stable timing
    seed: int = 0
    clock: Clock = Clock.WALL


class CpuClock:
    """A virtual clock for a shared CPU: it advances with this thread's CPU time
    (so time other processes steal from the engine does not count) and jumps
    forward over idle gaps instead of sleeping. CPU replays only (CUDA work runs
    off the thread, so a GPU replay must use the wall clock)."""

    __slots__ = ("offset",)

    def __init__(self) -> None:
        self.offset = time.perf_counter() - time.thread_time()

    def __call__(self) -> float:
        return self.offset + time.thread_time()

    def exclude(self, seconds: float) -> None:
        """Take `seconds` of this thread's CPU time off the clock (work not on its timeline)."""
        self.offset -= seconds

    def wait_until(self, t: float) -> None:
        now = self()
        if t > now:
            self.offset += t - now


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Measured outcome; times in seconds from the replay's start."""

    arrival_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    num_preemptions: np.ndarray
    itl_s: np.ndarray  # every gap between consecutive output tokens
    steps: tuple[tuple[str, tuple[StepRecord, ...]], ...]  # (role, steps) per instance
    num_kv_transfers: int = 0
    kv_transfer_bytes: int = 0
    kv_transfer_s: float = 0.0  # summed time from send to receipt
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ttft_s(self) -> np.ndarray:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> np.ndarray:
        out = self.output_tokens
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(out > 1, (self.finish_s - self.first_token_s) / (out - 1), np.nan)

    @property
    def e2e_s(self) -> np.ndarray:
        return self.finish_s - self.arrival_s

    @property
    def makespan_s(self) -> float:
        return float(np.max(self.finish_s) - np.min(self.arrival_s))


def instance_spec(
    config: ServingConfig, role: Role, options: ReplayOptions, *, seed_offset: int = 0
) -> InstanceSpec:
    """The engine instance for one role of `config` (its knobs and KV capacity)."""
    plan = next((p for p in config.roles() if p.role is role), None)
    if plan is None:
        raise EngineError(f"config has no {role.value} role")
    if plan.count != 1:
        raise EngineError(
            f"the reference engine runs one instance per role; {role.value} has {plan.count}"
        )
    inst = plan.instance
    if inst.tp != 1:
        raise EngineError(f"the reference engine runs tp=1 only, {role.value} has tp={inst.tp}")
    if config.enable_prefix_caching:
        raise EngineError("the reference engine does not implement prefix caching")
    shape = config.shape
    pool = plan.kv_blocks * inst.block_size * shape.kv_bytes_per_token()
    if pool > MAX_POOL_BYTES:
        raise EngineError(
            f"{role.value}: {plan.kv_blocks} KV blocks need {pool / 1e9:.1f} GB of KV pool "
            f"(limit {MAX_POOL_BYTES / 1e9:.1f} GB); lower gpu_memory_utilization"
        )
    spec = config.speculation
    speculate = spec.enabled and role is not Role.PREFILL
    return InstanceSpec(
        shape=shape,
        limits=SchedulerLimits(
            max_num_batched_tokens=inst.max_num_batched_tokens,
            max_num_seqs=inst.max_num_seqs,
            enable_chunked_prefill=inst.enable_chunked_prefill,
            block_size=inst.block_size,
            num_blocks=plan.kv_blocks,
            num_speculative_tokens=spec.num_speculative_tokens if speculate else 0,
        ),
        acceptance_rate=spec.acceptance_rate,
        draft_shape=get_shape(spec.draft_model) if speculate and spec.draft_model else None,
        device=options.device,
        seed=options.seed + seed_offset,
    )


def check_fits(requests: ReplayRequests, spec: InstanceSpec, *, prompt_only: bool) -> None:
    lim = spec.limits
    limit = lim.num_blocks * lim.block_size - lim.num_speculative_tokens
    if not lim.enable_chunked_prefill:
        limit = min(limit, lim.max_num_batched_tokens)
    need = requests.input_tokens + (1 if prompt_only else requests.output_tokens)
    bad = np.flatnonzero(need > limit)
    if bad.size:
        i = int(bad[0])
        raise EngineError(
            f"request {i} needs {int(need[i])} tokens but an instance holds at most {limit} "
            f"({bad.size} such requests); raise the KV capacity or drop long requests"
        )


def make_requests(
    requests: ReplayRequests, *, seed: int, disaggregated: bool
) -> list[EngineRequest]:
    """Engine requests with seeded random prompt token ids."""
    rng = Random(seed)
    out = []
    for i, (a, p, o) in enumerate(
        zip(requests.arrival_s.tolist(), requests.input_tokens.tolist(),
            requests.output_tokens.tolist(), strict=True)
    ):  # fmt: skip
        stop = 1 if disaggregated and o > 1 else o
        ids = [rng.randrange(1, 4096) for _ in range(p)]
        out.append(EngineRequest(i, a, p, o, stop, ids))
    return out


def run_realtime(
    engine: EngineInstance,
    requests: list[EngineRequest],
    t0: float,
    on_finished: object = None,
    after_step: object = None,
) -> None:
    """Release `requests` at t0 + arrival and step until all have finished here.
    `after_step()` runs after every step's `on_finished` calls and every idle jump."""
    sched = engine.scheduler
    clock = engine.clock
    n = len(requests)
    nxt = 0
    remaining = n
    while remaining:
        now = clock()
        while nxt < n and t0 + requests[nxt].arrival_s <= now:
            sched.add(requests[nxt])
            nxt += 1
        if not sched.has_work():
            if nxt < n:
                if isinstance(clock, CpuClock):
                    clock.wait_until(t0 + requests[nxt].arrival_s)
                else:
                    time.sleep(max(0.0, t0 + requests[nxt].arrival_s - clock()))
                if after_step is not None:
                    after_step()  # type: ignore[operator]
            continue
        result = engine.step()
        if result is None:
            continue
        for r in result[1]:
            remaining -= 1
            if on_finished is not None:
                on_finished(r)  # type: ignore[operator]
        if after_step is not None:
            after_step()  # type: ignore[operator]


def collect(
    requests: list[EngineRequest],
    t0: float,
    steps: tuple[tuple[str, tuple[StepRecord, ...]], ...],
    **extra: object,
) -> ReplayResult:
    rel = [np.asarray(r.token_times_s, dtype=np.float64) - t0 for r in requests]
    itl = [np.diff(t) for t in rel if t.size > 1]
    return ReplayResult(
        arrival_s=np.array([r.arrival_s for r in requests]),
        first_token_s=np.array([t[0] for t in rel]),
        finish_s=np.array([t[-1] for t in rel]),
        input_tokens=np.array([r.num_prompt for r in requests], dtype=np.int64),
        output_tokens=np.array([r.num_output for r in requests], dtype=np.int64),
        num_preemptions=np.array([r.num_preemptions for r in requests], dtype=np.int64),
        itl_s=np.concatenate(itl) if itl else np.zeros(0),
        steps=steps,
        **extra,  # type: ignore[arg-type]
    )
