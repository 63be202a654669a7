"""Open-loop traffic for the reference engine: phases of Poisson arrivals, seeded
lognormal prompt and output lengths."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from profiler.reference_engine.realtime import ReplayRequests
from profiler.reference_engine.scheduler import EngineError

LENGTH_SIGMA = 0.5  # lognormal shape of the drawn prompt and output lengths


@dataclass(frozen=True, slots=True)
class TrafficPhase:
    """Poisson arrivals at `rate_rps` requests per second for `duration_s` seconds."""

    rate_rps: float
    duration_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate_rps) and self.rate_rps >= 0):
            raise EngineError(f"a phase's rate must be >= 0 requests/s, got {self.rate_rps:g}")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise EngineError(f"a phase's duration must be > 0 s, got {self.duration_s:g}")

    @classmethod
    def parse(cls, text: str) -> TrafficPhase:
        """`RATE:SECONDS`, e.g. `8:60`."""
        rate, sep, seconds = text.partition(":")
        try:
            if not sep:
                raise ValueError
            return cls(float(rate), float(seconds))
        except ValueError:
            raise EngineError(
                f"--phase {text!r}: expected RATE:SECONDS (requests/s and seconds, e.g. 8:60)"
            ) from None


@dataclass(frozen=True, slots=True)
class OpenLoopTraffic:
    """Phases of Poisson arrivals, one after another; prompt and output lengths drawn
    from seeded lognormals with these means (shape `LENGTH_SIGMA`)."""

    phases: tuple[TrafficPhase, ...]
    prompt_mean: float = 200.0
    output_mean: float = 40.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.phases:
            raise EngineError("open-loop traffic needs at least one phase")
        for what, mean in (("prompt", self.prompt_mean), ("output", self.output_mean)):
            if not (math.isfinite(mean) and mean >= 1):
                raise EngineError(f"the mean {what} length must be >= 1 token, got {mean:g}")

    @property
    def duration_s(self) -> float:
        return float(sum(p.duration_s for p in self.phases))

    def starts_s(self) -> list[float]:
        """Each phase's start, seconds after the traffic's."""
        return np.cumsum([0.0, *(p.duration_s for p in self.phases[:-1])]).tolist()

    def draw(self, max_tokens: int) -> ReplayRequests:
        """The requests, each prompt + output clipped to `max_tokens`."""
        if max_tokens < 2:
            raise EngineError(f"an instance holding {max_tokens} tokens cannot serve a request")
        rng = np.random.default_rng(self.seed)
        arrivals = []
        for start, phase in zip(self.starts_s(), self.phases, strict=True):
            t = start
            while phase.rate_rps > 0:
                t += rng.exponential(1.0 / phase.rate_rps)
                if t >= start + phase.duration_s:
                    break
                arrivals.append(t)
        if not arrivals:
            raise EngineError("the phases draw no request; raise a rate or a duration")
        n = len(arrivals)
        prompt = np.clip(_lognormal(rng, self.prompt_mean, n), 1, max_tokens - 1)
        output = np.clip(_lognormal(rng, self.output_mean, n), 1, max_tokens - prompt)
        return ReplayRequests(np.array(arrivals), prompt, output)


def _lognormal(rng: np.random.Generator, mean: float, n: int) -> np.ndarray:
    mu = math.log(mean) - LENGTH_SIGMA**2 / 2  # E[exp(N(mu, s^2))] = exp(mu + s^2 / 2)
    return np.maximum(1, np.rint(rng.lognormal(mu, LENGTH_SIGMA, n))).astype(np.int64)
