"""The general path: every running request visited every step (speculation, or forced
to cross-check the fast path).

A decoding request runs 1 + K tokens when verifying K speculative tokens;
acceptance is drawn per step from the request's per-token rate α (i.i.d.,
Leviathan et al.), capped at the tokens it still has to produce.
"""

from __future__ import annotations

import math

from optimizer.latency.base import StepLoad
from optimizer.sim.request import SimRequest
from optimizer.sim.scheduler import BaseScheduler

_INF = math.inf


class PerRequestScheduler(BaseScheduler):
    __slots__ = ("running",)

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.running: list[SimRequest] = []  # admission order

    @property
    def num_running(self) -> int:
        return len(self.running)

    def _num_admitted(self) -> int:
        return len(self.running)

    # ------------------------------------------------------------------ scheduling

    def _schedule_running(self, now: float) -> tuple[int, bool]:
        running = self.running
        budget = self.budget
        chunks = self.chunks
        pool = self.pool
        bs, state = pool.block_size, pool.state_blocks
        align = self.align_block
        dec_new = 1 + self.num_spec
        preempted = False
        # Preemption pops from the list's end: the loop then stops before the popped ones.
        for r in running:
            computed = r.num_computed
            remaining = r.num_prompt + r.num_generated - computed
            # The last token of a recompute is still prompt: its step samples the next token
            # after the whole gap (as on the fast path), not one step after the last.
            is_dec = remaining == 1 and r.num_generated > 0 and not r.recomputing
            num_new = dec_new if is_dec else remaining
            if num_new > budget:
                num_new = budget
            if align and not is_dec and num_new > 0:
                num_new = self.aligned_chunk(r, computed, num_new)
            if num_new <= 0:
                continue
            # pool.extra_blocks, inlined: this line runs for every running request of every
            # step, where a method call costs ~5% of a speculative simulation.
            need = -(-(computed + num_new) // bs) + state - r.num_blocks - r.num_ref_blocks
            if need > pool.num_free:
                victim = None
                while need > pool.num_free:
                    victim = running.pop()
                    self._requeue(victim)
                    preempted = True
                    if victim is r:
                        break
                if victim is r:
                    break
            if need > 0:
                pool.grow(r, need)
            chunks.append((r, num_new, is_dec))
            budget -= num_new
        return budget, preempted

    def _admit_prefill(self, r: SimRequest) -> None:
        self.running.append(r)

    def _build_load(self) -> StepLoad | None:
        chunks = self.chunks
        if not chunks:
            return None
        pq_l: list[int] = []
        pkv_l: list[int] = []
        n_dec = dec_tokens = computed = 0
        for r, n, is_dec in chunks:
            if is_dec:
                n_dec += 1
                dec_tokens += n
                computed += r.num_computed
            else:
                pq_l.append(n)
                pkv_l.append(r.num_computed + n)
        self.step_nseqs = len(chunks)
        self.step_kv_q1 = computed + n_dec  # each decode's KV with its next token
        num_tokens = dec_tokens + sum(pq_l)
        decode_q = 1 + self.num_spec if n_dec else 1
        kv = computed + dec_tokens
        pq, pkv = tuple(pq_l), tuple(pkv_l)
        return StepLoad(num_tokens, len(pq_l) + dec_tokens, pq, pkv, n_dec, kv, decode_q)

    # ------------------------------------------------------------------ completion

    def _complete(self, t: float) -> int:
        n_dec = emitted = 0  # decoding sequences, the tokens they emitted
        any_finished = False
        cache = self.prefix is not None
        rand = self.rng.random
        for r, n, is_dec in self.chunks:
            if is_dec:
                n_dec += 1
                made = 1  # the verified token, and the accepted drafts of the n - 1
                if n > 1:
                    la = r.log_alpha
                    if la == 0.0:
                        made = n
                    elif la != -_INF:
                        accepted = int(math.log(1.0 - rand()) / la)
                        made = accepted + 1 if accepted < n - 1 else n
                cap = r.stop_at - r.num_generated
                if made > cap:
                    made = cap
                r.num_computed += made
                r.num_generated += made
                emitted += made
                r.last_token_s = t
            else:
                r.num_computed += n
                if cache:
                    self._cache_computed(r)
                if r.num_computed == r.num_prompt + r.num_generated:
                    self._sample_caught_up(r, t)
            if r.num_generated >= r.stop_at:
                any_finished = True
                self._finish(r, t)
        if any_finished:
            self.running = [r for r in self.running if r.num_generated < r.stop_at]
        log = self.log
        log.tokens_emitted += emitted
        zeros = emitted - n_dec  # tokens that arrived with another (ITL gaps of 0)
        if zeros and t > log.from_s:
            log.itl.add(0.0, zeros)
        return n_dec

    def _held_blocks(self) -> int:
        return sum(r.num_blocks for r in self.running)
