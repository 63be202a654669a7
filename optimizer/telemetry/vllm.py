"""vLLM's `/metrics` names, read into a typed scrape, and the window between two scrapes.

The names are those `PrometheusStatLogger` registers in vllm/v1/metrics/loggers.py
(read at vllm-project/vllm commits a6f0308, a v0.8-era tree, and 005a810, a v0.10-era
tree; docs/observe.md lists which names hold for which versions). Counters are exposed
by `prometheus_client` with a `_total` suffix. Every series is summed over its labels
(`model_name`, `engine`, `finished_reason`) except `le`, after keeping only
`model_name=<model_name>` when one is chosen; a page holding two models without a
choice is an error, since one config cannot stand for both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.telemetry.errors import (
    CounterResetError,
    EmptyWindowError,
    ForeignEngineError,
    MissingMetricError,
    TelemetryError,
    WindowError,
)
from optimizer.telemetry.exposition import Exposition, Sample
from optimizer.telemetry.histogram import Histogram

TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"  # newer releases (see docs/observe.md)
ITL_OLD = "vllm:time_per_output_token_seconds"  # per-token gaps under this name up to ~0.10
E2E = "vllm:e2e_request_latency_seconds"
QUEUE = "vllm:request_queue_time_seconds"
PROMPT_TOKENS = "vllm:request_prompt_tokens"
GENERATION_TOKENS = "vllm:request_generation_tokens"
REQUEST_SUCCESS = "vllm:request_success_total"
PROMPT_TOKENS_TOTAL = "vllm:prompt_tokens_total"
GENERATION_TOKENS_TOTAL = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # new name first

# Prefixes of other engines' metrics, to say whose page it is when no vllm: name is there.
FOREIGN_PREFIXES = (
    ("sglang:", "SGLang"),
    ("tgi_", "Hugging Face TGI"),
    ("nv_inference_", "NVIDIA Triton / TensorRT-LLM"),
    ("trtllm_", "TensorRT-LLM"),
    ("lmdeploy_", "LMDeploy"),
)


@dataclass(frozen=True, slots=True)
class VllmScrape:
    """One vLLM `/metrics` page, summed over the chosen series. Histograms in seconds
    (latencies) or tokens (lengths); counters cumulative since the server started;
    `kv_cache_usage` a fraction (1 = all blocks), the mean over engines."""

    ttft: Histogram
    itl: Histogram
    itl_name: str  # which of ITL / ITL_OLD the page had
    e2e: Histogram
    prompt_tokens: Histogram
    generation_tokens: Histogram
    queue: Histogram | None
    num_requests_success: float
    num_prompt_tokens: float | None
    num_generation_tokens: float | None
    num_preemptions: float | None
    prefix_cache_queries: float | None
    prefix_cache_hits: float | None
    num_requests_running: float | None
    num_requests_waiting: float | None
    kv_cache_usage: float | None
    model_names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ObservedWindow:
    """What happened between two scrapes `window_s` seconds apart: histogram deltas,
    counter deltas, and the gauges as the later scrape read them."""

    window_s: float
    ttft: Histogram
    itl: Histogram
    itl_name: str
    e2e: Histogram
    prompt_tokens: Histogram
    generation_tokens: Histogram
    queue: Histogram | None
    num_requests: int  # finished (vllm:request_success_total delta)
    num_prompt_tokens: float | None
    num_generation_tokens: float | None
    num_preemptions: float | None
    prefix_cache_hit_ratio: float | None
    num_requests_running: float | None  # gauges at AFTER
    num_requests_waiting: float | None
    kv_cache_usage: float | None

    @property
    def request_rate(self) -> float:
        """Finished requests per second over the window."""
        return self.num_requests / self.window_s

    def to_dict(self) -> dict[str, object]:
        """JSON-ready, as stored with an observation (histograms by `Histogram.to_dict`)."""
        out: dict[str, object] = {}
        for name in _WINDOW_FIELDS:
            value = getattr(self, name)
            out[name] = value.to_dict() if isinstance(value, Histogram) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> ObservedWindow:
        """The inverse of `to_dict`; TelemetryError names a field that is missing."""
        missing = [n for n in _WINDOW_FIELDS if n not in data]
        if missing:
            raise TelemetryError(f"stored window: missing {', '.join(missing)}")
        values = {
            n: Histogram.from_dict(data[n]) if n in _HISTOGRAMS and data[n] is not None
            else data[n]
            for n in _WINDOW_FIELDS
        }  # fmt: skip
        return cls(**values)  # type: ignore[arg-type]


_HISTOGRAMS = ("ttft", "itl", "e2e", "prompt_tokens", "generation_tokens", "queue")
_WINDOW_FIELDS = tuple(ObservedWindow.__dataclass_fields__)


def read_vllm(page: Exposition, *, source: str, model_name: str | None = None) -> VllmScrape:
    """The vLLM series of `page`; `source` ("BEFORE", "AFTER") names it in errors."""
    _check_engine(page, source)
    models = tuple(
        sorted(
            {
                m
                for s in page.samples
                if s.name.startswith("vllm:") and (m := s.label("model_name")) is not None
            }
        )
    )
    if model_name is None and len(models) > 1:
        raise WindowError(
            f"{source} holds series for {len(models)} models ({', '.join(models)}); choose one "
            "with --model-name"
        )
    if model_name is not None and model_name not in models:
        raise WindowError(
            f"{source} has no series with model_name={model_name!r}; it has "
            f"{', '.join(models) or 'none'}"
        )
    select = _Selector(page, source, model_name)
    itl_name = ITL if select.has(f"{ITL}_count") else ITL_OLD
    return VllmScrape(
        ttft=select.histogram(TTFT),
        itl=select.histogram(itl_name, also=ITL if itl_name == ITL_OLD else None),
        itl_name=itl_name,
        e2e=select.histogram(E2E),
        prompt_tokens=select.histogram(PROMPT_TOKENS),
        generation_tokens=select.histogram(GENERATION_TOKENS),
        queue=select.histogram(QUEUE) if select.has(f"{QUEUE}_count") else None,
        num_requests_success=select.total(REQUEST_SUCCESS),
        num_prompt_tokens=select.optional(PROMPT_TOKENS_TOTAL),
        num_generation_tokens=select.optional(GENERATION_TOKENS_TOTAL),
        num_preemptions=select.optional(PREEMPTIONS),
        prefix_cache_queries=select.first(PREFIX_QUERIES),
        prefix_cache_hits=select.first(PREFIX_HITS),
        num_requests_running=select.optional(RUNNING),
        num_requests_waiting=select.optional(WAITING),
        kv_cache_usage=select.first(KV_USAGE, mean=True),
        model_names=models,
    )


def observed_window(before: VllmScrape, after: VllmScrape, window_s: float) -> ObservedWindow:
    """The window between two scrapes of one server `window_s` seconds apart."""
    if not (math.isfinite(window_s) and window_s > 0):
        raise WindowError(f"--window-s must be a positive number of seconds, got {window_s:g}")
    if before.itl_name != after.itl_name:
        raise MissingMetricError(
            f"BEFORE has {before.itl_name} but AFTER has {after.itl_name}; take both scrapes "
            "from one server process"
        )
    num_requests = _delta(REQUEST_SUCCESS, before.num_requests_success, after.num_requests_success)
    if num_requests <= 0:
        raise EmptyWindowError(
            f"no request finished in the window ({REQUEST_SUCCESS} is "
            f"{after.num_requests_success:g} in both scrapes); take the scrapes around a window "
            "with traffic"
        )
    hits = _opt_delta(PREFIX_HITS[0], before.prefix_cache_hits, after.prefix_cache_hits)
    queries = _opt_delta(PREFIX_QUERIES[0], before.prefix_cache_queries, after.prefix_cache_queries)
    queue = None
    if before.queue is not None and after.queue is not None:
        queue = after.queue.minus(before.queue, QUEUE)
    return ObservedWindow(
        window_s=window_s,
        ttft=after.ttft.minus(before.ttft, TTFT),
        itl=after.itl.minus(before.itl, after.itl_name),
        itl_name=after.itl_name,
        e2e=after.e2e.minus(before.e2e, E2E),
        prompt_tokens=after.prompt_tokens.minus(before.prompt_tokens, PROMPT_TOKENS),
        generation_tokens=after.generation_tokens.minus(
            before.generation_tokens, GENERATION_TOKENS
        ),
        queue=queue,
        num_requests=round(num_requests),
        num_prompt_tokens=_opt_delta(
            PROMPT_TOKENS_TOTAL, before.num_prompt_tokens, after.num_prompt_tokens
        ),
        num_generation_tokens=_opt_delta(
            GENERATION_TOKENS_TOTAL, before.num_generation_tokens, after.num_generation_tokens
        ),
        num_preemptions=_opt_delta(PREEMPTIONS, before.num_preemptions, after.num_preemptions),
        prefix_cache_hit_ratio=(hits / queries if hits is not None and queries else None),
        num_requests_running=after.num_requests_running,
        num_requests_waiting=after.num_requests_waiting,
        kv_cache_usage=after.kv_cache_usage,
    )


def _delta(name: str, before: float, after: float) -> float:
    if after < before:
        raise CounterResetError(
            f"counter reset between the scrapes: {name} fell from {before:g} to {after:g}; "
            "take both scrapes from one server process"
        )
    return after - before


def _opt_delta(name: str, before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else _delta(name, before, after)


def _check_engine(page: Exposition, source: str) -> None:
    if any(s.name.startswith("vllm:") for s in page.samples):
        return
    for prefix, engine in FOREIGN_PREFIXES:
        if any(s.name.startswith(prefix) for s in page.samples):
            raise ForeignEngineError(
                f"{source} looks like {engine}'s /metrics ({prefix} names), not vLLM's; only "
                "vLLM's vllm: names are read"
            )
    raise MissingMetricError(
        f"no vllm:... series in {source} ({len(page.samples)} samples): is this a vLLM "
        "/metrics page?"
    )


class _Selector:
    """Sums the chosen series of one page by sample name (and `le` for buckets)."""

    def __init__(self, page: Exposition, source: str, model_name: str | None) -> None:
        self._source = source
        self._by_name: dict[str, list[Sample]] = {}
        for s in page.samples:
            if model_name is None or s.label("model_name") in (None, model_name):
                self._by_name.setdefault(s.name, []).append(s)

    def has(self, name: str) -> bool:
        return name in self._by_name

    def _missing(self, name: str) -> MissingMetricError:
        return MissingMetricError(f"no {name} in {self._source}: is this a vLLM /metrics page?")

    def total(self, name: str) -> float:
        if name not in self._by_name:
            raise self._missing(name)
        return float(sum(s.value for s in self._by_name[name]))

    def optional(self, name: str) -> float | None:
        return self.total(name) if name in self._by_name else None

    def first(self, names: tuple[str, ...], *, mean: bool = False) -> float | None:
        for name in names:
            if name in self._by_name:
                values = [s.value for s in self._by_name[name]]
                return sum(values) / len(values) if mean else float(sum(values))
        return None

    def histogram(self, name: str, also: str | None = None) -> Histogram:
        buckets = self._by_name.get(f"{name}_bucket")
        if not buckets or f"{name}_count" not in self._by_name:
            wanted = f"{name} (or {also})" if also else name
            raise MissingMetricError(
                f"no {wanted} histogram in {self._source}: is this a vLLM /metrics page?"
            )
        by_le: dict[float, float] = {}
        for s in buckets:
            le = s.label("le")
            if le is None:
                raise TelemetryError(f"{self._source}: a {name}_bucket series has no le label")
            try:
                bound = math.inf if le == "+Inf" else float(le)
            except ValueError:
                raise TelemetryError(
                    f'{self._source}: {name}_bucket{{le="{le}"}}: expected a number or +Inf'
                ) from None
            by_le[bound] = by_le.get(bound, 0.0) + s.value
        bounds = tuple(sorted(by_le))
        return Histogram(
            upper_bounds=bounds,
            cumulative=tuple(by_le[b] for b in bounds),
            sum=self.total(f"{name}_sum"),
            count=self.total(f"{name}_count"),
        )
