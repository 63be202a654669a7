"""vLLM `/metrics` pages rendered from per-request values: test and benchmark input.

The bucket boundaries are vLLM's, copied as values (facts, not code) from
`PrometheusStatLogger` in vllm/v1/metrics/loggers.py (commit 005a810, a v0.10-era
tree): TTFT, time-per-output-token (the per-token gaps), and the request-latency
buckets shared by e2e and queue time. Token-count histograms use vLLM's 1-2-5 series
up to max_model_len (`build_1_2_5_buckets`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from optimizer.sim import SimulationResult
from optimizer.telemetry import vllm as names
from optimizer.telemetry.histogram import Histogram

TTFT_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS_S = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS_S = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


def token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1, 2, 5, 10, 20, 50, ... up to max_model_len."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return tuple(out)
            out.append(float(value))
        exponent += 1


@dataclass(frozen=True, slots=True)
class VllmTraffic:
    """Per-request values as vLLM observes them (seconds, tokens), plus per-token gaps."""

    ttft_s: np.ndarray
    e2e_s: np.ndarray
    queue_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    itl_gaps_s: np.ndarray
    itl_gap_weights: np.ndarray
    num_preemptions: int

    @classmethod
    def random(cls, n: int, seed: int) -> VllmTraffic:
        """`n` plausible requests, seeded: TTFT 20-200 ms, ITL 6-30 ms, prompts of 100-1,500
        and outputs of 20-200 tokens, queueing under 10 ms, no preemptions."""
        rng = np.random.default_rng(seed)
        ttft = rng.uniform(0.02, 0.2, n)
        itl = rng.uniform(0.006, 0.03, n)
        out = rng.integers(20, 200, n)
        return cls(
            ttft_s=ttft, e2e_s=ttft + itl * (out - 1), queue_s=rng.uniform(0.0, 0.01, n),
            prompt_tokens=rng.integers(100, 1500, n), output_tokens=out,
            itl_gaps_s=itl, itl_gap_weights=(out - 1).astype(float), num_preemptions=0,
        )  # fmt: skip

    @classmethod
    def of(cls, result: SimulationResult) -> VllmTraffic:
        done = ~np.isnan(result.e2e_s)
        return cls(
            result.ttft_s[done],
            result.e2e_s[done],
            result.queueing_s[done],
            result.input_tokens[done],
            result.output_tokens[done],
            result.itl_gaps_s,
            result.itl_gap_weights,
            int(result.num_preemptions.sum()),
        )

    def plus(self, later: VllmTraffic) -> VllmTraffic:
        """This traffic followed by `later` (what a counter holds after both)."""

        def cat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return np.concatenate((a, b))

        return VllmTraffic(
            cat(self.ttft_s, later.ttft_s),
            cat(self.e2e_s, later.e2e_s),
            cat(self.queue_s, later.queue_s),
            cat(self.prompt_tokens, later.prompt_tokens),
            cat(self.output_tokens, later.output_tokens),
            cat(self.itl_gaps_s, later.itl_gaps_s),
            cat(self.itl_gap_weights, later.itl_gap_weights),
            self.num_preemptions + later.num_preemptions,
        )


def render_vllm_page(
    traffic: VllmTraffic,
    *,
    max_model_len: int = 8192,
    model_name: str = "llama-3.1-8b",
    itl_name: str = names.ITL,
    kv_cache_usage: float = 0.25,
    num_running: int = 3,
    num_waiting: int = 0,
) -> str:
    """The `/metrics` text a vLLM server that served `traffic` would show (one engine)."""
    labels = f'engine="0",model_name="{model_name}"'
    tokens = token_buckets(max_model_len)
    lines: list[str] = []

    def hist(
        name: str, values: np.ndarray, bounds: tuple[float, ...], weights: np.ndarray | None = None
    ) -> None:
        h = Histogram.of(values, (*bounds, math.inf), weights)
        lines.append(f"# TYPE {name} histogram")
        for bound, cum in zip(h.upper_bounds, h.cumulative, strict=True):
            le = "+Inf" if bound == math.inf else repr(float(bound))
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {cum!r}')
        lines.append(f"{name}_count{{{labels}}} {h.count!r}")
        lines.append(f"{name}_sum{{{labels}}} {h.sum!r}")

    def scalar(name: str, kind: str, value: float, extra: str = "") -> None:
        family = name.removesuffix("_total")
        if not any(line == f"# TYPE {family} {kind}" for line in lines):
            lines.append(f"# TYPE {family} {kind}")
        lines.append(f"{name}{{{labels}{extra}}} {float(value)!r}")

    scalar(names.RUNNING, "gauge", num_running)
    scalar(names.WAITING, "gauge", num_waiting)
    scalar(names.KV_USAGE[0], "gauge", kv_cache_usage)
    scalar(names.PREFIX_QUERIES[0], "counter", float(traffic.prompt_tokens.sum()))
    scalar(names.PREFIX_HITS[0], "counter", 0.0)
    scalar(names.PREEMPTIONS, "counter", traffic.num_preemptions)
    scalar(names.PROMPT_TOKENS_TOTAL, "counter", float(traffic.prompt_tokens.sum()))
    scalar(names.GENERATION_TOKENS_TOTAL, "counter", float(traffic.output_tokens.sum()))
    scalar(names.REQUEST_SUCCESS, "counter", traffic.e2e_s.size, ',finished_reason="length"')
    scalar(names.REQUEST_SUCCESS, "counter", 0, ',finished_reason="stop"')
    hist(names.PROMPT_TOKENS, traffic.prompt_tokens, tokens)
    hist(names.GENERATION_TOKENS, traffic.output_tokens, tokens)
    hist(names.TTFT, traffic.ttft_s, TTFT_BUCKETS_S)
    hist(itl_name, traffic.itl_gaps_s, ITL_BUCKETS_S, traffic.itl_gap_weights)
    hist(names.E2E, traffic.e2e_s, REQUEST_LATENCY_BUCKETS_S)
    hist(names.QUEUE, traffic.queue_s, REQUEST_LATENCY_BUCKETS_S)
    return "\n".join(lines) + "\n"
