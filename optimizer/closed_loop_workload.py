"""Closed-loop clients: the load of `vllm bench serve --max-concurrency` and AIPerf.

`ClosedLoopWorkload` describes N concurrent clients, each sending its next
request when the previous one finishes (as `vllm bench serve
--max-concurrency` and AIPerf do); the simulator decides the arrival times.
`FrontendDelay` is the path from a client's send to the engine (the API server).
Open-loop traces are `optimizer.workload.Workload`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from optimizer.workload import LengthDistribution, WorkloadError, readonly_array


@dataclass(frozen=True, slots=True)
class FrontendDelay:
    """From a client sending a request to the engine scheduling it (docs/closed-loop.md).

    vLLM's API server handles requests one at a time on one event loop: HTTP parsing,
    validation, tokenisation, then a hand-off to the engine process. A request reaches
    the engine `per_request_s + per_prompt_token_s x prompt` after the server is free
    of the one before, plus a random delay (exponential, mean `jitter_s`: network,
    OS scheduling, the client's own turnaround after its previous response). This is
    what breaks up clients that start together with equal lengths: without it every
    wave of a closed loop would reach the engine in the same instant and prefill in
    one step. Figures are estimates (a fast tokenizer does ~2-3 M tokens/s); the
    sensitivity of TTFT to them is in docs/closed-loop.md.
    """

    per_request_s: float = 0.002
    per_prompt_token_s: float = 4e-7
    jitter_s: float = 0.002
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("per_request_s", "per_prompt_token_s", "jitter_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise WorkloadError(f"frontend {name}: expected seconds >= 0, got {value!r}")

    @property
    def is_zero(self) -> bool:
        return self.per_request_s == self.per_prompt_token_s == self.jitter_s == 0

    def costs_s(self, input_tokens: np.ndarray) -> list[float]:
        """Each request's time in the API server (seconds)."""
        cost = self.per_request_s + self.per_prompt_token_s * input_tokens.astype(np.float64)
        if self.jitter_s > 0:
            rng = np.random.default_rng(self.seed)
            cost = cost + rng.exponential(self.jitter_s, size=input_tokens.shape[0])
        return cost.tolist()


NO_FRONTEND = FrontendDelay(0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class ClosedLoopWorkload:
    """A benchmark client: `num_clients` slots; each sends its next request (in order)
    when its previous one finishes, plus think time, and not before that request's
    `release_s` (a request rate's schedule; None: all released at 0). With
    `num_clients` >= the requests and release times this is an open loop.

    The request lengths are fixed up front; the simulator fills in the send times.
    `frontend` is the path from a send to the engine (`FrontendDelay`); TTFT is
    measured from the send, as the client measures it.
    """

    num_clients: int
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    think_time_s: float = 0.0
    name: str = ""
    release_s: np.ndarray | None = None
    frontend: FrontendDelay = field(default_factory=FrontendDelay)
    prefix_hashes: tuple[np.ndarray, ...] | None = None
    prefix_block_tokens: int = 16
    # The first `num_warmups` requests warm the server up: the client sends them, waits
    # for all of them to end and then sends the rest as a fresh burst; they are left out
    # of the results (aiperf's --warmup-request-count, vllm bench serve's --num-warmups).
    num_warmups: int = 0
    # The client's own work after a stream ends, before the slot's next send (aiperf
    # parses every streamed chunk first): seconds per output token of the ended request.
    turnaround_per_output_token_s: float = 0.0

    def __post_init__(self) -> None:
        inp = readonly_array("input_tokens", self.input_tokens, np.int64)
        out = readonly_array("output_tokens", self.output_tokens, np.int64)
        object.__setattr__(self, "input_tokens", inp)
        object.__setattr__(self, "output_tokens", out)
        if inp.shape != out.shape or inp.size == 0:
            raise WorkloadError(
                f"closed loop needs equal, non-empty length arrays, got {inp.size} and {out.size}"
            )
        if inp.min() <= 0 or out.min() <= 0:
            raise WorkloadError("closed loop token counts must be > 0")
        if not isinstance(self.num_clients, int) or self.num_clients <= 0:
            raise WorkloadError(f"num_clients must be a positive integer, got {self.num_clients!r}")
        if not (math.isfinite(self.think_time_s) and self.think_time_s >= 0):
            raise WorkloadError(f"think_time_s must be >= 0, got {self.think_time_s}")
        if self.release_s is not None:
            rel = readonly_array("release_s", self.release_s, np.float64)
            if rel.shape != inp.shape:
                raise WorkloadError(f"release_s: {rel.size} times for {inp.size} requests")
            if not np.all(np.isfinite(rel)) or rel.min() < 0 or np.any(np.diff(rel) < 0):
                raise WorkloadError("release_s must be finite, >= 0 and non-decreasing")
            object.__setattr__(self, "release_s", rel)
        if not isinstance(self.frontend, FrontendDelay):
            raise WorkloadError("frontend: expected a FrontendDelay")
        if self.prefix_hashes is not None and len(self.prefix_hashes) != inp.size:
            raise WorkloadError(
                f"prefix_hashes: {len(self.prefix_hashes)} rows for {inp.size} requests"
            )
        w = self.num_warmups
        if not isinstance(w, int) or isinstance(w, bool) or not 0 <= w < inp.size:
            raise WorkloadError(
                f"num_warmups must be an integer from 0 to {inp.size - 1} (fewer than the "
                f"requests), got {w!r}"
            )
        t = self.turnaround_per_output_token_s
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t >= 0):
            raise WorkloadError(f"turnaround_per_output_token_s must be >= 0, got {t!r}")

    def head(self, num_requests: int) -> ClosedLoopWorkload:
        """The first `num_requests` requests, with as many clients at most."""
        if num_requests <= 0:
            raise WorkloadError(f"num_requests must be > 0, got {num_requests}")
        if num_requests >= len(self):
            return self
        hashes, release = self.prefix_hashes, self.release_s
        return replace(
            self,
            num_warmups=min(self.num_warmups, num_requests - 1),
            num_clients=min(self.num_clients, num_requests),
            input_tokens=self.input_tokens[:num_requests],
            output_tokens=self.output_tokens[:num_requests],
            release_s=None if release is None else release[:num_requests],
            prefix_hashes=None if hashes is None else hashes[:num_requests],
        )

    def out_of_step(self, cycle_s: float, seed: int = 0) -> ClosedLoopWorkload:
        """The measured requests with the clients out of step: no warm-ups and no burst;
        each client sends its first request at an independent uniform phase of one request
        cycle (`cycle_s`, a request's mean end-to-end time), then as before. The opposite
        extreme of the client's burst, which a replay keeps in lock-step
        (docs/closed-loop.md). A request schedule (`release_s`) already spreads the sends:
        such a workload is refused."""
        if not (math.isfinite(cycle_s) and cycle_s > 0):
            raise WorkloadError(f"cycle_s: expected seconds > 0, got {cycle_s!r}")
        if self.release_s is not None:
            raise WorkloadError("out_of_step: the sends follow a request schedule already")
        w = self.num_warmups
        n = len(self) - w
        clients = min(self.num_clients, n)
        rng = np.random.default_rng(seed)
        release = np.zeros(n)
        release[:clients] = np.sort(rng.uniform(0.0, cycle_s, clients))
        hashes = self.prefix_hashes
        return replace(
            self,
            num_warmups=0,
            num_clients=clients,
            input_tokens=self.input_tokens[w:],
            output_tokens=self.output_tokens[w:],
            release_s=np.maximum.accumulate(release),
            prefix_hashes=None if hashes is None else hashes[w:],
        )

    def __len__(self) -> int:
        return int(self.input_tokens.shape[0])

    @classmethod
    def generate(
        cls,
        num_clients: int,
        num_requests: int,
        *,
        input_lengths: LengthDistribution,
        output_lengths: LengthDistribution,
        think_time_s: float = 0.0,
        seed: int,
    ) -> ClosedLoopWorkload:
        if num_requests <= 0:
            raise WorkloadError(f"num_requests must be > 0, got {num_requests}")
        rng = np.random.default_rng(seed)
        return cls(
            num_clients=num_clients,
            input_tokens=input_lengths.draw(rng, num_requests),
            output_tokens=output_lengths.draw(rng, num_requests),
            think_time_s=think_time_s,
            name=f"closed-loop-{num_clients}",
        )
