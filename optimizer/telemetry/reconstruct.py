"""The traffic of an observed window, rebuilt as a `Workload` the simulator can replay.

Histograms hold no arrival times and no pairing of a request's prompt with its output,
so this is an approximation (docs/observe.md):
- arrivals are Poisson at the observed rate (finished requests / window), seeded;
- prompt and output lengths are drawn independently from the window's
  `vllm:request_prompt_tokens` and `vllm:request_generation_tokens` bucket deltas:
  each bucket's share exactly, inside a bucket a lognormal fitted to the histogram,
  the mean kept exact (`Histogram.sample`), rounded up to whole tokens; the +Inf bucket
  reaches `max_model_len` when known, else the largest finite bound x INF_BUCKET_FACTOR;
- at most MAX_RECONSTRUCTED_REQUESTS requests are built: a busier window is replayed
  as its first MAX_RECONSTRUCTED_REQUESTS requests at the same rate (a shorter window
  of the same traffic).
"""

from __future__ import annotations

import math

import numpy as np

from optimizer.telemetry.vllm import ObservedWindow
from optimizer.workload import Workload

MAX_RECONSTRUCTED_REQUESTS = 20_000


def reconstruct_workload(
    window: ObservedWindow,
    *,
    seed: int = 0,
    max_model_len: int | None = None,
    max_requests: int = MAX_RECONSTRUCTED_REQUESTS,
) -> Workload:
    """`min(window.num_requests, max_requests)` requests at the window's rate."""
    n = min(window.num_requests, max_requests)
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / window.request_rate, size=n)
    arrival = np.cumsum(gaps) - gaps[0]  # the first request arrives at 0
    top = float(max_model_len) if max_model_len is not None else None
    prompt = _tokens(window.prompt_tokens.sample(rng, n, inf_upper=top))
    output = _tokens(window.generation_tokens.sample(rng, n, inf_upper=top))
    if max_model_len is not None:
        # A request's prompt plus output fits the model's context; trim the output.
        prompt = np.minimum(prompt, max_model_len - 1)
        output = np.maximum(np.minimum(output, max_model_len - prompt), 1)
    name = f"observed-{window.num_requests}req-{window.window_s:g}s"
    return Workload(arrival, prompt, output, name=name)


def _tokens(values: np.ndarray) -> np.ndarray:
    return np.maximum(np.ceil(values), 1).astype(np.int64)


def scale_to_window(value: float, window: ObservedWindow, workload: Workload) -> float:
    """A count the simulation made over `workload`, scaled to the whole window's requests
    (equal when the workload was not capped)."""
    if math.isnan(value):
        return value
    return value * window.num_requests / workload.num_requests
