"""The fleet a `ServingConfig` describes, as the event loop sees it: one scheduler per
instance with its step pricing, the routers, and the limits on one request.

`build_fleet` makes the front instances (replicas, or prefill instances) and the
decode instances, each pricing its steps with the latency model of its role's
accelerator and TP degree (checked against the weight-bandwidth floor, DOMAIN.md
§1) plus, when speculating, K draft steps. `request_limit` is the most prompt +
output tokens one request may have on a role (longer ones are rejected, as vLLM
rejects them); `rejection_note` says which requests that rejects and why.

A MoE instance with dp ranks is dp schedulers (one per rank, consecutive indices) in a
lockstep `RankGroup` (`optimizer.sim.ranks`); the routers pick among instances, and the
instance's group picks the rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from random import Random

import numpy as np

from optimizer.closed_loop_workload import ClosedLoopWorkload
from optimizer.config import (
    Role,
    RolePlan,
    RoutingPolicy,
    ServingConfig,
    ServingMode,
    SpecMethod,
)
from optimizer.latency.base import (
    LatencySource,
    StepLatency,
    StepLoad,
    TableReach,
    decode_run_pricer,
    step_pricer,
)
from optimizer.sim.floor import PROBE_KV_LENGTHS, check_decode_floor
from optimizer.sim.kv_cache import PrefixCache
from optimizer.sim.metrics import RunLog
from optimizer.sim.ranks import RankGroup
from optimizer.sim.schedule_fast import AggregateDecodeScheduler
from optimizer.sim.schedule_general import PerRequestScheduler
from optimizer.sim.scheduler import BaseScheduler
from optimizer.workload import Workload


class SimulationError(ValueError):
    """The simulation cannot run as asked (a latency model is missing, bad inputs)."""


def alpha_from_acceptance(length: np.ndarray, k: int) -> np.ndarray:
    """Per-token acceptance α with (1 - α^(K+1)) / (1 - α) = length, clipped to [1, K+1]."""
    target = np.clip(np.asarray(length, dtype=np.float64), 1.0, k + 1.0)
    lo, hi = np.zeros_like(target), np.ones_like(target)
    for _ in range(60):  # bisection: the expected length is increasing in α
        mid = (lo + hi) / 2
        expected = (1 - mid ** (k + 1)) / (1 - mid)
        below = expected < target
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    alpha = (lo + hi) / 2
    alpha[target >= k + 1.0] = 1.0
    alpha[target <= 1.0] = 0.0
    return alpha


def log_alphas(workload: Workload | ClosedLoopWorkload, config: ServingConfig) -> list[float]:
    """Per request, log(α): the config's rate, or the trace's acceptance lengths."""
    spec = config.speculation
    alpha = np.full(len(workload), spec.acceptance_rate)
    trace = getattr(workload, "acceptance_length", None)
    if spec.use_trace_acceptance and trace is not None:
        known = ~np.isnan(trace)
        alpha[known] = alpha_from_acceptance(trace[known], spec.num_speculative_tokens)
    with np.errstate(divide="ignore"):
        return np.log(alpha).tolist()


def _make_price(
    step: Callable[[StepLoad], float],
    target: StepLatency,
    draft: StepLatency | None,
    relative_cost: float,
    num_spec: int,
    floor_s: float,
    clamped: list[int],
) -> Callable[[StepLoad], float]:
    """StepLoad -> seconds: the target step as `step` prices it (`target`'s steady or
    idle-start price, clamped at the floor), plus K draft steps over the decoding
    sequences and the drafter's prefill of the step's prompt chunks."""
    if not num_spec:

        def price_target(load: StepLoad) -> float:
            t = step(load)
            if t < floor_s:
                clamped[0] += 1
                return floor_s
            return t

        return price_target

    steady = step_pricer(target)  # the drafter's steps run inside the target's
    draft_step = step_pricer(draft) if draft is not None else None

    def price(load: StepLoad) -> float:
        t = step(load)
        if t < floor_s:
            clamped[0] += 1
            t = floor_s
        n = load.num_decode_seqs
        if n and load.decode_q > 1:
            dl = StepLoad(n, n, (), (), n, load.decode_kv_tokens - n * num_spec, 1)
            per = draft_step(dl) if draft_step is not None else relative_cost * steady(dl)
            t += num_spec * per
        if load.prefill_q:  # the drafter prefills the same prompt chunks (its own KV)
            q = sum(load.prefill_q)
            pl = StepLoad(q, len(load.prefill_q), load.prefill_q, load.prefill_kv, 0, 0, 1)
            t += draft_step(pl) if draft_step is not None else relative_cost * steady(pl)
        return t

    return price


def make_scheduler(
    *,
    num_spec: int,
    force_general: bool = False,
    prefill_first: bool = False,
    align_block: int = 0,
    **kw,
) -> BaseScheduler:
    """The aggregate-decode fast path when it applies (no speculation, decodes every step,
    at most one prompt chunk left unfinished a step: not with block-aligned chunks), else
    per request."""
    general = num_spec or force_general or prefill_first or align_block
    cls = PerRequestScheduler if general else AggregateDecodeScheduler
    return cls(num_spec=num_spec, prefill_first=prefill_first, align_block=align_block, **kw)


def request_caps(config: ServingConfig, plan: RolePlan) -> list[tuple[int, str]]:
    """Each cap on one request's prompt + output tokens on `plan`'s instances, with what
    sets it and its figures; the least of them binds (`request_limit`)."""
    inst = plan.instance
    # One sequence's fixed state (Gated DeltaNet) takes blocks of the same pool.
    blocks = plan.kv_blocks - plan.state_blocks
    spec = config.speculation.num_speculative_tokens
    kv = f"the KV cache of one {plan.role} instance: {blocks:,} blocks x {inst.block_size} tokens"
    if plan.state_blocks:
        kv += f" besides a sequence's {plan.state_blocks} state blocks"
    if spec:
        kv += f", less {spec} speculative slots"
    caps = [(blocks * inst.block_size - spec, kv)]
    if not inst.enable_chunked_prefill:
        budget = inst.max_num_batched_tokens
        caps.append((budget, f"max_num_batched_tokens {budget:,} with chunked prefill off"))
    if config.max_model_len is not None:
        caps.append((config.max_model_len, f"max_model_len {config.max_model_len:,}"))
    return caps


def request_limit(config: ServingConfig, plan: RolePlan) -> int:
    """The most prompt + output tokens one request may have on `plan`'s instances."""
    return min(tokens for tokens, _ in request_caps(config, plan))


def rejection_note(config: ServingConfig, workload: Workload | ClosedLoopWorkload) -> str | None:
    """Why `simulate` rejects requests of `workload` on `config`, with the figures (None
    when it rejects none). As vLLM, an instance refuses a request it can never hold:
    prompt + output beyond its limit, or (PD) a prompt + 1 beyond the prefill side's."""
    plans = config.roles()
    inp = np.asarray(workload.input_tokens, dtype=np.int64)
    total = inp + np.asarray(workload.output_tokens, dtype=np.int64)
    back, back_why = min(request_caps(config, plans[-1]))
    over = total > back
    reasons = []
    if over.any():
        i = int(np.argmax(total))
        reasons.append(
            f"{int(over.sum()):,} with more prompt + output tokens than the {back:,} one "
            f"request may hold ({back_why}); the longest has {int(inp[i]):,} + "
            f"{int(total[i] - inp[i]):,} = {int(total[i]):,}"
        )
    if config.mode is ServingMode.DISAGGREGATED:
        front, front_why = min(request_caps(config, plans[0]))
        long_prompt = (inp + 1 > front) & ~over
        if long_prompt.any():
            reasons.append(
                f"{int(long_prompt.sum()):,} with a prompt longer than the {front - 1:,} "
                f"tokens a prefill instance may hold ({front_why}); the longest of them has "
                f"{int(inp[long_prompt].max()):,}"
            )
        over |= long_prompt
    num = int(over.sum())
    if not num:
        return None
    who = "every request" if num == len(total) else f"{num:,} of {len(total):,} requests"
    return f"{who} rejected, as vLLM rejects them: " + "; ".join(reasons)


def role_reach(config: ServingConfig, plan: RolePlan, longest_request: int) -> TableReach:
    """The largest loads `plan`'s instances can price: steps within the token budget and
    the batch limit; sequences no longer than the longest request they admit (plus the
    speculative slots, and at least the decode-floor probes' KV lengths)."""
    inst = plan.instance
    kv = min(longest_request, request_limit(config, plan))
    kv += config.speculation.num_speculative_tokens
    budget = inst.max_num_batched_tokens
    return TableReach(budget, inst.max_num_seqs, budget, max(kv, *PROBE_KV_LENGTHS))


def max_request_tokens(config: ServingConfig) -> int:
    """The most prompt + output tokens one request may have on `config` (longer ones
    are rejected, as vLLM rejects them)."""
    return min(request_limit(config, plan) for plan in config.roles())


@dataclass(slots=True)
class Fleet:
    """Front schedulers (replicas or prefill) and decode schedulers, indexed front first
    (a MoE instance with dp ranks has one per rank); `targets[i]` is scheduler i's
    target-model latency (for the per-instance records). `front_units` / `back_units`:
    one scheduler per instance (its first rank), what the routers choose among."""

    front: list[BaseScheduler]
    back: list[BaseScheduler]
    targets: list[StepLatency]
    front_limit: int  # prompt + output tokens a request may have (prompt + 1 when PD)
    back_limit: int
    front_units: list[BaseScheduler]
    back_units: list[BaseScheduler]

    @property
    def instances(self) -> list[BaseScheduler]:
        return self.front + self.back


def instance_rng(seed: int, index: int) -> Random:
    """The random generator of instance `index` of a fleet run with `seed`."""
    return Random(seed * 1_000_003 + index)


def build_fleet(
    config: ServingConfig,
    latency: LatencySource,
    draft_latency: LatencySource | None,
    log: RunLog,
    *,
    seed: int,
    longest_request: int,
    hashes: list[list[int]] | None,
    block_tokens: int,
    force_general: bool,
    clamped: list[int],
    first_index: int = 0,
    jump: bool = True,
) -> Fleet:
    """The instances of `config`, indexed from `first_index` (a dynamic fleet builds each
    unit as it joins, after the instances of the units before it). With `jump`, instances
    of the aggregate-decode path outside a rank group advance decode stretches at once
    (`price_run`: their steady decode-only prices, unclamped)."""
    shape = config.shape
    spec = config.speculation
    release = config.engine_release
    front: list[BaseScheduler] = []
    back: list[BaseScheduler] = []
    targets: list[StepLatency] = []
    units: tuple[list[BaseScheduler], list[BaseScheduler]] = ([], [])
    limits = []
    for plan in config.roles():
        icfg = plan.instance
        acc = icfg.resolve_accelerator()
        speculate = spec.enabled and plan.role is not Role.PREFILL
        reach = role_reach(config, plan, longest_request)
        try:
            target = latency.for_instance(
                icfg.accelerator,
                icfg.tp,
                reach,
                shape.precision,
                engine=release,
                layout=icfg.layout,
            )
            draft = None
            if speculate and draft_latency is not None:
                draft = draft_latency.for_instance(icfg.accelerator, icfg.tp, reach, engine=release)
        except LookupError as exc:
            raise SimulationError(f"{plan.role} instances: {exc}") from exc
        floor_s = check_decode_floor(target, shape, acc, icfg.tp, layout=icfg.layout)
        num_spec = spec.num_speculative_tokens if speculate else 0
        align = 0  # vLLM's "align" Mamba cache mode: prompt chunks end on block boundaries
        if (release.generation.aligned_hybrid_prefill and config.enable_prefix_caching
                and icfg.enable_chunked_prefill and plan.role is not Role.DECODE):  # fmt: skip
            align = shape.hybrid_block_tokens(icfg.tp)
        steady, idle = (
            _make_price(step, target, draft, spec.draft_relative_cost, num_spec, floor_s, clamped)
            for step in (step_pricer(target), step_pricer(target, idle=True))
        )
        run_price = decode_run_pricer(target) if jump and icfg.dp == 1 and not num_spec else None
        limits.append(request_limit(config, plan))
        for k in range(plan.count * icfg.dp):
            index = first_index + len(front) + len(back)
            prefix = None
            if config.enable_prefix_caching and hashes is not None and plan.role is not Role.DECODE:
                try:
                    prefix = PrefixCache(block_tokens, icfg.block_size)
                except ValueError as exc:
                    raise SimulationError(f"{plan.role} instances: {exc}") from exc
            inst = make_scheduler(
                num_spec=num_spec,
                force_general=force_general,
                prefill_first=icfg.scheduling == "prefill_first",
                role=plan.role.value,
                index=index,
                max_num_batched_tokens=icfg.max_num_batched_tokens,
                max_num_seqs=icfg.max_num_seqs,
                enable_chunked_prefill=icfg.enable_chunked_prefill,
                block_size=icfg.block_size,
                num_blocks=plan.kv_blocks,
                state_blocks=plan.state_blocks,
                log=log,
                rng=instance_rng(seed, index),
                prefix=prefix,
                hashes=hashes,
                tp=icfg.tp,
                floor_s=floor_s,
                price=steady,
                price_idle=idle,
                async_admission=release.generation.async_scheduling,
                align_block=align,
                align_eagle=bool(num_spec) and spec.method is SpecMethod.EAGLE,
                decode_price=decode_only(target),
            )
            if run_price is not None and isinstance(inst, AggregateDecodeScheduler):
                inst.price_run = run_price
                inst.clamped = clamped
            side = back if plan.role is Role.DECODE else front
            side.append(inst)
            targets.append(target)
            if icfg.dp == 1:
                units[plan.role is Role.DECODE].append(inst)
            elif (k + 1) % icfg.dp == 0:  # the instance's last rank: group them
                ranks = side[-icfg.dp :]
                RankGroup(ranks)
                units[plan.role is Role.DECODE].append(ranks[0])
    return Fleet(front, back, targets, limits[0], limits[-1], *units)


class Router:
    """Round-robin, or least outstanding tokens (ties to the first in the list), over
    instances (one scheduler each); an instance with dp ranks then picks the rank
    (`RankGroup`). A dynamic fleet's router sees its ready units only (`route_over`)."""

    __slots__ = ("by_load", "instances", "least", "next")

    def __init__(self, instances: list[BaseScheduler], policy: RoutingPolicy) -> None:
        self.by_load = policy is RoutingPolicy.LEAST_OUTSTANDING_TOKENS
        self.instances = instances
        self.least = self.by_load and len(instances) > 1
        self.next = 0

    def route_over(self, instances: list[BaseScheduler]) -> None:
        """Route over `instances` from now on (a unit became ready or began to drain);
        round-robin carries on from its position in the new list."""
        self.instances = instances
        self.least = self.by_load and len(instances) > 1
        self.next = self.next % len(instances) if instances else 0

    def pick(self) -> BaseScheduler:
        if self.least:
            inst = min(self.instances, key=_outstanding)
        else:
            inst = self.instances[self.next]
            self.next = (self.next + 1) % len(self.instances)
        group = inst.group
        return inst if group is None else group.pick()


def _outstanding(inst: BaseScheduler) -> int:
    group = inst.group
    return inst.outstanding if group is None else group.outstanding


def decode_only(target: StepLatency) -> Callable[[int, int], float]:
    """(sequences, KV tokens) -> seconds of a decode-only step (for the records)."""

    def price(n: int, kv: int) -> float:
        return target.step_time_s(StepLoad(n, n, (), (), n, kv, 1))

    return price
