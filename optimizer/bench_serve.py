"""Benchmark workloads as users run them: `vllm bench serve`'s own parameters.

A workload file (YAML or JSON) names the parameters of `vllm bench serve` with
its random dataset, under the client's own names:

    dataset_name: random        # the only dataset without a trace
    random_input_len: 1024
    random_output_len: 128
    random_range_ratio: 0.0     # lengths uniform in [L(1-r), L(1+r)], independently
    random_prefix_len: 0        # one shared random prefix, before each prompt
    num_prompts: 1000
    max_concurrency: 8          # null: unlimited
    request_rate: inf           # requests/s; inf: all released at once
    burstiness: 1.0             # gamma shape of the gaps (1: Poisson)
    seed: 0
    num_warmups: 0              # warm-up requests first, left out of the results
    chat_template_tokens: 0     # tokens a chat endpoint's template adds to each prompt
    client: vllm                # vllm (vllm bench serve) | aiperf: how a slot turns around

`BenchServeSpec.build()` turns it into the `ClosedLoopWorkload` the client
really is (docs/closed-loop.md): requests in order; each sent when a slot of
`max_concurrency` frees (all of them at once without a limit) and not before
its release time; the release times drawn as the client draws them (gamma gaps
of mean 1/rate from numpy's legacy generator seeded with `seed`, rescaled so
the last is num_prompts/rate; `arrival_style: cumulative` for clients before
vLLM ~0.9, which sent the first at 0 and summed fresh gaps); input and output
lengths from `numpy.random.default_rng(seed)` as the random dataset draws
them, outputs exact (the client sets `ignore_eos` for the random dataset).
`num_warmups` warm-up requests (copies of the first prompt, as vllm bench serve sends
them) run first at the same concurrency; the client waits until they have all ended and
then sends the measured requests as a fresh burst (aiperf's `--warmup-request-count`
does the same), and only those are measured. `chat_template_tokens` is what a chat
endpoint's template adds to each prompt before the engine sees it (Qwen3's template
adds 8 for one user message; the completions endpoint adds none). `client: aiperf`
adds aiperf's turnaround: it parses every streamed chunk of a finished request before
its slot sends the next (~3.8 us per chunk, docs/closed-loop.md).
`workload()` is what `simulate` replays: at a finite rate with no binding
`max_concurrency` the same open-loop trace (`open_loop()`) that `tune` stores
and sizes fleets for, so the two price the same requests the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from optimizer.closed_loop_workload import ClosedLoopWorkload, FrontendDelay
from optimizer.workload import Workload, WorkloadError

ARRIVAL_STYLES = ("rescaled", "cumulative")
# A benchmark client's work per output token of a finished request before its slot sends
# the next one (docs/closed-loop.md): vllm bench serve releases its semaphore at once;
# aiperf's worker parses every streamed chunk first (~3.8 us each, measured on its parser).
CLIENT_TURNAROUND_PER_TOKEN_S = {"vllm": 0.0, "aiperf": 3.8e-6}
_MAX_PROMPTS = 10_000_000


class BenchServeError(ValueError):
    """A workload file that does not describe a `vllm bench serve` run (the message names
    the key and what was expected)."""


def _number(key: str, value: object, *, allow_inf: bool = False) -> float:
    if isinstance(value, str) and allow_inf and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
        raise BenchServeError(f"{key}: expected a number, got {value!r}")
    if math.isinf(value) and not allow_inf:
        raise BenchServeError(f"{key}: expected a finite number, got {value!r}")
    return float(value)


def _integer(key: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BenchServeError(f"{key}: expected an integer from {low} to {high}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class BenchServeSpec:
    """`vllm bench serve` with the random dataset (defaults: the client's own)."""

    dataset_name: str = "random"
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    num_prompts: int = 1000
    max_concurrency: int | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0
    seed: int = 0
    arrival_style: str = "rescaled"  # servetune's: how the client spaced its sends
    num_warmups: int = 0
    chat_template_tokens: int = 0
    client: str = "vllm"
    frontend: FrontendDelay = field(default_factory=FrontendDelay)

    def __post_init__(self) -> None:
        if self.dataset_name != "random":
            raise BenchServeError(
                f"dataset_name: only 'random' is a workload without a trace, got "
                f"{self.dataset_name!r} (import a trace or a result file for other datasets)"
            )
        _integer("random_input_len", self.random_input_len, 1, 10_000_000)
        _integer("random_output_len", self.random_output_len, 1, 10_000_000)
        _integer("random_prefix_len", self.random_prefix_len, 0, 10_000_000)
        _integer("num_prompts", self.num_prompts, 1, _MAX_PROMPTS)
        _integer("seed", self.seed, 0, 2**32 - 1)
        r = _number("random_range_ratio", self.random_range_ratio)
        if not 0 <= r < 1:
            raise BenchServeError(f"random_range_ratio: expected 0 <= r < 1, got {r!r}")
        if self.max_concurrency is not None:
            _integer("max_concurrency", self.max_concurrency, 1, _MAX_PROMPTS)
        rate = _number("request_rate", self.request_rate, allow_inf=True)
        if not rate > 0:
            raise BenchServeError(f"request_rate: expected > 0 (or inf), got {rate!r}")
        object.__setattr__(self, "request_rate", rate)
        b = _number("burstiness", self.burstiness, allow_inf=True)
        if not b > 0:
            raise BenchServeError(f"burstiness: expected > 0, got {b!r}")
        object.__setattr__(self, "burstiness", b)
        _integer("num_warmups", self.num_warmups, 0, _MAX_PROMPTS)
        _integer("chat_template_tokens", self.chat_template_tokens, 0, 100_000)
        if self.client not in CLIENT_TURNAROUND_PER_TOKEN_S:
            raise BenchServeError(
                f"client: expected one of {sorted(CLIENT_TURNAROUND_PER_TOKEN_S)}, got "
                f"{self.client!r}"
            )
        if self.num_warmups and not math.isinf(rate):
            raise BenchServeError(
                "num_warmups: warm-up requests are modelled for request_rate inf (the "
                "closed loop AIConfigurator and most benchmarks run); give num_warmups 0 "
                "with a finite request_rate"
            )
        if self.arrival_style not in ARRIVAL_STYLES:
            raise BenchServeError(
                f"arrival_style: expected one of {list(ARRIVAL_STYLES)}, got {self.arrival_style!r}"
            )

    # -- reading -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "workload") -> BenchServeSpec:
        if not isinstance(data, Mapping):
            raise BenchServeError(f"{where}: expected a mapping of vllm bench serve parameters")
        data = {str(k).replace("-", "_"): v for k, v in data.items()}
        known = {f.name for f in fields(cls)} - {"frontend"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise BenchServeError(
                f"{where}: unknown keys {unknown}; expected some of {sorted(known)}"
            )
        try:
            return cls(**data)
        except BenchServeError as exc:
            raise BenchServeError(f"{where}: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> BenchServeSpec:
        """Read a YAML or JSON workload file."""
        import yaml

        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise BenchServeError(f"{path}: cannot read: {exc}") from exc
        try:
            data = yaml.safe_load(text)  # JSON is YAML
        except yaml.YAMLError as exc:
            raise BenchServeError(f"{path}: not YAML or JSON: {exc}") from exc
        return cls.from_dict(data, where=str(path))

    # -- building ------------------------------------------------------------------------
    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """(input, output) tokens per request, drawn as the random dataset draws them."""
        rng = np.random.default_rng(self.seed)
        r, n = self.random_range_ratio, self.num_prompts

        def draw(length: int) -> np.ndarray:
            low = max(math.floor(length * (1 - r)), 1)
            high = max(math.ceil(length * (1 + r)), 1)
            return rng.integers(low, high + 1, size=n)

        inp = draw(self.random_input_len) + self.random_prefix_len + self.chat_template_tokens
        out = draw(self.random_output_len)
        return inp.astype(np.int64), out.astype(np.int64)

    def release_times(self) -> np.ndarray | None:
        """When the client lets each request go (None: all at once, rate inf)."""
        return client_send_times(
            self.num_prompts, self.request_rate, self.burstiness, self.seed, self.arrival_style
        )

    def prefix_hashes(self, block_tokens: int = 16) -> tuple[np.ndarray, ...] | None:
        """The shared random prefix's blocks (the same hashes on every request), then
        distinct blocks; None without a prefix."""
        if self.random_prefix_len < block_tokens:
            return None
        inp, _ = self.lengths()
        shared = np.arange(self.random_prefix_len // block_tokens, dtype=np.int64)
        base = shared.size
        rows = []
        for i, tokens in enumerate(inp):
            own = -(-int(tokens) // block_tokens) - base
            rows.append(np.concatenate([shared, base + i * 1_000_003 + np.arange(own)]))
        return tuple(rows)

    def build(self) -> ClosedLoopWorkload:
        inp, out = self.lengths()
        slots = self.max_concurrency or self.num_prompts
        w = self.num_warmups
        hashes = self.prefix_hashes()
        if w:  # copies of the first prompt, first
            inp = np.concatenate([np.full(w, inp[0]), inp])
            out = np.concatenate([np.full(w, out[0]), out])
            if hashes is not None:
                hashes = (hashes[0],) * w + hashes
        try:
            return ClosedLoopWorkload(
                num_clients=min(slots, self.num_prompts),
                input_tokens=inp,
                output_tokens=out,
                name=self.describe(),
                release_s=self.release_times(),
                frontend=self.frontend,
                prefix_hashes=hashes,
                num_warmups=w,
                turnaround_per_output_token_s=CLIENT_TURNAROUND_PER_TOKEN_S[self.client],
            )
        except WorkloadError as exc:
            raise BenchServeError(str(exc)) from exc

    @property
    def is_open_loop(self) -> bool:
        """A finite rate and no concurrency limit that binds: every request goes at its
        send time whatever the others do."""
        unlimited = self.max_concurrency is None or self.max_concurrency >= self.num_prompts
        return unlimited and not math.isinf(self.request_rate)

    def workload(self) -> Workload | ClosedLoopWorkload:
        """What `simulate` replays: the open-loop trace `tune` stores and sizes for when
        the spec is one (`open_loop`, so both price the same requests the same way),
        else the client's closed loop (`build`)."""
        return self.open_loop() if self.is_open_loop else self.build()

    def open_loop(self) -> Workload:
        """The requests as an open-loop trace, each at its send time whatever the others
        do: what `tune` sizes fleets for by scaling the arrival rate. Only a finite
        `request_rate` with no `max_concurrency` below `num_prompts` is such a trace; a
        closed loop's load is set by its clients, not by a rate (BenchServeError)."""
        if self.max_concurrency is not None and self.max_concurrency < self.num_prompts:
            raise BenchServeError(
                f"max_concurrency: {self.max_concurrency} clients make a closed loop, whose "
                "load no arrival rate describes; tune sizes fleets for a rate: give "
                "request_rate and no max_concurrency, or compare configs of a closed loop "
                "with `servetune simulate --workload`"
            )
        sends = self.release_times()
        if sends is None:
            raise BenchServeError(
                "request_rate: inf sends every prompt at once, a burst no fleet is sized "
                "for by rate; give a finite request_rate (requests/s) to tune"
            )
        inp, out = self.lengths()
        hashes = self.prefix_hashes()
        try:
            return Workload(
                sends - sends[0], inp, out, prefix_hashes=hashes,
                prefix_block_tokens=16 if hashes is not None else 0, name=self.describe(),
            )  # fmt: skip
        except WorkloadError as exc:
            raise BenchServeError(str(exc)) from exc

    def to_plain(self) -> dict[str, Any]:
        """The parameters that differ from the client's defaults, JSON-safe (`from_dict`
        reads them back; a request rate of inf, the default, is left out)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "frontend" or value == BenchServeSpec.__dataclass_fields__[f.name].default:
                continue
            out[f.name] = value
        return out

    def describe(self) -> str:
        conc = self.max_concurrency or "unlimited"
        rate = "inf" if math.isinf(self.request_rate) else f"{self.request_rate:g}"
        warm = f" after {self.num_warmups} warm-ups" if self.num_warmups else ""
        return (
            f"bench-serve random {self.random_input_len}/{self.random_output_len} "
            f"(range {self.random_range_ratio:g}), {self.num_prompts} prompts{warm}, "
            f"concurrency {conc}, rate {rate}"
        )


def client_send_times(
    num: int, rate: float, burstiness: float, seed: int, style: str = "rescaled"
) -> np.ndarray | None:
    """The send schedule of `vllm bench serve` (None at rate inf: all at once).

    Gaps are gamma(shape=burstiness, scale=1/(rate x burstiness)) from numpy's global
    (legacy) generator, which the client seeds with `seed`. `rescaled` (current client):
    the cumulative delays are scaled so the last request goes at num/rate, the first
    after its own gap. `cumulative` (clients before ~v0.9): the first goes at 0 and each
    later one after a fresh gap."""
    if math.isinf(rate):
        return None
    gen = np.random.RandomState(seed)
    if math.isinf(burstiness):
        gaps = np.full(num, 1.0 / rate)
    else:
        gaps = gen.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=num)
    if style == "cumulative":
        return np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    delays = np.cumsum(gaps)
    return delays * ((num / rate) / delays[-1])
