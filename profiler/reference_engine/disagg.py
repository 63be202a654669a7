"""Disaggregated replay: a prefill process and a decode process joined by a real KV channel.

This process runs the prefill instance (requests stop after their prompt; the
token sampled there is not delivered); a `torch.multiprocessing` child runs the
decode instance, which recomputes each prompt's last token and delivers the
first token, as vLLM's PD proxy does. When a
prompt is done, its KV (every layer's keys and values, (layers, 2, prompt,
g, d)) is copied out of the prefill pool, sent through a
`torch.multiprocessing` queue (the tensor travels through shared memory) and
only then are the prefill blocks freed, as the simulator frees them when the
transfer lands. The decode instance queues the request for KV blocks and
writes the received KV into them on admission. Transfers are counted (bytes,
send-to-receipt time).

On `Clock.CPU` (for a shared machine) each process runs on its own thread's
CPU clock (`CpuClock`), so other processes' load, and the two engines'
competition for cores, do not count. The prefill process publishes its
virtual time and the number of hand-offs sent after every step; a hand-off
carries its virtual send time plus the measured cost of moving the KV into
the channel (copy out of the pool and into shared memory, on the sender's
CPU clock and off its timeline, as a transfer link would run beside the
engine; writing it into the decode instance's blocks on admission is likewise
kept off the decode's timeline and added to the transfer time, as an RDMA
write into the paged pool would be). The decode process admits a hand-off at
its virtual arrival time and steps only once the prefill's published time has reached its own and
every hand-off sent so far has been received (conservative synchronisation:
nothing can arrive in its past), jumping forward over idle gaps.
"""

from __future__ import annotations

import contextlib
import queue
import time
from dataclasses import dataclass

from optimizer.config import Role, ServingConfig
from profiler.reference_engine.instance import EngineInstance, InstanceSpec, StepRecord, open_engine
from profiler.reference_engine.realtime import (
    Clock,
    CpuClock,
    ReplayOptions,
    ReplayRequests,
    ReplayResult,
    check_fits,
    collect,
    instance_spec,
    make_requests,
)
from profiler.reference_engine.scheduler import EngineError, EngineRequest

_READY_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class _Handoff:
    rid: int
    arrival_s: float
    num_prompt: int
    num_output: int
    token_ids: list[int]
    sent_s: float
    kv: object  # torch.Tensor (layers, 2, prompt, g, d)
    ready_s: float = 0.0  # virtual arrival at the decode instance (CPU clock only)


@dataclass(frozen=True, slots=True)
class _DecodeOutcome:
    rid: int
    token_times_s: list[float]
    num_preemptions: int
    received_s: float


def _accept(
    engine: EngineInstance,
    h: _Handoff,
    received: dict[int, tuple[EngineRequest, float]],
    at: float,
) -> None:
    """Queue a handed-off request on the decode engine with its prompt's KV, received at `at`.

    As with vLLM's PD proxy, the decode instance recomputes the last prompt token (its KV
    is written again, the same values) and samples the first token the client sees."""
    r = EngineRequest(
        h.rid, h.arrival_s, h.num_prompt, h.num_output, h.num_output,
        list(h.token_ids[: h.num_prompt]), num_computed=h.num_prompt - 1, num_generated=0,
    )  # fmt: skip
    engine.pending_kv[h.rid] = h.kv  # type: ignore[assignment]
    received[h.rid] = (r, at)
    engine.scheduler.add(r)


def _decode_worker(spec: InstanceSpec, num_threads: int, inbox, outbox) -> None:
    import torch

    torch.set_num_threads(num_threads)
    with torch.inference_mode():
        engine = open_engine(spec)
        engine.warm_up()
        outbox.put(("ready", None))
        sched = engine.scheduler
        received: dict[int, tuple[EngineRequest, float]] = {}
        ended = False
        active = 0
        while not ended or active:
            try:
                msg = inbox.get(block=not sched.has_work(), timeout=1.0)
            except queue.Empty:
                msg = None
            while msg is not None:
                if msg == "end":
                    ended = True
                else:
                    _accept(engine, msg, received, time.perf_counter())
                    active += 1
                try:
                    msg = inbox.get_nowait()
                except queue.Empty:
                    msg = None
            if sched.has_work():
                result = engine.step()
                if result is not None:
                    active -= len(result[1])
        outcomes = [
            _DecodeOutcome(r.rid, r.token_times_s, r.num_preemptions, t)
            for r, t in received.values()
        ]
        outbox.put(("done", (outcomes, tuple(engine.steps), 0.0)))


def _decode_worker_cpu(spec: InstanceSpec, num_threads: int, inbox, outbox, shared) -> None:
    """The decode instance on its own CPU clock, kept behind the prefill's (see module doc)."""
    import heapq

    import torch

    from profiler.reference_engine.realtime import CpuClock

    torch.set_num_threads(num_threads)
    with torch.inference_mode():
        engine = open_engine(spec)
        engine.warm_up()
        clock = CpuClock()
        engine.clock = clock
        outbox.put(("ready", None))
        sched = engine.scheduler
        pending: list[tuple[float, int, _Handoff]] = []
        received: dict[int, tuple[EngineRequest, float]] = {}
        num_received = 0

        def take(msg: object) -> None:
            nonlocal num_received
            if msg == "end":
                return
            h: _Handoff = msg  # type: ignore[assignment]
            heapq.heappush(pending, (h.ready_s, h.rid, h))
            num_received += 1

        while True:
            spin = time.thread_time()  # waiting costs are kept off the clock
            with shared.get_lock():
                p_time, p_sent, p_done = shared[0], int(shared[1]), shared[2] > 0
            while True:
                try:
                    take(inbox.get_nowait())
                except queue.Empty:
                    break
            if num_received < p_sent:  # a sent hand-off is still in the queue's pipe
                with contextlib.suppress(queue.Empty):
                    take(inbox.get(timeout=0.5))
                clock.exclude(time.thread_time() - spin)
                continue
            # Every hand-off due by `horizon` is known: later ones are sent after p_time.
            horizon = float("inf") if p_done else p_time
            clock.exclude(time.thread_time() - spin)
            now = clock()
            while pending and pending[0][0] <= now:
                _, _, h = heapq.heappop(pending)
                _accept(engine, h, received, h.ready_s)
            if sched.has_work() and now <= horizon:
                engine.step()
                continue
            if pending and not sched.has_work() and pending[0][0] <= horizon:
                clock.wait_until(pending[0][0])
                continue
            if p_done and not pending and not sched.has_work():
                break
            spin = time.thread_time()
            with contextlib.suppress(queue.Empty):  # wait for the prefill to move on
                take(inbox.get(timeout=0.002))
            clock.exclude(time.thread_time() - spin)
        outcomes = [
            _DecodeOutcome(r.rid, r.token_times_s, r.num_preemptions, t)
            for r, t in received.values()
        ]
        outbox.put(("done", (outcomes, tuple(engine.steps), engine.install_s)))


def _receive(outbox, worker, timeout_s: float | None) -> tuple[str, object]:
    """The worker's next message; a clear error if it died or stayed silent."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        try:
            return outbox.get(timeout=0.5)
        except queue.Empty:
            if not worker.is_alive():
                raise EngineError(
                    f"decode worker exited with code {worker.exitcode} (see its stderr); "
                    "scripts that replay disaggregated configs need an "
                    "`if __name__ == '__main__':` guard (spawned processes re-import them)"
                ) from None
            if deadline is not None and time.monotonic() > deadline:
                raise EngineError(f"decode worker not ready after {timeout_s:.0f} s") from None


def replay_disaggregated(
    requests: ReplayRequests, config: ServingConfig, options: ReplayOptions
) -> ReplayResult:
    import torch
    import torch.multiprocessing as mp

    from profiler.reference_engine.realtime import run_realtime
    from profiler.timing import fixed_threads

    cpu = options.clock is Clock.CPU
    prefill_spec = instance_spec(config, Role.PREFILL, options)
    decode_spec = instance_spec(config, Role.DECODE, options, seed_offset=7)
    if cpu and prefill_spec.device != "cpu":
        raise EngineError("the cpu clock measures CPU replays only; use clock=wall")
    check_fits(requests, prefill_spec, prompt_only=True)
    check_fits(requests, decode_spec, prompt_only=False)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    shared = ctx.Array("d", 3)  # prefill's virtual time, hand-offs sent, done (CPU clock)
    target, args = _decode_worker, (decode_spec, options.num_threads, inbox, outbox)
    if cpu:
        target, args = _decode_worker_cpu, (*args, shared)
    worker = ctx.Process(target=target, args=args, daemon=True)
    worker.start()
    transfers = {"n": 0, "bytes": 0}
    sent_at: dict[int, float] = {}
    try:
        with fixed_threads(options.num_threads), torch.inference_mode():
            engine = open_engine(prefill_spec)
            engine.warm_up()
            kind, _ = _receive(outbox, worker, _READY_TIMEOUT_S)
            if kind != "ready":
                raise EngineError(f"decode worker answered {kind!r} instead of 'ready'")
            reqs = make_requests(requests, seed=options.seed, disaggregated=True)
            clock = CpuClock() if cpu else None
            if clock is not None:
                engine.clock = clock

            def hand_off(r: EngineRequest) -> None:
                if r.stop_at == r.num_output:
                    return  # a one-token output finishes on the prefill instance
                begin = time.thread_time()
                kv = engine.read_prompt_kv(r).share_memory_()
                engine.scheduler.release(r)
                cost = time.thread_time() - begin
                if clock is not None:  # the channel's work, off the prefill's timeline
                    clock.exclude(cost)
                now = engine.clock()
                sent_at[r.rid] = now
                transfers["n"] += 1
                transfers["bytes"] += kv.numel() * kv.element_size()
                inbox.put(
                    _Handoff(r.rid, r.arrival_s, r.num_prompt, r.num_output, r.token_ids,
                             now, kv, now + cost)
                )  # fmt: skip

            def publish(done: bool = False) -> None:
                with shared.get_lock():
                    shared[0], shared[1], shared[2] = engine.clock(), transfers["n"], float(done)

            t0 = engine.clock() + 0.01
            run_realtime(engine, reqs, t0, hand_off, publish if cpu else None)
            publish(done=True)
            inbox.put("end")
            kind, payload = _receive(outbox, worker, None)
        outcomes, decode_steps, install_s = payload
    finally:
        worker.join(timeout=30)
        if worker.is_alive():
            worker.kill()
    by_rid = {o.rid: o for o in outcomes}
    transfer_s = 0.0
    for r in reqs:
        o = by_rid.get(r.rid)
        if o is None:
            continue
        r.token_times_s = o.token_times_s
        r.num_generated = r.num_output
        r.num_preemptions += o.num_preemptions
        transfer_s += o.received_s - sent_at[r.rid]
    missing = [r.rid for r in reqs if len(r.token_times_s) != r.num_output]
    if missing:
        raise EngineError(f"decode instance did not finish requests {missing[:5]}")
    steps: tuple[tuple[str, tuple[StepRecord, ...]], ...] = (
        ("prefill", tuple(engine.steps)),
        ("decode", decode_steps),
    )
    return collect(
        reqs,
        t0,
        steps,
        num_kv_transfers=transfers["n"],
        kv_transfer_bytes=transfers["bytes"],
        kv_transfer_s=transfer_s + install_s,
    )
