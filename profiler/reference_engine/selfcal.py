"""The reference engine's own step cost, measured on synthetic batches.

Before a replay is compared with a prediction, `measure_engine_steps` runs
the same engine (same shape, torch threads, clock, scheduler limits, draft
model) for a few seconds on synthetic work that is not the trace being
evaluated: in three passes, for each (decode batch size x KV length) a batch
of requests is prefilled and decoded, and mid-way a fresh prompt arrives so that steps
mixing a prefill chunk with the decodes are measured too. Every step's
load and its whole cost (planning, batch building, KV gathering, the
forward(s), sampling and commit) are returned as `StepRecord`s, from which
`optimizer.validation` fits a per-step overhead and per-phase scales. The
comparison on the trace then stays an honest held-out test.
"""

from __future__ import annotations

from dataclasses import dataclass
from random import Random
from typing import TYPE_CHECKING

from profiler.reference_engine.instance import EngineInstance, InstanceSpec, StepRecord, open_engine
from profiler.reference_engine.scheduler import EngineRequest

if TYPE_CHECKING:
    from optimizer.validation import StepObservation


@dataclass(frozen=True, slots=True)
class SyntheticPlan:
    """The synthetic batches, run `passes` times (see `measure_engine_steps`)."""

    decode_batches: tuple[int, ...] = (1, 4, 8, 16)
    kv_lengths: tuple[int, ...] = (48, 256, 640)
    arriving_prompts: tuple[int, ...] = (96, 400, 900)
    num_decode_steps: int = 10
    passes: int = 3


def _capacity_tokens(spec: InstanceSpec) -> int:
    lim = spec.limits
    return lim.num_blocks * lim.block_size - lim.num_speculative_tokens


def _scenario(
    engine: EngineInstance, rid: int, n: int, kv: int, prompt: int, steps: int
) -> tuple[int, int]:
    """n requests with `kv`-token prompts decode `steps` tokens; a `prompt`-token
    request arrives after their first decode. Returns (next rid, steps run)."""
    sched = engine.scheduler
    vocab = engine.spec.shape.vocab_size
    cap = _capacity_tokens(engine.spec)
    n = max(1, min(n, engine.spec.limits.max_num_seqs - 1))
    kv = max(8, min(kv, cap // (n + 2) - steps - 8))
    prompt = max(8, min(prompt, cap - n * (kv + steps) - steps - 8))
    for _ in range(n):
        ids = [(rid * 31 + j) % (vocab - 1) + 1 for j in range(kv)]
        sched.add(EngineRequest(rid, 0.0, kv, steps, steps, ids))
        rid += 1
    count = 0
    added = False
    while sched.has_work():
        if not added and count and engine.steps and engine.steps[-1].num_decode_seqs:
            ids = [(rid * 17 + j) % (vocab - 1) + 1 for j in range(prompt)]
            sched.add(EngineRequest(rid, 0.0, prompt, 2, 2, ids))
            rid += 1
            added = True
        if engine.step() is not None:
            count += 1
    return rid, count


def _load_key(r: StepRecord) -> tuple:
    return (r.num_tokens, r.prefill_q, r.prefill_kv, r.num_decode_seqs, r.decode_kv_tokens,
            r.decode_q, r.num_draft_steps)  # fmt: skip


def _median_pass(passes: list[list[StepRecord]]) -> list[StepRecord]:
    """Per step, the record with the median cost over passes that ran the same steps
    (a burst of other load disturbs one pass, not all); every record if they differ."""
    keys = [[_load_key(r) for r in p] for p in passes]
    if any(k != keys[0] for k in keys[1:]):
        return [r for p in passes for r in p]
    out = []
    for group in zip(*passes, strict=True):
        ranked = sorted(group, key=lambda r: r.seconds)
        out.append(ranked[len(ranked) // 2])
    return out


def measure_engine_steps(
    spec: InstanceSpec, plan: SyntheticPlan | None = None, *, cpu_clock: bool = True
) -> tuple[StepRecord, ...]:
    """Run `spec`'s engine on synthetic batches; every step it ran, with its cost.

    The plan runs `plan.passes` times with the same acceptance coin, so every pass
    runs the same steps; each step's median-cost record is kept. The caller fixes
    torch's threads (as the replay does). `cpu_clock` times the steps on this
    thread's CPU time (`CpuClock`), as a replay on a shared CPU does."""
    import torch

    from profiler.reference_engine.realtime import CpuClock

    plan = plan or SyntheticPlan()
    passes: list[list[StepRecord]] = []
    with torch.inference_mode():
        engine = open_engine(spec)
        if cpu_clock:
            if engine.device.type != "cpu":
                raise ValueError("the cpu clock measures CPU engines only")
            engine.clock = CpuClock()
        engine.warm_up()
        for _ in range(max(1, plan.passes)):
            engine.coin = Random(spec.seed)
            rid = 0
            records: list[StepRecord] = []
            for i, n in enumerate(plan.decode_batches):
                for j, kv in enumerate(plan.kv_lengths):
                    prompt = plan.arriving_prompts[(i + j) % len(plan.arriving_prompts)]
                    engine.steps.clear()
                    rid, _ = _scenario(engine, rid, n, kv, prompt, plan.num_decode_steps)
                    records.extend(engine.steps)
            passes.append(records)
    return tuple(_median_pass(passes))


def step_observations(
    records: tuple[StepRecord, ...], *, draft: bool = False
) -> list[StepObservation]:
    """Engine steps as (StepLoad, seconds): the target's share of each step, or
    (`draft`) one draft-model step per drafting step, priced as the simulator does."""
    from optimizer.latency.base import StepLoad
    from optimizer.validation import StepObservation

    out = []
    for r in records:
        n = r.num_decode_seqs
        if draft:
            if r.num_draft_steps and r.draft_s > 0 and n:
                k = r.decode_q - 1
                load = StepLoad(n, n, (), (), n, max(r.decode_kv_tokens - n * k, n), 1)
                out.append(StepObservation(load, r.draft_s / r.num_draft_steps))
            continue
        decode_tokens = r.num_tokens - sum(r.prefill_q)
        load = StepLoad(
            r.num_tokens, len(r.prefill_q) + decode_tokens, r.prefill_q, r.prefill_kv, n,
            r.decode_kv_tokens, r.decode_q if n else 1,
        )  # fmt: skip
        out.append(StepObservation(load, r.seconds - r.draft_s))
    return out
