"""Open-loop workloads the simulator replays: traces and synthetic arrivals.

`Workload` holds a trace as numpy columns (arrival order, arrival_s from the
first request). It is immutable and picklable, so it can be shipped to a
process pool. The helpers return new workloads: `time_scaled` compresses or
stretches inter-arrival times (the DistServe capacity search), `window` cuts a
time slice, `sample` draws a seeded subset, and `synthetic_workload` generates
Poisson or Gamma arrivals with lognormal, fixed or empirical lengths.

Closed-loop clients (`ClosedLoopWorkload`: N concurrent clients, each sending its
next request when the previous one finishes) are `optimizer.closed_loop_workload`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from optimizer.records import TraceColumns

_HASH_BLOCK_CANDIDATES = (16, 32, 64, 128, 256, 512, 1024, 2048)


class WorkloadError(ValueError):
    """A workload, or a request to derive one, is invalid."""


def readonly_array(name: str, values: object, dtype: type) -> np.ndarray:
    """`values` as a read-only contiguous 1-D array of `dtype` (`WorkloadError` if not 1-D)."""
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
        arrival = readonly_array("arrival_s", self.arrival_s, np.float64)
        inp = readonly_array("input_tokens", self.input_tokens, np.int64)
        out = readonly_array("output_tokens", self.output_tokens, np.int64)
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
                readonly_array(f"prefix_hashes[{i}]", h, np.int64)
                for i, h in enumerate(self.prefix_hashes)
            )
            if len(hashes) != n:
                raise WorkloadError(f"prefix_hashes: {len(hashes)} entries for {n} requests")
            if self.prefix_block_tokens <= 0:
                raise WorkloadError("prefix_block_tokens must be > 0 when prefix_hashes are given")
            object.__setattr__(self, "prefix_hashes", hashes)
        if self.acceptance_length is not None:
            acc = readonly_array("acceptance_length", self.acceptance_length, np.float64)
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

    def subset(self, idx: np.ndarray) -> Workload:
        """The requests at indices `idx` (increasing), at their own arrival times."""
        idx = np.asarray(idx, dtype=np.int64)
        if idx.size == 0 or idx[0] < 0 or idx[-1] >= len(self) or np.any(np.diff(idx) <= 0):
            raise WorkloadError(f"subset: expected increasing indices in [0, {len(self)}), "
                                f"got {idx.size} of them")  # fmt: skip
        return self._select(idx, self.arrival_s[idx], "")

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
