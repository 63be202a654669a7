"""One engine instance: scheduler + target model (+ draft model) running real steps.

`step()` plans a step, runs the draft model K times over the decoding
sequences (when speculating), runs the target over every scheduled token in
one forward (prefill chunks and K+1 verify positions per decoding sequence),
decides acceptance with a seeded coin of probability α per draft (random
weights never agree, so the coin keeps the statistics controlled while the
verify cost stays real), and commits the emitted tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from random import Random

import torch

from optimizer.shapes import ModelShape
from profiler.reference_engine.batch import RowSpec, block_slots, build_batch
from profiler.reference_engine.model import PagedTransformer
from profiler.reference_engine.scheduler import Chunk, EngineRequest, Scheduler, SchedulerLimits
from profiler.timing import keep_host_memory


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one step ran and how long it took (seconds, on the instance's clock).

    `end_s` is when its tokens were emitted; `done_s` after the scheduler
    committed them (the step's whole cost is `done_s - start_s`, `draft_s` of
    it in draft-model steps). The load fields mirror `optimizer.latency.StepLoad`.
    """

    start_s: float
    end_s: float
    num_tokens: int
    num_prefill_tokens: int
    num_decode_seqs: int
    num_draft_steps: int
    done_s: float = 0.0
    draft_s: float = 0.0
    prefill_q: tuple[int, ...] = ()
    prefill_kv: tuple[int, ...] = ()
    decode_kv_tokens: int = 0  # sum over decoding sequences of cached + new tokens
    decode_q: int = 1  # query positions per decoding sequence (1 + K when verifying)

    @property
    def seconds(self) -> float:
        return (self.done_s or self.end_s) - self.start_s


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """Everything needed to build an instance (picklable, for worker processes)."""

    shape: ModelShape
    limits: SchedulerLimits
    acceptance_rate: float = 1.0
    draft_shape: ModelShape | None = None
    device: str = "cpu"
    seed: int = 0


def open_engine(spec: InstanceSpec) -> EngineInstance:
    """The engine this process serves with. On CPU the process first keeps freed
    memory for reuse (`profiler.timing.keep_host_memory`, process-wide), so its
    steps reuse warm pages as a caching allocator would, and as the profiler
    measured the operators."""
    if torch.device(spec.device).type == "cpu":
        keep_host_memory()
    return EngineInstance(spec)


class EngineInstance:
    def __init__(self, spec: InstanceSpec) -> None:
        self.spec = spec
        self.device = torch.device(spec.device)
        lim = spec.limits
        self.scheduler = Scheduler(lim)
        self.model = PagedTransformer(
            spec.shape,
            num_blocks=lim.num_blocks,
            block_size=lim.block_size,
            device=self.device,
            seed=spec.seed,
        )
        self.draft = None
        if lim.num_speculative_tokens and spec.draft_shape is not None:
            self.draft = PagedTransformer(
                spec.draft_shape,
                num_blocks=lim.num_blocks,
                block_size=lim.block_size,
                device=self.device,
                seed=spec.seed + 1,
            )
        self.coin = Random(spec.seed)
        self.steps: list[StepRecord] = []
        self.clock: Callable[[], float] = time.perf_counter  # see realtime.CpuClock
        self.pending_kv: dict[int, torch.Tensor] = {}  # PD: KV received, written on admission
        self.install_s = 0.0  # CPU time writing received KV (off a CPU clock's timeline)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _propose(self, decodes: list[Chunk]) -> dict[int, list[int]]:
        """K draft-model steps over the decoding sequences: proposed tokens per request id."""
        drafts: dict[int, list[int]] = {c.request.rid: [] for c in decodes}
        if self.draft is None:
            return drafts
        bs = self.spec.limits.block_size
        for j in range(max((c.num_new - 1 for c in decodes), default=0)):
            active = [c for c in decodes if c.num_new - 1 > j]
            specs = []
            for c in active:
                r = c.request
                last = drafts[r.rid][-1] if j else r.token_ids[c.start]
                specs.append(RowSpec([last], c.start + j, r.blocks, 1, True))
            out = self.draft.greedy(build_batch(specs, bs, self.device))
            for c, tok in zip(active, _per_spec(out, specs), strict=True):
                drafts[c.request.rid].append(tok[0])
        return drafts

    def _install_kv(self, chunks: list[Chunk]) -> None:
        """Write transferred prompt KV into the blocks a just-admitted request received."""
        bs = self.spec.limits.block_size
        for c in chunks:
            kv = self.pending_kv.pop(c.request.rid, None)
            if kv is not None:
                slots = block_slots(c.request.blocks, kv.shape[2], bs).to(self.device)
                self.model.write_kv(slots, kv.to(self.device))

    def read_prompt_kv(self, r: EngineRequest) -> torch.Tensor:
        """The KV of a request's prompt, (layers, 2, prompt, g, d), for a PD hand-off."""
        slots = block_slots(r.blocks, r.num_prompt, self.spec.limits.block_size)
        return self.model.read_kv(slots.to(self.device)).cpu()

    def _accept(self, num_drafts: int) -> int:
        alpha = self.spec.acceptance_rate
        accepted = 0
        while accepted < num_drafts and self.coin.random() < alpha:
            accepted += 1
        return accepted

    def step(self) -> tuple[list[Chunk], list[EngineRequest]] | None:
        """Run one step; None when there is nothing to do. Returns (chunks, finished)."""
        start = self.clock()
        chunks = self.scheduler.plan(start)
        if not chunks:
            return None
        bs = self.spec.limits.block_size
        if self.pending_kv:
            begin = time.thread_time()
            self._install_kv(chunks)
            cost = time.thread_time() - begin
            self.install_s += cost
            exclude = getattr(self.clock, "exclude", None)
            if exclude is not None:  # the channel writes the KV, as RDMA into the pool would
                exclude(cost)
        decodes = [c for c in chunks if c.is_decode]
        spec_decodes = [c for c in decodes if c.num_new > 1]
        t_draft = self.clock()
        drafts = self._propose(spec_decodes) if spec_decodes else {}
        draft_s = self.clock() - t_draft if spec_decodes and self.draft is not None else 0.0
        specs: list[RowSpec] = []
        for c in chunks:
            r = c.request
            if c.is_decode:
                ids = [r.token_ids[c.start], *drafts.get(r.rid, [])]
                ids += [0] * (c.num_new - len(ids))  # no draft model: placeholder drafts
                specs.append(RowSpec(ids, c.start, r.blocks, len(ids), True))
            else:
                ids = r.token_ids[c.start : c.start + c.num_new]
                samples = 1 if c.start + c.num_new == r.num_tokens else 0
                specs.append(RowSpec(ids, c.start, r.blocks, samples, False))
        out = _per_spec(self.model.greedy(build_batch(specs, bs, self.device)), specs)
        emitted: list[list[int]] = []
        for c, toks in zip(chunks, out, strict=True):
            r = c.request
            if c.is_decode:
                accepted = self._accept(c.num_new - 1)
                made = [*drafts.get(r.rid, [0] * accepted)[:accepted], toks[accepted]]
                emitted.append(made[: r.stop_at - r.num_generated])
            else:
                emitted.append(toks)
        self._sync()
        end = self.clock()
        finished = self.scheduler.commit(chunks, emitted, end)
        prefills = [c for c in chunks if not c.is_decode]
        self.steps.append(
            StepRecord(
                start,
                end,
                sum(c.num_new for c in chunks),
                sum(c.num_new for c in prefills),
                len(decodes),
                max((c.num_new - 1 for c in spec_decodes), default=0) if self.draft else 0,
                done_s=self.clock(),
                draft_s=draft_s,
                prefill_q=tuple(c.num_new for c in prefills),
                prefill_kv=tuple(c.start + c.num_new for c in prefills),
                decode_kv_tokens=sum(c.start + c.num_new for c in decodes),
                decode_q=max((c.num_new for c in decodes), default=1),
            )
        )
        return chunks, finished

    def warm_up(self, prompt_len: int = 64, num_steps: int = 3) -> None:
        """Run a throw-away request through prefill and a few decodes (first-call costs)."""
        lim = self.spec.limits
        prompt_len = min(
            prompt_len, lim.max_num_batched_tokens, lim.num_blocks * lim.block_size // 2
        )
        r = EngineRequest(-1, 0.0, prompt_len, num_steps, num_steps, list(range(prompt_len)))
        self.scheduler.add(r)
        while self.scheduler.has_work():
            self.step()
        self.steps.clear()
        self.scheduler.num_preemptions = 0


def _per_spec(tokens: list[int], specs: list[RowSpec]) -> list[list[int]]:
    """Split sampled tokens (in `build_batch` row order) back into per-spec lists."""
    order = [i for i, s in enumerate(specs) if not s.is_decode]
    by_q: dict[int, list[int]] = {}
    for i, s in enumerate(specs):
        if s.is_decode:
            by_q.setdefault(len(s.ids), []).append(i)
    for q in sorted(by_q):
        order += by_q[q]
    out: list[list[int]] = [[] for _ in specs]
    pos = 0
    for i in order:
        n = specs[i].samples
        out[i] = tokens[pos : pos + n]
        pos += n
    return out
