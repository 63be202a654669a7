"""One serving instance's scheduler: vLLM v1's policy over a KV block pool.

Each step (DOMAIN.md §6): running requests first, in admission order (1 token
each, 1+K when verifying speculation, or their next prompt chunk), then waiting
requests in FCFS order take budgeted prompt chunks while `running <
max_num_seqs` and KV blocks can be allocated. When blocks run out, the most
recently admitted running request is preempted (KV freed, recomputed later);
no waiting request is admitted in a step that preempted.

`BaseScheduler` holds what both code paths share: the waiting queue (requests come in
through `add_request`, as vLLM's engine hands them to its scheduler) and the
admission of waiting requests, the KV pool (`optimizer.sim.kv_blocks`, kept
apart as vLLM keeps `KVCacheManager` apart from `Scheduler`: the only writer of the
block counts), preemption, sampling, finishing and the per-step log. Two subclasses
run the running set:

- `AggregateDecodeScheduler` (`schedule_fast`, no speculation): each decoding
  request gains exactly one token per step, so decodes are tracked in
  aggregate; a step costs O(1) plus O(requests that join, finish or are
  preempted).
- `PerRequestScheduler` (`schedule_general`: speculation, or forced for
  cross-checking): every running request is visited each step.

A Gated DeltaNet (or Mamba) hybrid with prefix caching (`align_block` > 0) cuts its prompt
chunks where the recurrent state can be cached, as vLLM's `mamba_cache_mode` "align"
does (`aligned_chunk`), so many prompts take two steps.

Both record the same per-step figures (`StepStats`) and per-request results; a
property test checks they agree. `optimizer.sim.fleet.make_scheduler` picks one. The engine drives
either through `schedule(now) -> StepLoad | None` and `complete(t)`;
`check_invariants(load)` (a debug aid, `simulate(..., check_invariants=True)`)
verifies the block accounting and the limits of each planned step.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from random import Random

import numpy as np

from optimizer.latency.base import StepLoad
from optimizer.sim.kv_blocks import KVBlockPool
from optimizer.sim.kv_cache import PrefixCache
from optimizer.sim.metrics import RunLog
from optimizer.sim.request import SimRequest
from optimizer.sim.step_stats import StepStats


class InvariantError(AssertionError):
    """A scheduler broke one of its own rules (a simulator bug, not a bad config)."""


class BaseScheduler(ABC):
    """Scheduler state of one instance. `schedule` plans a step; `complete` applies it."""

    __slots__ = (
        "add_gap_s",
        "admit_cutoff",
        "admit_reserve",
        "align_block",
        "align_eagle",
        "async_admission",
        "budget",
        "busy",
        "chunked",
        "chunks",
        "clamped",
        "done",
        "floor_s",
        "group",
        "hashes",
        "in_flight",
        "index",
        "last_add_s",
        "log",
        "max_seqs",
        "num_preemptions",
        "num_spec",
        "outstanding",
        "pool",
        "prefill_first",
        "prefix",
        "price",
        "price_idle",
        "price_run",
        "pulls",
        "ready",
        "rng",
        "role",
        "run_ends",
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
        state_blocks: int = 0,
        log: RunLog,
        rng: Random,
        prefix: PrefixCache | None = None,
        hashes: list[list[int]] | None = None,
        tp: int = 1,
        floor_s: float = 0.0,
        price: Callable[[StepLoad], float] | None = None,
        price_idle: Callable[[StepLoad], float] | None = None,
        prefill_first: bool = False,
        async_admission: bool = False,
        align_block: int = 0,
        align_eagle: bool = False,
        decode_price: Callable[[int, int], float] | None = None,
    ) -> None:
        self.role = role
        self.index = index
        self.budget = max_num_batched_tokens
        self.max_seqs = max_num_seqs
        self.chunked = enable_chunked_prefill
        self.pool = KVBlockPool(num_blocks, block_size, prefix, state_blocks)
        self.num_spec = num_spec
        self.log = log
        self.rng = rng
        self.prefix = prefix
        self.hashes = hashes if prefix is not None else None
        self.waiting: deque[SimRequest] = deque()
        self.ready: deque[SimRequest] = deque()  # PD: KV landed here, admitted first
        self.pulls: list[SimRequest] = []  # PD: KV pulls started by the last `schedule`
        self.in_flight: dict[int, SimRequest] = {}  # PD: blocks held, KV on its way
        self.chunks: list[tuple[SimRequest, int, bool]] = []  # (request, tokens, is decode)
        self.done: list[SimRequest] = []
        self.step_no = 0
        self.step_start = 0.0
        self.step_nseqs = 0
        self.step_kv_q1 = 0
        self.busy = False
        self.num_preemptions = 0
        self.outstanding = 0
        # (sequences, KV tokens) -> seconds of a decode-only step: mixed steps are compared
        # with it (prefill stall, ITL spikes)
        self.steps = StepStats(log.itl, decode_price, log.from_s)
        self.group = None  # the RankGroup (optimizer.sim.ranks) of a MoE instance's dp ranks
        self.tp = tp
        self.floor_s = floor_s
        self.price = price  # StepLoad -> seconds
        # ... of a step that starts on an idle instance (async scheduling: nothing to
        # overlap its CPU work with)
        self.price_idle = price if price_idle is None else price_idle
        # The decode-stretch jump (`AggregateDecodeScheduler.plan_run`, driven by the event
        # loop): (b, kv0, k) -> k steady decode-only prices, None where it does not apply;
        # the run's step boundaries while one is under way (None otherwise); the fleet's
        # count of steps clamped at the floor.
        self.price_run: Callable[[int, int, int], np.ndarray] | None = None
        self.run_ends: np.ndarray | None = None
        self.clamped: list[int] | None = None
        self.last_add_s = math.inf
        self.add_gap_s = math.inf
        # vLLM v0 (no chunked prefill): prompts get steps of their own, and a prompt is
        # admitted only while 1% of the blocks stay free (its block manager's watermark).
        self.prefill_first = prefill_first
        self.admit_reserve = -(-num_blocks // 100) if prefill_first else 0
        # Async scheduling (vLLM >= 0.14): step n+1 is planned while step n runs, so a
        # request that reaches the engine during step n waits for step n+2: a step admits
        # only the requests that entered before `admit_cutoff` (set before each `schedule`).
        self.async_admission = async_admission
        self.admit_cutoff = math.inf
        # A hybrid's prompt chunks end on its block boundaries (`aligned_chunk`): the
        # block in tokens, 0 for none; with EAGLE the last boundary is one block earlier.
        self.align_block = align_block
        self.align_eagle = align_eagle

    # ------------------------------------------------------------------ queries

    @property
    @abstractmethod
    def num_running(self) -> int: ...

    @property
    def num_admitted(self) -> int:
        """vLLM's running count: the running set and the prompts of the planned step."""
        return self._num_admitted()

    def has_work(self) -> bool:
        return bool(self.waiting) or bool(self.ready) or self.num_running > 0

    # ------------------------------------------------------------------ arrivals

    def add_request(self, r: SimRequest) -> None:
        """`r` reaches this instance (a new request, or PD: a prefilled one whose KV is on
        the prefill instance): it waits, in FCFS order, and counts as outstanding."""
        self.outstanding += r.num_prompt + r.num_output
        self.waiting.append(r)
        # the mean time between requests reaching it (a moving average, 1/8 per request;
        # from the second request on): the loop steps instances whose stretches it would cut
        t = r.arrival_s
        gap = t - self.last_add_s
        self.last_add_s = t
        avg = self.add_gap_s
        if avg < math.inf:
            self.add_gap_s = avg + (gap - avg) * 0.125
        elif gap >= 0.0:
            self.add_gap_s = gap

    # ------------------------------------------------------------------ scheduling

    def schedule(self, now: float) -> StepLoad | None:
        """Plan the next step; None when there is nothing to run."""
        self.chunks.clear()
        if self.prefill_first and (self.waiting or self.ready):
            self._admit(now, self.budget)
            if self.chunks:  # a prefill-only step; the decodes wait for the next
                return self._build_load()
        budget, preempted = self._schedule_running(now)
        if not self.prefill_first and not preempted and budget > 0 and (self.waiting or self.ready):
            self._admit(now, budget)
        load = self._build_load()
        if load is None and preempted and (self.waiting or self.ready):
            # Everything running was preempted: vLLM's next engine iteration, at the same
            # instant, has nothing to preempt and admits from the queue. (Going idle here
            # instead left the instance with work and no event to wake it.)
            self._admit(now, self.budget)
            load = self._build_load()
        return load

    def aligned_chunk(self, r: SimRequest, computed: int, n: int) -> int:
        """The `n` prompt tokens `r` may compute from `computed` on, cut as vLLM's
        `Scheduler._mamba_block_aligned_split` cuts them: a chunk ending before the last
        block boundary of its tokens is rounded down to whole blocks (to none: the request
        waits a step; unless a block exceeds the token budget), one crossing that boundary
        stops at it, and the tokens past it are a chunk of their own."""
        b = self.align_block
        total = r.num_prompt + r.num_generated
        if computed >= max(r.num_prompt, total - 1):
            return n
        last = total - total % b
        if self.align_eagle:
            last = max(last - b, 0)
        end = computed + n
        if end < last:
            return n // b * b if b <= self.budget else n
        if computed < last:
            return last - computed
        return n

    @abstractmethod
    def _schedule_running(self, now: float) -> tuple[int, bool]:
        """Schedule the running set; (budget left, whether anything was preempted)."""

    @abstractmethod
    def _build_load(self) -> StepLoad | None: ...

    @abstractmethod
    def _num_admitted(self) -> int:
        """Requests counted against `max_num_seqs`: the running set and those that took a
        prompt chunk this step."""

    @abstractmethod
    def _admit_prefill(self, r: SimRequest) -> None:
        """`r` takes a prompt chunk this step (already in `chunks`)."""

    def _requeue(self, r: SimRequest) -> None:
        """Preemption: free the KV, recompute it later, first in line (what is still cached
        when it is admitted again is reused)."""
        self.pool.release(r)
        self.pool.release_refs(r)
        r.num_computed = 0
        r.recomputing = r.num_generated > 0
        self.num_preemptions += 1
        self.log.num_preemptions[r.rid] += 1
        self.waiting.appendleft(r)

    def _admit(self, now: float, budget: int) -> None:
        waiting = self.waiting
        ready = self.ready
        chunks = self.chunks
        pool = self.pool
        n_running = self._num_admitted()
        prefix = self.prefix if self.hashes is not None else None
        log = self.log
        while budget > 0 and n_running < self.max_seqs:
            queue = ready if ready else waiting  # landed KV first: admitted here before
            if not queue:
                break
            r = queue[0]
            if r.arrival_s > self.admit_cutoff and r.num_computed == 0 and queue is waiting:
                break  # entered after this step was planned (async scheduling)
            if r.remote:  # PD: hold blocks for its prompt and pull the KV; compute later
                need = pool.extra_blocks(r, r.num_prompt)
                if not pool.can_allocate(need):
                    break
                queue.popleft()
                pool.grow(r, need)
                self.in_flight[r.rid] = r
                self.pulls.append(r)
                continue
            computed = r.num_computed
            hits = revive = 0
            if computed == 0 and prefix is not None:
                hits, revive = prefix.lookup(self.hashes[r.rid], r.num_prompt, r.num_tokens)
                computed = hits * prefix.block_tokens
            remaining = r.num_tokens - computed
            if not self.chunked and remaining > budget:
                break
            chunk = remaining if remaining < budget else budget
            if self.align_block:
                chunk = self.aligned_chunk(r, computed, chunk)
                if not chunk:
                    break
            need = pool.extra_blocks(r, computed + chunk)
            if hits:
                need -= hits * prefix.blocks_per_hash
            if not pool.can_allocate(need + revive, self.admit_reserve):
                break
            queue.popleft()
            if prefix is not None and r.num_computed == 0:
                if log.first_sched_s[r.rid] != log.first_sched_s[r.rid]:  # first admission
                    prefix.count_lookup(r.num_prompt, computed)
                if hits:
                    pool.acquire_prefix(r, self.hashes[r.rid][:hits])
            pool.grow(r, need)
            r.num_computed = computed
            if log.first_sched_s[r.rid] != log.first_sched_s[r.rid]:  # nan: first time
                log.first_sched_s[r.rid] = now
            chunks.append((r, chunk, False))
            self._admit_prefill(r)
            budget -= chunk
            n_running += 1

    # ------------------------------------------------------------------ completion

    def complete(self, t: float) -> None:
        """Apply the step that ends at `t`: emit tokens, finish requests."""
        n_dec = self._complete(t)
        pool = self.pool
        self.steps.add(t, t - self.step_start, n_dec, self.step_nseqs,
                       pool.num_blocks - pool.num_free, self.step_kv_q1)  # fmt: skip
        self.step_no += 1

    @abstractmethod
    def _complete(self, t: float) -> int:
        """Emit the step's tokens; the decoding sequences (each waited one step: an ITL gap
        of the step's duration)."""

    def _sample_caught_up(self, r: SimRequest, t: float) -> None:
        """A request's KV caught up with its tokens: the step samples the next one."""
        if r.num_generated == 0:
            if r.stop_at < r.num_output:  # PD prefill: its token goes nowhere
                r.num_generated = 1
                return
            self.log.first_token_s[r.rid] = t
        else:  # resumed after preemption
            if t > self.log.from_s:
                self.log.itl.add(t - r.last_token_s)
            r.recomputing = False
        r.num_generated += 1
        r.last_token_s = t
        self.log.tokens_emitted += 1

    def _finish(self, r: SimRequest, t: float) -> None:
        """Done on this instance: free KV (a PD handoff keeps it until it is pulled)."""
        if r.stop_at == r.num_output:
            self.log.finish_s[r.rid] = t
            self.pool.release(r)
            self.pool.release_refs(r)
        else:
            self.pool.hold_for_pull(r)  # the decode instance counts its own from here
        self.outstanding -= r.num_prompt + r.num_output
        self.done.append(r)

    def release_handoff(self, r: SimRequest) -> None:
        """PD prefill: the decode instance has pulled `r`'s KV; free it here."""
        self.pool.release_pulled(r.rid)

    def _cache_computed(self, r: SimRequest) -> None:
        """A prompt chunk of `r` completed: cache the hash blocks it now holds in full."""
        if self.prefix is not None and self.hashes is not None:
            self.pool.register_prefix(r, self.hashes[r.rid])

    def kv_landed(self, r: SimRequest) -> None:
        """PD decode: `r`'s KV is here; it recomputes its last prompt token (its logits)
        in its first step, which delivers the first token."""
        del self.in_flight[r.rid]
        r.remote = False
        r.num_computed = r.num_prompt - 1
        r.num_generated = 0
        r.stop_at = r.num_output
        self.ready.append(r)

    # ------------------------------------------------------------------ debug checks

    def check_invariants(self, load: StepLoad) -> None:
        """Raise `InvariantError` when the step just planned (`load`) breaks the token
        budget or the batch limit, or the KV blocks requests hold are not what the pool
        counts as used."""
        pool = self.pool
        where = f"{self.role} instance {self.index}, step {self.step_no}"
        if not 0 <= pool.num_free <= pool.num_blocks:
            raise InvariantError(f"{where}: {pool.num_free} free of {pool.num_blocks} KV blocks")
        if load.num_tokens > self.budget:
            raise InvariantError(f"{where}: {load.num_tokens} tokens > budget {self.budget}")
        if self._num_admitted() > self.max_seqs:
            raise InvariantError(f"{where}: {self._num_admitted()} running > {self.max_seqs}")
        held = self._held_blocks() + pool.handoff_blocks
        if self.prefix is not None:
            held += self.prefix.in_use_blocks
            if self.prefix.evictable_blocks > pool.num_free:
                raise InvariantError(f"{where}: {self.prefix.evictable_blocks} evictable cached "
                                     f"blocks > {pool.num_free} free")  # fmt: skip
        held += sum(r.num_blocks for r in self.ready) + sum(
            r.num_blocks for r in self.in_flight.values()
        )
        if held != pool.num_used:
            raise InvariantError(f"{where}: requests hold {held} KV blocks, the pool counts "
                                 f"{pool.num_used} used")  # fmt: skip
        if any(r.num_blocks for r in self.waiting):
            raise InvariantError(f"{where}: a waiting request holds KV blocks")

    @abstractmethod
    def _held_blocks(self) -> int:
        """KV blocks held by the requests of the step just planned."""
