"""The reference engine's scheduler: token budget, max_num_seqs, preemption, completion."""

from __future__ import annotations

import pytest

from profiler.reference_engine.scheduler import (
    EngineError,
    EngineRequest,
    Scheduler,
    SchedulerLimits,
)


def make_scheduler(**kw: int | bool) -> Scheduler:
    limits = {
        "max_num_batched_tokens": 64,
        "max_num_seqs": 4,
        "enable_chunked_prefill": True,
        "block_size": 4,
        "num_blocks": 256,
        "num_speculative_tokens": 0,
    }
    limits.update(kw)
    return Scheduler(SchedulerLimits(**limits))  # type: ignore[arg-type]


def make_request(rid: int, prompt: int, output: int) -> EngineRequest:
    return EngineRequest(rid, 0.0, prompt, output, output, list(range(prompt)))


def run_step(s: Scheduler, t: float = 0.0, accepted: int = 0) -> tuple[list, list]:
    """Plan and commit a step with fake tokens: decodes emit accepted + 1 (capped)."""
    chunks = s.plan(t)
    emitted = []
    for c in chunks:
        r = c.request
        if c.is_decode:
            made = min(accepted, c.num_new - 1) + 1
            emitted.append([7] * min(made, r.stop_at - r.num_generated))
        else:
            emitted.append([7] if c.start + c.num_new == r.num_tokens else [])
    return chunks, s.commit(chunks, emitted, t)


def test_budget_is_split_into_prompt_chunks() -> None:
    s = make_scheduler(max_num_batched_tokens=32)
    s.add(make_request(0, 50, 3))
    s.add(make_request(1, 10, 3))
    chunks, _ = run_step(s)
    assert [(c.request.rid, c.num_new) for c in chunks] == [(0, 32)]
    chunks, _ = run_step(s)
    # request 0 finishes its prompt (18) and request 1 takes its whole prompt (10)
    assert [(c.request.rid, c.num_new, c.is_decode) for c in chunks] == [
        (0, 18, False),
        (1, 10, False),
    ]
    assert sum(c.num_new for c in chunks) <= 32
    chunks, _ = run_step(s)
    assert [(c.request.rid, c.num_new, c.is_decode) for c in chunks] == [(0, 1, True), (1, 1, True)]


def test_no_chunking_waits_for_a_whole_prompt() -> None:
    s = make_scheduler(max_num_batched_tokens=32, enable_chunked_prefill=False)
    s.add(make_request(0, 20, 2))
    s.add(make_request(1, 20, 2))
    chunks, _ = run_step(s)
    assert [(c.request.rid, c.num_new) for c in chunks] == [(0, 20)]


def test_max_num_seqs_limits_running_requests() -> None:
    s = make_scheduler(max_num_seqs=2)
    for i in range(4):
        s.add(make_request(i, 4, 5))
    chunks, _ = run_step(s)
    assert [c.request.rid for c in chunks] == [0, 1]
    assert len(s.running) == 2 and len(s.waiting) == 2


def test_first_scheduling_is_recorded_once() -> None:
    """`first_scheduled_s` is the start of the step that first admitted the request
    (vLLM's queue time ends there); a later admission does not move it."""
    s = make_scheduler(max_num_seqs=1, num_blocks=6, block_size=4)
    a, b = make_request(0, 8, 2), make_request(1, 8, 2)
    s.add(a)
    s.add(b)
    run_step(s, 1.0)
    assert a.first_scheduled_s == 1.0 and b.first_scheduled_s is None
    t = 2.0
    while s.has_work():
        run_step(s, t)
        t += 1.0
    assert a.first_scheduled_s == 1.0 and b.first_scheduled_s == 3.0  # a finished at 2


def test_preempts_newest_and_every_request_completes() -> None:
    # 6 blocks of 4 tokens: two requests of 8 + 8 tokens cannot both finish
    s = make_scheduler(num_blocks=6, block_size=4)
    a, b = make_request(0, 8, 8), make_request(1, 8, 8)
    s.add(a)
    s.add(b)
    finished: list[EngineRequest] = []
    preempted_seen = False
    for step in range(200):
        if not s.has_work():
            break
        _, done = run_step(s, float(step))
        finished += done
        used = sum(len(r.blocks) for r in s.running)
        assert used + s.pool.num_free == 6  # blocks never leak or go negative
        preempted_seen |= b.num_preemptions > 0
    assert preempted_seen and a.num_preemptions == 0  # the newest is the victim
    assert b.first_scheduled_s == 0.0  # its first admission, not its readmission
    assert {r.rid for r in finished} == {0, 1}
    assert all(r.num_generated == r.num_output for r in finished)
    assert s.pool.num_free == 6


def test_speculation_alpha_one_emits_k_plus_one() -> None:
    s = make_scheduler(num_speculative_tokens=3)
    r = make_request(0, 8, 9)
    s.add(r)
    run_step(s)  # prefill: first token
    assert r.num_generated == 1
    chunks, _ = run_step(s, accepted=3)
    assert chunks[0].num_new == 4 and r.num_generated == 5
    run_step(s, accepted=3)
    assert r.num_generated == 9  # capped at the output length
    assert not s.has_work()


def test_speculation_alpha_zero_emits_one() -> None:
    s = make_scheduler(num_speculative_tokens=3)
    r = make_request(0, 8, 4)
    s.add(r)
    run_step(s)
    chunks, _ = run_step(s, accepted=0)
    assert chunks[0].num_new == 4 and r.num_generated == 2


def test_bad_limits_are_rejected() -> None:
    with pytest.raises(EngineError, match="num_blocks"):
        make_scheduler(num_blocks=0)


def test_agrees_with_the_simulator_scheduler_step_by_step() -> None:
    """Same arrivals, same limits: the engine and the simulator plan identical steps."""
    from random import Random

    from optimizer.sim.fleet import make_scheduler as make_sim_scheduler
    from optimizer.sim.metrics import RunLog
    from optimizer.sim.request import SimRequest

    rng = Random(3)
    lens = [(rng.randint(5, 60), rng.randint(1, 12)) for _ in range(12)]
    kw = {"max_num_batched_tokens": 48, "max_num_seqs": 5, "block_size": 4, "num_blocks": 40}
    eng = make_scheduler(**kw)
    sim = make_sim_scheduler(
        role="replica", index=0, max_num_batched_tokens=48, max_num_seqs=5,
        enable_chunked_prefill=True, block_size=4, num_blocks=40, num_spec=0,
        log=RunLog(len(lens)), rng=Random(0), force_general=True,
    )  # fmt: skip
    for i, (p, o) in enumerate(lens):
        eng.add(make_request(i, p, o))
        sim.waiting.append(SimRequest(i, 0.0, p, o, o))
    for step in range(500):
        if not eng.has_work():
            break
        chunks, _ = run_step(eng, float(step))
        sim.schedule(float(step))
        planned = [(r.rid, n, d) for r, n, d in sim.chunks]
        assert [(c.request.rid, c.num_new, c.is_decode) for c in chunks] == planned, step
        sim.complete(float(step) + 0.5)
    assert not eng.has_work() and not sim.has_work()
    assert eng.num_preemptions == sim.num_preemptions > 0
