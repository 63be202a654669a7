"""The reference engine's scheduler: the vLLM-v1 policy the simulator models (DOMAIN.md §6).

Written independently of `optimizer.sim.scheduler` (which it must agree with,
step for step, on the same inputs): each step serves running requests first,
in admission order (one token each, 1+K when verifying speculation, or the
next prompt chunk), then admits waiting requests in FCFS order, each taking as
many prompt tokens as the budget has left while `running < max_num_seqs` and
KV blocks can be allocated. When blocks run out the most recently admitted
running request is preempted: its KV is freed and it is recomputed later; no
request is admitted in a step that preempted.

`plan()` returns the step as a list of `Chunk`s and never runs a model;
`commit()` applies a finished step. No torch here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from optimizer.sim.kv_blocks import blocks_for


class EngineError(RuntimeError):
    """The reference engine cannot run what it was given."""


@dataclass(slots=True, eq=False)
class EngineRequest:
    """One request's progress on one engine instance (vLLM-v1 bookkeeping)."""

    rid: int
    arrival_s: float
    num_prompt: int
    num_output: int
    stop_at: int  # 1 on a PD prefill instance, else num_output
    token_ids: list[int] = field(default_factory=list)  # prompt + generated so far
    num_computed: int = 0  # tokens whose KV is cached
    num_generated: int = 0
    blocks: list[int] = field(default_factory=list)  # block table (physical block ids)
    num_preemptions: int = 0
    token_times_s: list[float] = field(default_factory=list)  # emission time of each output
    first_scheduled_s: float | None = None  # when a step first took it (the plan's `now`)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt + self.num_generated

    @property
    def finished(self) -> bool:
        return self.num_generated >= self.stop_at


@dataclass(frozen=True, slots=True)
class Chunk:
    """Work for one request in one step: `num_new` tokens from `start` (its cached length)."""

    request: EngineRequest
    start: int
    num_new: int
    is_decode: bool  # one known token plus `num_new - 1` speculative drafts


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    max_num_batched_tokens: int
    max_num_seqs: int
    enable_chunked_prefill: bool
    block_size: int
    num_blocks: int
    num_speculative_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "block_size", "num_blocks"):
            if getattr(self, name) <= 0:
                raise EngineError(f"scheduler limit {name} must be > 0, got {getattr(self, name)}")
        if self.num_speculative_tokens < 0:
            raise EngineError("num_speculative_tokens must be >= 0")


class BlockPool:
    """Free physical KV blocks; LIFO reuse keeps recently touched memory warm."""

    __slots__ = ("_free", "num_blocks")

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int]:
        if n > len(self._free):
            raise EngineError(f"asked for {n} KV blocks with {len(self._free)} free")
        taken = self._free[-n:] if n else []
        del self._free[len(self._free) - n :]
        return taken

    def give(self, blocks: list[int]) -> None:
        self._free.extend(blocks)


class Scheduler:
    """Waiting queue, running list and KV blocks of one engine instance."""

    def __init__(self, limits: SchedulerLimits) -> None:
        self.limits = limits
        self.pool = BlockPool(limits.num_blocks)
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.num_preemptions = 0

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: EngineRequest) -> None:
        self.waiting.append(request)

    def _blocks_needed(self, r: EngineRequest, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.limits.block_size) - len(r.blocks)

    def _grow(self, r: EngineRequest, need: int) -> None:
        if need > 0:
            r.blocks.extend(self.pool.take(need))

    def _preempt(self, r: EngineRequest) -> None:
        self.pool.give(r.blocks)
        r.blocks = []
        r.num_computed = 0
        r.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(r)

    def release(self, r: EngineRequest) -> None:
        """Free a finished (or handed-off) request's KV blocks."""
        self.pool.give(r.blocks)
        r.blocks = []

    def plan(self, now: float | None = None) -> list[Chunk]:
        """The next step's work (empty when there is none); a request admitted for the
        first time records `now` (the step's start) as its `first_scheduled_s`."""
        lim = self.limits
        budget = lim.max_num_batched_tokens
        chunks: list[Chunk] = []
        preempted = False
        running = self.running
        i = 0
        while i < len(running):
            r = running[i]
            remaining = r.num_tokens - r.num_computed
            is_dec = remaining == 1 and r.num_generated > 0
            num_new = min(1 + lim.num_speculative_tokens if is_dec else remaining, budget)
            if num_new <= 0:
                i += 1
                continue
            need = self._blocks_needed(r, r.num_computed + num_new)
            victim = None
            while need > self.pool.num_free:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is r:
                    break
            if victim is r:
                break
            self._grow(r, need)
            chunks.append(Chunk(r, r.num_computed, num_new, is_dec))
            budget -= num_new
            i += 1
        if not preempted and budget > 0:
            self._admit(chunks, budget, now)
        return chunks

    def _admit(self, chunks: list[Chunk], budget: int, now: float | None) -> None:
        lim = self.limits
        waiting = self.waiting
        while waiting and budget > 0 and len(self.running) < lim.max_num_seqs:
            r = waiting[0]
            remaining = r.num_tokens - r.num_computed
            if remaining == 1 and r.num_generated > 0:  # its KV arrived from a prefill instance
                num_new = min(1 + lim.num_speculative_tokens, budget)
                is_dec = True
            else:
                if not lim.enable_chunked_prefill and remaining > budget:
                    break
                num_new = min(remaining, budget)
                is_dec = False
            need = self._blocks_needed(r, r.num_computed + num_new)
            if need > self.pool.num_free:
                break
            waiting.popleft()
            if r.first_scheduled_s is None:
                r.first_scheduled_s = now
            self._grow(r, need)
            self.running.append(r)
            chunks.append(Chunk(r, r.num_computed, num_new, is_dec))
            budget -= num_new

    def commit(
        self, chunks: list[Chunk], emitted: list[list[int]], t: float
    ) -> list[EngineRequest]:
        """Apply a finished step ending at `t`.

        `emitted[i]` holds the token ids chunk i produced: for a decode, the
        accepted drafts plus one (already capped at the request's stop); for a
        prefill chunk, one token when it caught up with the request's tokens,
        else none. Returns the requests that finished on this instance.
        """
        finished: list[EngineRequest] = []
        for c, ids in zip(chunks, emitted, strict=True):
            r = c.request
            if c.is_decode:
                r.num_computed += len(ids)
            else:
                r.num_computed += c.num_new
                if r.num_computed != r.num_tokens and ids:
                    raise EngineError(f"request {r.rid}: a partial prefill chunk emitted tokens")
            r.num_generated += len(ids)
            r.token_ids.extend(ids)
            r.token_times_s.extend([t] * len(ids))
            if r.finished:
                finished.append(r)
                if r.stop_at == r.num_output:  # a PD hand-off keeps its KV until sent
                    self.release(r)
        if finished:
            done = {id(r) for r in finished}
            self.running = [r for r in self.running if id(r) not in done]
        return finished
