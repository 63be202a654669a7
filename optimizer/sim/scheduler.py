"""One serving instance: a vLLM-v1-style scheduler over a KV block pool.

Each step (DOMAIN.md §6): running requests first, in admission order (1 token
each, 1+K when verifying speculation, or their next prompt chunk), then waiting
requests in FCFS order take budgeted prompt chunks while `running <
max_num_seqs` and KV blocks can be allocated. When blocks run out, the most
recently admitted running request is preempted (KV freed, recomputed later);
no waiting request is admitted in a step that preempted.

Two equivalent code paths keep the hot loop cheap:
- fast path (no speculation): each decoding request gains exactly one token
  per step, so decodes are tracked in aggregate. Their KV-token sum grows by
  the decode count each step; a decode needs a new block on the steps where its
  cached length is a multiple of the block size, so new-block demand is a
  per-phase counter; finishes are bucketed by step number. A step costs O(1)
  plus O(requests that join, finish or are preempted).
- general path (speculation, or forced for cross-checking): every running
  request is visited each step.
Both record the same per-step log (`StepLog`) and per-request results.
"""

from __future__ import annotations

import math
from collections import deque
from random import Random

from optimizer.latency.base import StepLoad
from optimizer.sim.kv_cache import PrefixCache
from optimizer.sim.metrics import RunLog, StepLog
from optimizer.sim.request import SimRequest

_INF = math.inf


class Instance:
    """Scheduler state of one instance. `schedule` plans a step; `complete` applies it."""

    __slots__ = (
        "behind",
        "bs",
        "budget",
        "busy",
        "chunked",
        "chunks",
        "decodes",
        "done",
        "fast",
        "finish_at",
        "floor_s",
        "free_blocks",
        "fresh",
        "hashes",
        "index",
        "kv_sum",
        "log",
        "max_seqs",
        "num_blocks",
        "num_preemptions",
        "num_spec",
        "outstanding",
        "partial",
        "phase_count",
        "prefix",
        "price",
        "rng",
        "role",
        "running",
        "step_kv_q1",
        "step_no",
        "step_nseqs",
        "step_start",
        "steps",
        "tp",
        "waiting",
    )  # fmt: skip

    def __init__(
        self,
        *,
        role: str,
        index: int,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        enable_chunked_prefill: bool,
        block_size: int,
        num_blocks: int,
        num_spec: int,
        log: RunLog,
        rng: Random,
        prefix: PrefixCache | None = None,
        hashes: list[list[int]] | None = None,
        force_general: bool = False,
    ) -> None:
        self.role = role
        self.index = index
        self.budget = max_num_batched_tokens
        self.max_seqs = max_num_seqs
        self.chunked = enable_chunked_prefill
        self.bs = block_size
        self.num_blocks = num_blocks
        self.free_blocks = num_blocks
        self.num_spec = num_spec
        self.fast = num_spec == 0 and not force_general
        self.log = log
        self.rng = rng
        self.prefix = prefix
        self.hashes = hashes if prefix is not None else None
        self.waiting: deque[SimRequest] = deque()
        self.decodes: dict[int, SimRequest] = {}  # fast path, admission order
        self.partial: SimRequest | None = None  # fast path, always last in order
        self.running: list[SimRequest] = []  # general path, admission order
        self.phase_count = [0] * block_size
        self.kv_sum = 0
        self.finish_at: dict[int, list[SimRequest]] = {}
        self.chunks: list[tuple[SimRequest, int, bool]] = []
        self.fresh: list[SimRequest] = []
        # fast path: (index of the next prefill chunk, decode) for decodes that joined
        # this step after a prefill chunk had been scheduled
        self.behind: list[tuple[int, SimRequest]] = []
        self.done: list[SimRequest] = []
        self.step_no = 0
        self.step_start = 0.0
        self.step_nseqs = 0
        self.step_kv_q1 = 0
        self.busy = False
        self.num_preemptions = 0
        self.outstanding = 0
        self.steps = StepLog()
        self.tp = 1
        self.floor_s = 0.0
        self.price = None  # set by the engine: StepLoad -> seconds

    # ------------------------------------------------------------------ queries

    @property
    def num_running(self) -> int:
        if self.fast:
            return len(self.decodes) + (self.partial is not None)
        return len(self.running)

    def has_work(self) -> bool:
        return bool(self.waiting) or self.num_running > 0

    # ------------------------------------------------------------------ preemption

    def _requeue(self, r: SimRequest) -> None:
        self.free_blocks += r.num_blocks
        r.num_blocks = 0
        r.num_computed = 0
        r.fresh_join = False
        self.num_preemptions += 1
        self.log.num_preemptions[r.rid] += 1
        self.waiting.appendleft(r)

    def _preempt_decode(self, r: SimRequest, step: int, now: float) -> None:
        """Materialise a fast-path decode's implicit state, then requeue it."""
        progressed = step - r.join_step
        computed = r.join_computed + progressed
        r.num_generated = r.join_generated + progressed
        r.num_blocks = -(-computed // self.bs)
        r.last_token_s = now  # its last token came at the end of the previous step
        self.kv_sum -= computed + 1
        self.phase_count[(r.join_step - r.join_computed) % self.bs] -= 1
        r.join_step = -1
        self._requeue(r)

    # ------------------------------------------------------------------ scheduling

    def schedule(self, now: float) -> StepLoad | None:
        """Plan the next step; None when there is nothing to run."""
        chunks = self.chunks
        chunks.clear()
        if self.fast:
            budget, preempted = self._schedule_running_fast(now)
        else:
            budget, preempted = self._schedule_running_general(now)
        if not preempted and budget > 0 and self.waiting:
            self._admit(now, budget)
        return self._build_load()

    def _schedule_running_fast(self, now: float) -> tuple[int, bool]:
        decodes = self.decodes
        preempted = False
        if decodes:
            step = self.step_no
            phase = step % self.bs
            need = self.phase_count[phase]
            if need > self.free_blocks:
                preempted = True
                if self.partial is not None:
                    self._requeue(self.partial)
                    self.partial = None
                while need > self.free_blocks and decodes:
                    _, r = decodes.popitem()
                    if (r.join_step - r.join_computed) % self.bs == phase:
                        need -= 1
                    self._preempt_decode(r, step, now)
            self.free_blocks -= need
        budget = self.budget - len(decodes)
        r = self.partial
        if r is not None and budget > 0:
            chunk = min(r.num_prompt + r.num_generated - r.num_computed, budget)
            need = -(-(r.num_computed + chunk) // self.bs) - r.num_blocks
            self.partial = None
            if need > self.free_blocks:
                self._requeue(r)
                preempted = True
            else:
                self.free_blocks -= need
                r.num_blocks += need
                self.chunks.append((r, chunk, False))
                budget -= chunk
        return budget, preempted

    def _schedule_running_general(self, now: float) -> tuple[int, bool]:
        running = self.running
        budget = self.budget
        chunks = self.chunks
        bs = self.bs
        preempted = False
        i = 0
        while i < len(running):
            r = running[i]
            remaining = r.num_prompt + r.num_generated - r.num_computed
            is_dec = remaining == 1 and r.num_generated > 0
            num_new = 1 + self.num_spec if is_dec else remaining
            if num_new > budget:
                num_new = budget
            if num_new <= 0:
                i += 1
                continue
            need = -(-(r.num_computed + num_new) // bs) - r.num_blocks
            victim = None
            while need > self.free_blocks:
                victim = running.pop()
                self._requeue(victim)
                preempted = True
                if victim is r:
                    break
            if victim is r:
                break
            if need > 0:
                self.free_blocks -= need
                r.num_blocks += need
            chunks.append((r, num_new, is_dec))
            budget -= num_new
            i += 1
        return budget, preempted

    def _admit(self, now: float, budget: int) -> None:
        waiting = self.waiting
        chunks = self.chunks
        bs = self.bs
        fast = self.fast
        n_running = self.num_running + (len(chunks) if fast else 0)
        prefix = self.prefix
        log = self.log
        while waiting and budget > 0 and n_running < self.max_seqs:
            r = waiting[0]
            computed = r.num_computed
            if computed == 0 and prefix is not None and self.hashes is not None:
                computed = prefix.cached_tokens(self.hashes[r.rid], r.num_prompt, r.num_tokens)
            remaining = r.num_tokens - computed
            if remaining == 1 and r.num_generated > 0:  # KV arrived (PD) or fully cached
                num_new = 1 if fast else min(1 + self.num_spec, budget)
                need = -(-(computed + num_new) // bs) - r.num_blocks
                if need > self.free_blocks:
                    break
                waiting.popleft()
                self.free_blocks -= need
                r.num_blocks += need
                r.num_computed = computed
                r.fresh_join = True
                if fast:
                    self._join_decodes(r, self.step_no)
                    self.fresh.append(r)
                    if chunks:  # admitted after a prefill chunk that joins at completion
                        self.behind.append((len(chunks), r))
                else:
                    self.running.append(r)
                    chunks.append((r, num_new, True))
                budget -= num_new
                n_running += 1
                continue
            if not self.chunked and remaining > budget:
                break
            chunk = remaining if remaining < budget else budget
            need = -(-(computed + chunk) // bs) - r.num_blocks
            if need > self.free_blocks:
                break
            waiting.popleft()
            self.free_blocks -= need
            r.num_blocks += need
            if prefix is not None and self.hashes is not None and r.num_computed == 0:
                prefix.num_lookup_tokens += r.num_prompt
                prefix.num_hit_tokens += computed
                prefix.insert(self.hashes[r.rid])
            r.num_computed = computed
            if log.first_sched_s[r.rid] != log.first_sched_s[r.rid]:  # nan: first time
                log.first_sched_s[r.rid] = now
            if not fast:
                self.running.append(r)
            chunks.append((r, chunk, False))
            budget -= chunk
            n_running += 1

    def _join_decodes(self, r: SimRequest, step: int) -> None:
        """Enter the fast path's aggregate decode set, decoding from `step` on."""
        computed = r.num_computed
        r.join_step = step
        r.join_computed = computed
        r.join_generated = r.num_generated
        self.phase_count[(step - computed) % self.bs] += 1
        self.kv_sum += computed + 1
        finish = step + r.stop_at - r.num_generated - 1
        r.finish_step = finish
        bucket = self.finish_at.get(finish)
        if bucket is None:
            self.finish_at[finish] = [r]
        else:
            bucket.append(r)
        self.decodes[r.rid] = r

    def _build_load(self) -> StepLoad | None:
        chunks = self.chunks
        if self.fast:
            n_dec = len(self.decodes)
            kv = self.kv_sum
            if not chunks:
                if not n_dec:
                    return None
                self.step_nseqs = n_dec
                self.step_kv_q1 = kv
                return StepLoad(n_dec, n_dec, (), (), n_dec, kv, 1)
            pq = tuple(c for _, c, _ in chunks)
            pkv = tuple(r.num_computed + c for r, c, _ in chunks)
            self.step_nseqs = n_dec + len(chunks)
            self.step_kv_q1 = kv
            return StepLoad(n_dec + sum(pq), self.step_nseqs, pq, pkv, n_dec, kv, 1)
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

    def complete(self, t: float) -> None:
        """Apply the step that ends at `t`: emit tokens, finish requests."""
        if self.fast:
            n_dec, n_itl = self._complete_fast(t)
        else:
            n_dec, n_itl = self._complete_general(t)
        self.steps.append(
            t, t - self.step_start, n_dec, n_itl, self.step_nseqs,
            self.num_blocks - self.free_blocks, self.step_kv_q1,
        )  # fmt: skip
        self.step_no += 1

    def _complete_fast(self, t: float) -> tuple[int, int]:
        step = self.step_no
        decodes = self.decodes
        n_dec = len(decodes)
        n_itl = n_dec
        if self.fresh:
            gaps = self.log.itl_gaps
            for r in self.fresh:
                gaps.append(t - r.last_token_s)
                r.fresh_join = False
            n_itl -= len(self.fresh)
            self.fresh.clear()
        finished = self.finish_at.pop(step, None)
        if finished:
            bs = self.bs
            for r in finished:
                if r.join_step < 0 or r.finish_step != step:
                    continue  # preempted since; a stale entry
                del decodes[r.rid]
                computed = r.join_computed + step - r.join_step + 1
                self.kv_sum -= computed
                self.phase_count[(r.join_step - r.join_computed) % bs] -= 1
                r.num_computed = computed
                r.num_generated = r.stop_at
                r.num_blocks = -(-computed // bs)
                r.join_step = -1
                r.last_token_s = t
                self._finish(r, t)
        self.kv_sum += len(decodes)
        self.log.tokens_emitted += n_dec
        # Admission order decides who is preempted first (the most recently admitted,
        # as vLLM's running list), so a decode admitted after a prefill chunk moves
        # behind the decode that chunk turns into, here, in admission order.
        behind = self.behind
        j = 0
        for i, (r, chunk, _) in enumerate(self.chunks):
            while j < len(behind) and behind[j][0] == i:
                self._move_back(behind[j][1])
                j += 1
            r.num_computed += chunk
            if r.num_computed == r.num_prompt + r.num_generated:
                self._sample_caught_up(r, t)
                if r.num_generated < r.stop_at:
                    self._join_decodes(r, step + 1)
                else:
                    self._finish(r, t)
            else:
                self.partial = r
        if behind:
            for _, r in behind[j:]:
                self._move_back(r)
            behind.clear()
        return n_dec, n_itl

    def _move_back(self, r: SimRequest) -> None:
        """Move a fast-path decode to the end of the admission order (if still decoding)."""
        if r.join_step >= 0:
            self.decodes[r.rid] = self.decodes.pop(r.rid)

    def _complete_general(self, t: float) -> tuple[int, int]:
        n_dec = n_itl = zeros = 0
        any_finished = False
        rand = self.rng.random
        gaps = self.log.itl_gaps
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
                if r.fresh_join:
                    gaps.append(t - r.last_token_s)
                    r.fresh_join = False
                else:
                    n_itl += 1
                r.last_token_s = t
            else:
                r.num_computed += n
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

    def _sample_caught_up(self, r: SimRequest, t: float) -> None:
        """A request's KV caught up with its tokens: the step samples the next one."""
        if r.num_generated == 0:
            self.log.first_token_s[r.rid] = t
        else:  # resumed after preemption
            self.log.itl_gaps.append(t - r.last_token_s)
        r.num_generated += 1
        r.last_token_s = t
        self.log.tokens_emitted += 1

    def _finish(self, r: SimRequest, t: float) -> None:
        """Done on this instance: free KV (a PD handoff keeps it until transferred)."""
        if r.stop_at == r.num_output:
            self.log.finish_s[r.rid] = t
            self.free_blocks += r.num_blocks
            r.num_blocks = 0
        self.outstanding -= r.num_prompt + r.num_output
        self.done.append(r)
