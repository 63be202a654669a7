"""Workloads the simulator replays: open-loop traces and closed-loop clients.

`Workload` holds a trace as numpy columns (arrival order, arrival_s from the
first request). It is immutable and picklable, so it can be shipped to a
process pool. The helpers return new workloads: `time_scaled` compresses or
stretches inter-arrival times (the DistServe capacity search), `window` cuts a
time slice, `sample` draws a seeded subset, and `synthetic_workload` generates
Poisson or Gamma arrivals with lognormal, fixed or empirical lengths.

`ClosedLoopWorkload` describes N concurrent clients, each sending its next
request when the previous one finishes (as `vllm bench serve
--max-concurrency` and AIPerf do); the simulator decides the arrival times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum

import numpy as np

from optimizer.records import TraceColumns

_HASH_BLOCK_CANDIDATES = (16, 32, 64, 128, 256, 512, 1024, 2048)


class WorkloadError(ValueError):
    """A workload, or a request to derive one, is invalid."""


def _as_array(name: str, values: object, dtype: type) -> np.ndarray:
    arr = np.ascontiguousarray(np.asarray(values), dtype=dtype)
    if arr.ndim != 1:
        raise WorkloadError(f"{name}: expected a 1-D array, got shape {arr.shape}")
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, slots=True)
class Workload:
    """An open-loop trace: request i arrives at arrival_s[i] with its token counts.

    prefix_hashes: per request, the content hashes of its leading prompt blocks
        of `prefix_block_tokens` tokens each (Mooncake `hash_ids`), or None.
    acceptance_length: per request, measured speculative tokens per step
        (nan = unknown), or None.
    """

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_hashes: tuple[np.ndarray, ...] | None = None
    prefix_block_tokens: int = 0
    acceptance_length: np.ndarray | None = None
    name: str = ""

    def __post_init__(self) -> None:
        arrival = _as_array("arrival_s", self.arrival_s, np.float64)
        inp = _as_array("input_tokens", self.input_tokens, np.int64)
        out = _as_array("output_tokens", self.output_tokens, np.int64)
        object.__setattr__(self, "arrival_s", arrival)
        object.__setattr__(self, "input_tokens", inp)
        object.__setattr__(self, "output_tokens", out)
        n = arrival.shape[0]
        if n == 0:
            raise WorkloadError("a workload needs at least one request")
        for name, arr in (("input_tokens", inp), ("output_tokens", out)):
            if arr.shape[0] != n:
                raise WorkloadError(f"{name}: {arr.shape[0]} values for {n} arrivals")
            bad = np.flatnonzero(arr <= 0)
            if bad.size:
                i = int(bad[0])
                raise WorkloadError(f"{name}[{i}] = {int(arr[i])}: token counts must be > 0")
        if not np.all(np.isfinite(arrival)):
            i = int(np.flatnonzero(~np.isfinite(arrival))[0])
            raise WorkloadError(f"arrival_s[{i}] is not finite")
        if n > 1 and np.any(np.diff(arrival) < 0):
            i = int(np.flatnonzero(np.diff(arrival) < 0)[0]) + 1
            raise WorkloadError(f"arrival_s must be sorted; arrival_s[{i}] < arrival_s[{i - 1}]")
        if self.prefix_hashes is not None:
            hashes = tuple(
                _as_array(f"prefix_hashes[{i}]", h, np.int64)
                for i, h in enumerate(self.prefix_hashes)
            )
            if len(hashes) != n:
                raise WorkloadError(f"prefix_hashes: {len(hashes)} entries for {n} requests")
            if self.prefix_block_tokens <= 0:
                raise WorkloadError("prefix_block_tokens must be > 0 when prefix_hashes are given")
            object.__setattr__(self, "prefix_hashes", hashes)
        if self.acceptance_length is not None:
            acc = _as_array("acceptance_length", self.acceptance_length, np.float64)
            if acc.shape[0] != n:
                raise WorkloadError(f"acceptance_length: {acc.shape[0]} values for {n} requests")
            known = acc[~np.isnan(acc)]
            if known.size and known.min() < 1.0:
                raise WorkloadError(
                    "acceptance_length values must be >= 1 tokens per step (or nan)"
                )
            object.__setattr__(self, "acceptance_length", acc)

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def num_requests(self) -> int:
        return len(self)

    @property
    def duration_s(self) -> float:
        """Span from the first to the last arrival."""
        return float(self.arrival_s[-1] - self.arrival_s[0])

    @property
    def mean_rate(self) -> float:
        """Requests per second over the arrival span (inf for a single instant)."""
        span = self.duration_s
        return (len(self) - 1) / span if span > 0 else math.inf

    @property
    def total_output_tokens(self) -> int:
        return int(self.output_tokens.sum())

    @classmethod
    def from_columns(
        cls, columns: TraceColumns, *, prefix_block_tokens: int | None = None, name: str = ""
    ) -> Workload:
        """Wrap a stored trace. The hash block size is inferred when not given."""
        hashes = None
        block = 0
        if columns.prefix_hashes is not None:
            hashes = tuple(columns.prefix_hashes)
            block = prefix_block_tokens or infer_prefix_block_tokens(columns.input_tokens, hashes)
        return cls(
            arrival_s=columns.arrival_s,
            input_tokens=columns.input_tokens,
            output_tokens=columns.output_tokens,
            prefix_hashes=hashes,
            prefix_block_tokens=block,
            acceptance_length=columns.acceptance_length,
            name=name,
        )

    def _select(self, idx: np.ndarray, arrival: np.ndarray, suffix: str) -> Workload:
        hashes = None if self.prefix_hashes is None else tuple(self.prefix_hashes[i] for i in idx)
        acc = None if self.acceptance_length is None else self.acceptance_length[idx]
        return Workload(
            arrival_s=arrival,
            input_tokens=self.input_tokens[idx],
            output_tokens=self.output_tokens[idx],
            prefix_hashes=hashes,
            prefix_block_tokens=self.prefix_block_tokens,
            acceptance_length=acc,
            name=f"{self.name}{suffix}" if self.name else "",
        )

    def time_scaled(self, factor: float) -> Workload:
        """Multiply every arrival time by `factor` (< 1 compresses: a higher rate)."""
        if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
            raise WorkloadError(
                f"time scale factor must be a positive finite number, got {factor!r}"
            )
        idx = np.arange(len(self))
        return self._select(idx, self.arrival_s * float(factor), f"@x{factor:g}")

    def rate_scaled(self, factor: float) -> Workload:
        """Arrival rate multiplied by `factor` (inter-arrival times divided by it)."""
        if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
            raise WorkloadError(
                f"rate scale factor must be a positive finite number, got {factor!r}"
            )
        return self.time_scaled(1.0 / float(factor))

    def window(self, start_s: float, end_s: float) -> Workload:
        """Requests arriving in [start_s, end_s), re-based so the first arrives at 0."""
        if not end_s > start_s:
            raise WorkloadError(f"window end ({end_s}) must be after its start ({start_s})")
        lo = int(np.searchsorted(self.arrival_s, start_s, side="left"))
        hi = int(np.searchsorted(self.arrival_s, end_s, side="left"))
        if hi <= lo:
            raise WorkloadError(
                f"no request arrives in [{start_s}, {end_s}) s "
                f"(trace spans {self.arrival_s[0]:.3f}..{self.arrival_s[-1]:.3f} s)"
            )
        idx = np.arange(lo, hi)
        return self._select(
            idx, self.arrival_s[idx] - self.arrival_s[lo], f"[{start_s:g},{end_s:g})"
        )

    def slice(self, start: int, stop: int) -> Workload:
        """Requests [start, stop) in arrival order, re-based so the first arrives at 0."""
        if not 0 <= start < stop <= len(self):
            raise WorkloadError(f"slice [{start}, {stop}) of a {len(self)}-request workload")
        idx = np.arange(start, stop)
        return self._select(idx, self.arrival_s[idx] - self.arrival_s[start], f"[{start}:{stop}]")

    def head(self, num_requests: int) -> Workload:
        """The first `num_requests` requests."""
        if num_requests <= 0:
            raise WorkloadError(f"num_requests must be > 0, got {num_requests}")
        idx = np.arange(min(num_requests, len(self)))
        return self._select(idx, self.arrival_s[idx], f"[:{num_requests}]")

    def sample(self, num_requests: int, *, seed: int) -> Workload:
        """A seeded random subset (without replacement), kept in arrival order."""
        if not 0 < num_requests <= len(self):
            raise WorkloadError(f"cannot sample {num_requests} of {len(self)} requests")
        rng = np.random.default_rng(seed)
        idx = np.sort(rng.choice(len(self), size=num_requests, replace=False))
        return self._select(idx, self.arrival_s[idx] - self.arrival_s[idx[0]], f"~{num_requests}")


def infer_prefix_block_tokens(input_tokens: np.ndarray, hashes: tuple[np.ndarray, ...]) -> int:
    """The hash block size b with len(hashes[i]) == ceil(input[i] / b) on every row."""
    lengths = np.fromiter((len(h) for h in hashes), dtype=np.int64, count=len(hashes))
    inp = np.asarray(input_tokens, dtype=np.int64)
    fits = [b for b in _HASH_BLOCK_CANDIDATES if np.array_equal(lengths, -(-inp // b))]
    if len(fits) != 1:
        raise WorkloadError(
            "cannot infer the prefix hash block size from the trace "
            f"(candidates that fit: {fits}); pass prefix_block_tokens explicitly"
        )
    return fits[0]


# ----------------------------------------------------------------------------- synthetic


class ArrivalProcess(StrEnum):
    POISSON = "poisson"
    GAMMA = "gamma"


@dataclass(frozen=True, slots=True)
class FixedLength:
    tokens: int

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.tokens <= 0:
            raise WorkloadError(f"FixedLength.tokens must be > 0, got {self.tokens}")
        return np.full(n, self.tokens, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class LognormalLength:
    """Lognormal lengths with the given mean and sigma (of the log), clipped to [min, max]."""

    mean: float
    sigma: float = 1.0
    min_tokens: int = 1
    max_tokens: int = 1 << 20

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.mean <= 0 or self.sigma < 0 or not 0 < self.min_tokens <= self.max_tokens:
            raise WorkloadError(f"invalid lognormal length distribution {self}")
        mu = math.log(self.mean) - self.sigma**2 / 2
        values = np.rint(rng.lognormal(mu, self.sigma, size=n))
        return np.clip(values, self.min_tokens, self.max_tokens).astype(np.int64)


@dataclass(frozen=True, slots=True)
class EmpiricalLength:
    """Lengths resampled (with replacement) from observed values."""

    values: tuple[int, ...]

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if not self.values or min(self.values) <= 0:
            raise WorkloadError("EmpiricalLength needs at least one positive value")
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=n, replace=True)


LengthDistribution = FixedLength | LognormalLength | EmpiricalLength


def synthetic_workload(
    num_requests: int,
    rate: float,
    *,
    input_lengths: LengthDistribution,
    output_lengths: LengthDistribution,
    arrival: ArrivalProcess = ArrivalProcess.POISSON,
    cv: float = 1.0,
    seed: int,
) -> Workload:
    """Seeded synthetic trace: Poisson (cv 1) or Gamma(cv) inter-arrivals at `rate` req/s."""
    if num_requests <= 0:
        raise WorkloadError(f"num_requests must be > 0, got {num_requests}")
    if not (math.isfinite(rate) and rate > 0):
        raise WorkloadError(f"rate must be a positive finite number of requests/s, got {rate}")
    rng = np.random.default_rng(seed)
    mean_gap = 1.0 / rate
    arrival = ArrivalProcess(arrival)
    if arrival is ArrivalProcess.POISSON:
        gaps = rng.exponential(mean_gap, size=num_requests)
    else:
        if not (math.isfinite(cv) and cv > 0):
            raise WorkloadError(f"gamma arrivals need a positive cv, got {cv}")
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, mean_gap / shape, size=num_requests)
    gaps[0] = 0.0
    return Workload(
        arrival_s=np.cumsum(gaps),
        input_tokens=input_lengths.draw(rng, num_requests),
        output_tokens=output_lengths.draw(rng, num_requests),
        name=f"synthetic-{arrival.value}-{rate:g}rps",
    )


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
        inp = _as_array("input_tokens", self.input_tokens, np.int64)
        out = _as_array("output_tokens", self.output_tokens, np.int64)
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
            rel = _as_array("release_s", self.release_s, np.float64)
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
