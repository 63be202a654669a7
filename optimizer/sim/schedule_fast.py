"""The fast path: decodes tracked in aggregate (no speculation).

Without speculation each decoding request gains exactly one token per step, so
its progress is implicit (`SimRequest`): after joining the decode set at step
`join_step` with `join_computed` tokens cached it has `join_computed + S -
join_step` cached at step S. The set's KV-token sum grows by its size each
step; a decode needs a new block on the steps where its cached length is a
multiple of the block size, so new-block demand is a per-phase counter
(`phase_count`); finishes are bucketed by step number. A step costs O(1) plus
O(requests that join, finish or are preempted). The set's blocks are taken from
the pool in aggregate (`KVBlockPool.allocate`); a request leaving the set
(preempted or finished) gets its explicit state back (`KVBlockPool.settle`).

A decode stretch runs in one jump: between two changes of the decode set (a join, a
finish, a preemption) a decode-only step with nothing else to admit is followed by steps
that differ only in the KV tokens they attend to (`kv_sum` grows by the set's size) and
the blocks they take (the per-phase demand). `plan_run` says how many such steps follow
from the one just planned, and `apply_run` applies the first j of them at once, exactly
as j rounds of `complete` and `schedule` would; the event loop prices and times them.
"""

from __future__ import annotations

from heapq import heappop, heappush

import numpy as np

from optimizer.latency.base import StepLoad
from optimizer.sim.kv_blocks import blocks_for
from optimizer.sim.request import SimRequest
from optimizer.sim.scheduler import BaseScheduler


class AggregateDecodeScheduler(BaseScheduler):
    __slots__ = (
        "decodes",
        "finish_at",
        "finish_steps",
        "kv_sum",
        "partial",
        "phase_count",
        "run_clamp",
        "run_first",
        "run_gen",
        "run_kv0",
        "run_need",
        "run_used0",
    )

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        bs = self.pool.block_size
        self.decodes: dict[int, SimRequest] = {}  # admission order
        self.partial: SimRequest | None = None  # a chunked prompt, always last in order
        self.phase_count = [0] * bs  # decodes needing a new block at step S, by S % bs
        self.kv_sum = 0  # KV tokens the decode set attends to this step
        self.finish_at: dict[int, list[SimRequest]] = {}
        self.finish_steps: list[int] = []  # a heap of the keys of `finish_at`
        # A decode stretch under way (`plan_run`): its first step, KV tokens and blocks
        # used at that step, the blocks the later steps take (cumulative), the cumulative
        # count of its steps priced below the floor (None: none), and a generation
        # number that retires the loop's event of a run cut short.
        self.run_first = 0
        self.run_kv0 = 0
        self.run_used0 = 0
        self.run_need: np.ndarray | None = None
        self.run_clamp: np.ndarray | None = None
        self.run_gen = 0

    @property
    def num_running(self) -> int:
        return len(self.decodes) + (self.partial is not None)

    def _num_admitted(self) -> int:
        return self.num_running + len(self.chunks)

    # ------------------------------------------------------------------ preemption

    def _preempt_decode(self, r: SimRequest, step: int, now: float) -> None:
        """Materialise a decode's implicit state, then requeue it."""
        bs = self.pool.block_size
        progressed = step - r.join_step
        computed = r.join_computed + progressed
        r.num_generated = r.join_generated + progressed
        self.pool.settle(r, computed)
        r.last_token_s = now  # its last token came at the end of the previous step
        self.kv_sum -= computed + 1
        self.phase_count[(r.join_step - r.join_computed) % bs] -= 1
        r.join_step = -1
        self._requeue(r)

    # ------------------------------------------------------------------ scheduling

    def _schedule_running(self, now: float) -> tuple[int, bool]:
        decodes = self.decodes
        pool = self.pool
        preempted = False
        if decodes:
            step = self.step_no
            bs = pool.block_size
            phase = step % bs
            need = self.phase_count[phase]
            if need > pool.num_free:
                preempted = True
                if self.partial is not None:
                    self._requeue(self.partial)
                    self.partial = None
                while need > pool.num_free and decodes:
                    _, r = decodes.popitem()
                    if (r.join_step - r.join_computed) % bs == phase:
                        need -= 1
                    self._preempt_decode(r, step, now)
            if need:  # blocks for the decode set, counted in aggregate
                pool.allocate(need)
        budget = self.budget - len(decodes)
        r = self.partial
        if r is not None and budget > 0:
            chunk = min(r.num_prompt + r.num_generated - r.num_computed, budget)
            need = pool.extra_blocks(r, r.num_computed + chunk)
            self.partial = None
            if not pool.can_allocate(need):
                self._requeue(r)
                preempted = True
            else:
                pool.grow(r, need)
                self.chunks.append((r, chunk, False))
                budget -= chunk
        return budget, preempted

    def _admit_prefill(self, r: SimRequest) -> None:
        pass  # tracked in `chunks` until it completes

    def _join_decodes(self, r: SimRequest, step: int) -> None:
        """Enter the aggregate decode set, decoding from `step` on."""
        computed = r.num_computed
        r.join_step = step
        r.join_computed = computed
        r.join_generated = r.num_generated
        self.phase_count[(step - computed) % self.pool.block_size] += 1
        self.kv_sum += computed + 1
        finish = step + r.stop_at - r.num_generated - 1
        r.finish_step = finish
        bucket = self.finish_at.get(finish)
        if bucket is None:
            self.finish_at[finish] = [r]
            heappush(self.finish_steps, finish)
        else:
            bucket.append(r)
        self.decodes[r.rid] = r

    def _build_load(self) -> StepLoad | None:
        chunks = self.chunks
        n_dec = len(self.decodes)
        kv = self.kv_sum
        if not chunks:
            if not n_dec:
                return None
            self.step_nseqs = n_dec
            self.step_kv_q1 = kv
            return StepLoad(n_dec, n_dec, (), (), n_dec, kv, 1)
        if len(chunks) == 1:  # the common case: one prompt chunk
            r, c, _ = chunks[0]
            pq, pkv, tokens = (c,), (r.num_computed + c,), c
        else:
            pq = tuple([c for _, c, _ in chunks])
            pkv = tuple([r.num_computed + c for r, c, _ in chunks])
            tokens = sum(pq)
        self.step_nseqs = n_dec + len(chunks)
        self.step_kv_q1 = kv
        return StepLoad(n_dec + tokens, self.step_nseqs, pq, pkv, n_dec, kv, 1)

    # ------------------------------------------------------------------ decode stretches

    def plan_run(self, max_steps: int, min_steps: int = 2) -> int:
        """Steps, from the one just planned on (it included, at most `max_steps`), that run
        the same decode set with nothing else to do: up to the first finish, and short of
        the first step whose new blocks the pool no longer has (that one preempts); 1 when
        the step just planned is not decode-only, something waits to be admitted, or fewer
        than `min_steps` would run. Above 1 it records the run for `apply_run`."""
        n = len(self.decodes)
        if not n or self.chunks or self.partial is not None or self.waiting or self.ready:
            return 1
        first = self.step_no
        finishes = self.finish_steps
        while finishes[0] < first:  # keys of steps already completed
            heappop(finishes)
        k = min(finishes[0] - first + 1, max_steps)
        if k < min_steps:
            return 1
        pool = self.pool
        phases = (np.arange(first + 1, first + k, dtype=np.int64)) % pool.block_size
        need = np.cumsum(np.array(self.phase_count, dtype=np.int64)[phases])
        free = pool.num_free
        if need[-1] > free:
            k = int(np.argmax(need > free)) + 1
            if k < min_steps:
                return 1
            need = need[: k - 1]
        self.run_first = first
        self.run_kv0 = self.kv_sum
        self.run_used0 = pool.num_used
        self.run_need = need
        return k

    def apply_run(self, j: int, ends: np.ndarray, durs: np.ndarray, start_s: float) -> None:
        """Apply the first `j` (>= 1) steps of the run `plan_run` recorded, which ended at
        `ends` after `durs` (arrays of j), and plan the next, which starts at `start_s`:
        what `complete` and `schedule` would do j times (no request joins, finishes or is
        preempted on the way)."""
        n = len(self.decodes)
        kv0, need = self.run_kv0, self.run_need
        self.steps.add_run(ends, durs, n, self.run_used0, need)
        self.log.tokens_emitted += n * j
        self.kv_sum = kv0 + n * j
        take = int(need[j - 1])
        if take:
            self.pool.allocate(take)
        self.step_no = self.run_first + j
        self.step_nseqs = n
        self.step_kv_q1 = self.kv_sum
        self.step_start = start_s

    # ------------------------------------------------------------------ completion

    def _complete(self, t: float) -> int:
        step = self.step_no
        decodes = self.decodes
        n_dec = len(decodes)
        finished = self.finish_at.pop(step, None)
        if finished:
            bs = self.pool.block_size
            for r in finished:
                if r.join_step < 0 or r.finish_step != step:
                    continue  # preempted since; a stale entry
                del decodes[r.rid]
                computed = r.join_computed + step - r.join_step + 1
                self.kv_sum -= computed
                self.phase_count[(r.join_step - r.join_computed) % bs] -= 1
                r.num_computed = computed
                r.num_generated = r.stop_at
                self.pool.settle(r, computed)
                r.join_step = -1
                r.last_token_s = t
                self._finish(r, t)
        self.kv_sum += len(decodes)
        self.log.tokens_emitted += n_dec
        # Chunks join the decode set in admission order (preemption takes the most
        # recently admitted first, as vLLM's running list).
        cache = self.prefix is not None
        for r, chunk, _ in self.chunks:
            r.num_computed += chunk
            if cache:
                self._cache_computed(r)
            if r.num_computed == r.num_prompt + r.num_generated:
                self._sample_caught_up(r, t)
                if r.num_generated < r.stop_at:
                    self._join_decodes(r, step + 1)
                else:
                    self._finish(r, t)
            else:
                self.partial = r
        return n_dec

    def _held_blocks(self) -> int:
        bs, step = self.pool.block_size, self.step_no
        # A decode holds its cached tokens plus the slot of the token this step writes.
        held = sum(blocks_for(r.join_computed + step - r.join_step + 1, bs) - r.num_ref_blocks
                   for r in self.decodes.values())  # fmt: skip
        held += self.pool.state_blocks * len(self.decodes)
        held += sum(r.num_blocks for r, _, _ in self.chunks)
        return held + (self.partial.num_blocks if self.partial is not None else 0)
