"""Disaggregated replay: a prefill process and a decode process joined by a real KV channel.

This process runs the prefill instance (requests stop after their first
token); a `torch.multiprocessing` child runs the decode instance. When a
prompt is done, its KV (every layer's keys and values, (layers, 2, prompt,
g, d)) is copied out of the prefill pool, sent through a
`torch.multiprocessing` queue (the tensor travels through shared memory) and
only then are the prefill blocks freed, as the simulator frees them when the
transfer lands. The decode instance queues the request for KV blocks and
writes the received KV into them on admission. Transfers are counted (bytes,
send-to-receipt time).
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass

from optimizer.config import Role, ServingConfig
from profiler.engine.instance import EngineInstance, InstanceSpec, StepRecord
from profiler.engine.realtime import (
    Clock,
    ReplayOptions,
    ReplayRequests,
    ReplayResult,
    check_fits,
    collect,
    instance_spec,
    make_requests,
)
from profiler.engine.scheduler import EngineError, EngineRequest

_READY_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class _Handoff:
    rid: int
    arrival_s: float
    num_prompt: int
    num_output: int
    token_ids: list[int]
    first_token_s: float
    sent_s: float
    kv: object  # torch.Tensor (layers, 2, prompt, g, d)


@dataclass(frozen=True, slots=True)
class _DecodeOutcome:
    rid: int
    token_times_s: list[float]
    num_preemptions: int
    received_s: float


def _decode_worker(spec: InstanceSpec, num_threads: int, inbox, outbox) -> None:
    import torch

    torch.set_num_threads(num_threads)
    with torch.inference_mode():
        engine = EngineInstance(spec)
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
                    h: _Handoff = msg
                    now = time.perf_counter()
                    r = EngineRequest(
                        h.rid, h.arrival_s, h.num_prompt, h.num_output, h.num_output,
                        list(h.token_ids), num_computed=h.num_prompt, num_generated=1,
                        token_times_s=[h.first_token_s],
                    )  # fmt: skip
                    engine.pending_kv[h.rid] = h.kv  # type: ignore[assignment]
                    received[h.rid] = (r, now)
                    sched.add(r)
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
        outbox.put(("done", (outcomes, tuple(engine.steps))))


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

    from profiler.engine.realtime import run_realtime
    from profiler.timing import fixed_threads

    if options.clock is not Clock.WALL:
        raise EngineError("disaggregated replays run on the wall clock (two processes)")
    prefill_spec = instance_spec(config, Role.PREFILL, options)
    decode_spec = instance_spec(config, Role.DECODE, options, seed_offset=7)
    check_fits(requests, prefill_spec, prompt_only=True)
    check_fits(requests, decode_spec, prompt_only=False)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(
        target=_decode_worker, args=(decode_spec, options.num_threads, inbox, outbox), daemon=True
    )
    worker.start()
    transfers = {"n": 0, "bytes": 0}
    sent_at: dict[int, float] = {}
    try:
        with fixed_threads(options.num_threads), torch.inference_mode():
            engine = EngineInstance(prefill_spec)
            engine.warm_up()
            kind, _ = _receive(outbox, worker, _READY_TIMEOUT_S)
            if kind != "ready":
                raise EngineError(f"decode worker answered {kind!r} instead of 'ready'")
            reqs = make_requests(requests, seed=options.seed, disaggregated=True)

            def hand_off(r: EngineRequest) -> None:
                if r.stop_at == r.num_output:
                    return  # a one-token output finishes on the prefill instance
                kv = engine.read_prompt_kv(r)
                engine.scheduler.release(r)
                now = time.perf_counter()
                sent_at[r.rid] = now
                transfers["n"] += 1
                transfers["bytes"] += kv.numel() * kv.element_size()
                inbox.put(
                    _Handoff(r.rid, r.arrival_s, r.num_prompt, r.num_output, r.token_ids,
                             r.token_times_s[0], now, kv)
                )  # fmt: skip

            t0 = time.perf_counter() + 0.01
            run_realtime(engine, reqs, t0, hand_off)
            inbox.put("end")
            kind, payload = _receive(outbox, worker, None)
        outcomes, decode_steps = payload
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
        kv_transfer_s=transfer_s,
    )
