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
        preempted = False
        i = 0
        while i < len(running):
            r = running[i]
            remaining = r.num_prompt + r.num_generated - r.num_computed
            # The last token of a recompute is still prompt: its step samples the next token
            # after the whole gap (as on the fast path), not one step after the last.
            is_dec = remaining == 1 and r.num_generated > 0 and not r.recomputing
            num_new = 1 + self.num_spec if is_dec else remaining
            if num_new > budget:
                num_new = budget
            if align and not is_dec and num_new > 0:
                num_new = self.aligned_chunk(r, r.num_computed, num_new)
            if num_new <= 0:
                i += 1
                continue
            # pool.extra_blocks, inlined: this line runs for every running request of every
            # step, where a method call costs ~5% of a speculative simulation.
            need = -(-(r.num_computed + num_new) // bs) + state - r.num_blocks - r.num_ref_blocks
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
            i += 1
        return budget, preempted

    def _admit_prefill(self, r: SimRequest) -> None:
        self.running.append(r)

    def _build_load(self) -> StepLoad | None:
        chunks = self.chunks
        if not chunks:
            return None
        pq_l: list[int] = []
        pkv_l: list[int] = []
        n_dec = dec_tokens = kv = kv_q1 = 0
        for r, n, is_dec in chunks:
            if is_dec:
                n_dec += 1
                dec_tokens += n
                kv += r.num_computed + n
                kv_q1 += r.num_computed + 1
            else:
                pq_l.append(n)
                pkv_l.append(r.num_computed + n)
        self.step_nseqs = len(chunks)
        self.step_kv_q1 = kv_q1
        num_tokens = dec_tokens + sum(pq_l)
        return StepLoad(
            num_tokens, len(pq_l) + dec_tokens, tuple(pq_l), tuple(pkv_l), n_dec, kv,
            1 + self.num_spec if n_dec else 1,
        )  # fmt: skip

    # ------------------------------------------------------------------ completion

    def _complete(self, t: float) -> tuple[int, int]:
        n_dec = n_itl = zeros = 0
        any_finished = False
        cache = self.prefix is not None
        rand = self.rng.random
        for r, n, is_dec in self.chunks:
            if is_dec:
                n_dec += 1
                drafts = n - 1
                accepted = 0
                if drafts > 0:
                    la = r.log_alpha
                    if la == 0.0:
                        accepted = drafts
                    elif la != -_INF:
                        accepted = int(math.log(1.0 - rand()) / la)
                        if accepted > drafts:
                            accepted = drafts
                made = accepted + 1
                cap = r.stop_at - r.num_generated
                if made > cap:
                    made = cap
                r.num_computed += made
                r.num_generated += made
                self.log.tokens_emitted += made
                zeros += made - 1
                n_itl += 1
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
        if zeros:
            self.log.num_zero_gaps += zeros
        return n_dec, n_itl

    def _held_blocks(self) -> int:
        return sum(r.num_blocks for r in self.running)
