"""Physical floors under a tuning request's SLOs, checked before any search (DOMAIN.md §1).

No deployment the request allows can beat two bounds, so a request whose SLOs lie below
them for more requests than its attainment may miss is refused at once, naming the floor
and the value asked, instead of running a study that can only fail:

- the decode floor: a decode step reads at least one token's active weights
  (`ModelShape.active_weight_bytes`: a MoE model's `experts_per_token` routed experts,
  not all of them; the input embedding is a row lookup), spread at best evenly over the
  GPUs of the most parallel instance the request allows, each streaming its share from
  HBM at the vendor's peak bandwidth. Speculation (a drafter named) emits at most K + 1
  tokens a step, K the deepest the space searches, so a token's floor is the step's / (K + 1).
  A request with one output token has no TPOT, so the floor binds only those with two or more.
- the lone-prefill floor: a prompt's first token cannot come sooner than its prefill alone
  on that idle instance: the larger of its GEMMs' FLOPs (2 x the active parameters a token
  multiplies x prompt tokens, plus the LM head once) at every GPU's dense tensor-core peak
  of the fastest format the weights allow, and one read of the active weights. Attention's
  own FLOPs, the queue and the transfer to a decode instance only add to it. With prefix
  caching searched, all but one token of a prompt may come from cache: the floor is then
  one token's.

Both are physical bounds (roofline, vendor peaks), never the learned latency model, so a
floor cannot refuse a request a real run would meet. The one way round HBM, weights kept
in an on-chip cache between steps, is allowed for: each GPU may hold `CACHE_BYTES`
(more than any GPU's last-level cache: 50 MB on H100/H200, 126 MB on B200, 256 MB of
Infinity Cache on MI300X), which the floor does not charge. The most parallel instance
is the largest tp (x dp for a MoE model) the space offers within the GPU budget; no
instance of a disaggregated unit is larger. (`optimizer.sim.floor` is a different bound:
one GPU's share of a given instance's weights, the simulator's check on latency models.)

Workload lengths (`WorkloadLengths`) are nearest-rank percentiles of prompt and output
tokens (`TokenStats`, as stored with every trace), so the REST route answers from the
trace's stored statistics and the worker from the loaded trace with the same figures. A
percentile proves a share: when the p-th percentile prompt's floor exceeds the TTFT SLO,
every request from its rank up misses it, and the request is refused only when the
requests below that rank are fewer than the attainment asks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from optimizer.bench_serve import BenchServeSpec
from optimizer.config import SpecMethod
from optimizer.hardware import Accelerator, get_accelerator
from optimizer.records import TokenStats, TraceStats
from optimizer.search.request import TuneRequest, TuneRequestError
from optimizer.search.space import SearchSpace
from optimizer.shapes import ModelShape, Precision, get_shape
from optimizer.workload import Workload

CACHE_BYTES = 256 * 2**20  # per GPU: more than any GPU's last-level cache (module docstring)
# (percentile, its name in a message), in the order TokenStats holds them
_PERCENTILES = (
    (50, "the median"),
    (90, "the 90th-percentile"),
    (99, "the 99th-percentile"),
    (100, "the longest"),
)


class FloorError(TuneRequestError):
    """A request's SLO lies below a physical floor for more requests than its attainment
    may miss; `violations` names each such SLO field and why."""

    def __init__(self, violations: Sequence[FloorViolation]) -> None:
        self.violations = tuple(violations)
        super().__init__("\n".join(v.message for v in self.violations))


@dataclass(frozen=True, slots=True)
class FloorViolation:
    field: str  # the request's field: "slo_tpot_ms" or "slo_ttft_ms"
    message: str  # starts with the field's name, then the SLO asked and the floor


@dataclass(frozen=True, slots=True)
class WorkloadLengths:
    """What the floors need of a workload: its requests' prompt and output tokens as
    nearest-rank percentiles, and whether it carries prefix hashes (prefix caching is then
    searched)."""

    num_requests: int
    input_tokens: TokenStats
    output_tokens: TokenStats
    prefix_hashes: bool = False

    @classmethod
    def of_stats(cls, stats: TraceStats) -> WorkloadLengths:
        """A stored trace's, from its statistics (hashes: it has a prefix-hit ratio)."""
        hashes = stats.prefix_hit_ratio is not None
        return cls(stats.num_requests, stats.input_tokens, stats.output_tokens, hashes)

    @classmethod
    def of_arrays(
        cls, input_tokens: np.ndarray, output_tokens: np.ndarray, *, prefix_hashes: bool
    ) -> WorkloadLengths:
        from optimizer.traces.stats import token_stats  # the trace statistics' own percentiles

        inp, out = np.asarray(input_tokens), np.asarray(output_tokens)
        return cls(int(inp.shape[0]), token_stats(inp), token_stats(out), prefix_hashes)

    @classmethod
    def of_spec(cls, spec: BenchServeSpec, max_requests: int | None = None) -> WorkloadLengths:
        """A closed-loop benchmark's measured prompts, cut as its evaluator cuts them."""
        if max_requests and max_requests < spec.num_prompts:
            spec = replace(spec, num_prompts=max_requests)
        inp, out = spec.lengths()
        return cls.of_arrays(inp, out, prefix_hashes=spec.random_prefix_len > 0)


@dataclass(frozen=True, slots=True)
class FloorDeployment:
    """The most parallel instance a request allows on one GPU type: the floors' premise."""

    shape: ModelShape  # in the weight format the space deploys
    accelerator: Accelerator
    num_gpus: int
    max_tokens_per_step: int = 1  # 1 + the deepest speculation searched
    prefix_caching: bool = False  # all but one token of a prompt may come from cache

    @property
    def read_bytes_per_gpu(self) -> float:
        """A step's weight bytes one GPU streams from HBM at least (module docstring)."""
        return max(0.0, self.shape.active_weight_bytes / self.num_gpus - CACHE_BYTES)

    @property
    def step_floor_s(self) -> float:
        """A decode step's floor: every GPU streaming its share of the active weights."""
        return self.read_bytes_per_gpu / self.accelerator.hbm_bytes_per_s

    @property
    def tpot_floor_s(self) -> float:
        return self.step_floor_s / self.max_tokens_per_step

    @property
    def peak_flops(self) -> tuple[float, str]:
        """(FLOP/s, its format): the fastest dense tensor-core peak the weights allow (16-bit
        weights run 16-bit GEMMs; quantised ones at best the part's FP8 or FP4 peak)."""
        acc = self.accelerator
        peaks = [(acc.bf16_tflops, "BF16")]
        if self.shape.quantization != "none":
            peaks += [(p, n) for p, n in ((acc.fp8_tflops, "FP8"), (acc.fp4_tflops, "FP4")) if p]
        tflops, name = max(peaks)
        return tflops * 1e12, name

    @property
    def params_per_token(self) -> int:
        """Weights each prompt token multiplies: the active linear layers and routers (the LM
        head runs on the last token only)."""
        s = self.shape
        linear = s.num_linear_params - s.routed_expert_params + s.active_expert_params
        return linear + s.router_params

    def prefill_tokens(self, prompt_tokens: int) -> int:
        """Tokens a lone prefill must compute (one when prefix caching may serve the rest)."""
        return 1 if self.prefix_caching else prompt_tokens

    def compute_floor_s(self, prompt_tokens: int) -> float:
        flops = 2 * self.params_per_token * self.prefill_tokens(prompt_tokens)
        flops += 2 * self.shape.embedding_params  # the LM head, for the last token
        return flops / (self.num_gpus * self.peak_flops[0])

    def prefill_floor_s(self, prompt_tokens: int) -> float:
        """A prompt's lone prefill: its GEMMs at peak or one read of the weights, the longer."""
        return max(self.compute_floor_s(prompt_tokens), self.step_floor_s)


def max_instance_gpus(space: SearchSpace, shape: ModelShape) -> int:
    """GPUs of the largest instance the space offers within its budget: tp, x dp for a MoE
    model (a dense model's dp is replicas, which do not share a request)."""
    dps = space.dp if shape.is_moe else (1,)
    sizes = [t * d for t in space.tp for d in dps if t * d <= space.gpu_budget]
    return max(sizes, default=space.gpu_budget)


def floor_deployments(request: TuneRequest, *, prefix_hashes: bool) -> list[FloorDeployment]:
    """The most parallel instance of each GPU type on offer, in the space's weight format,
    speculation depth and prefix caching (`prefix_hashes`: the workload carries them)."""
    space = request.space(trace_has_prefix_hashes=prefix_hashes)
    shape = get_shape(request.model)
    if space.quantization is not None:
        shape = shape.with_precision(Precision(space.quantization, shape.kv_cache_dtype))
    k = max(space.spec_k) if space.spec_method is not SpecMethod.NONE else 0
    num_gpus = max_instance_gpus(space, shape)
    return [
        FloorDeployment(shape, get_accelerator(g), num_gpus, 1 + k, True in space.prefix_caching)
        for g in request.gpu_types
    ]


def _ms(seconds: float, above_ms: float | None = None) -> str:
    """Milliseconds to 3 significant figures (6 when 3 would not print above `above_ms`)."""
    ms = seconds * 1e3
    if ms <= 0:
        return "0"
    text = ""
    for digits in (3, 6):
        text = f"{ms:,.{max(0, digits - 1 - math.floor(math.log10(ms)))}f}"
        if above_ms is None or float(text.replace(",", "")) > above_ms:
            break
    return text


def _pct(share: float) -> str:
    return f"{100 * share:.3g}%"


def _rank(q: int, n: int) -> int:
    """The 1-based rank of the nearest-rank q-th percentile of n values."""
    return max(1, -(-q * n // 100))


def _share(q: int) -> str:
    """The requests from the q-th percentile's rank up: more than (100 - q)% of them (the
    rank is ceil(q n / 100)); at least one for the longest."""
    return "at least one request" if q == 100 else f"more than {100 - q}% of the requests"


def _allowed(request: TuneRequest) -> str:
    a = request.attainment
    return f"where {_pct(a)} attainment lets at most {_pct(1 - a)} miss"


def _deployment(d: FloorDeployment) -> str:
    return f"the most parallel deployment allowed ({d.num_gpus} x {d.accelerator.name}: "


def _read_text(d: FloorDeployment) -> str:
    return (
        f"{d.shape.active_weight_bytes / 1e9:,.1f} GB of active weights read per step, 1/"
        f"{d.num_gpus} on each GPU at {d.accelerator.hbm_tb_s:g} TB/s, less "
        f"{CACHE_BYTES / 1e9:.2f} GB an on-chip cache may hold)"
    )


def tpot_violation(
    request: TuneRequest, lengths: WorkloadLengths, deployments: Sequence[FloorDeployment]
) -> FloorViolation | None:
    """The decode floor above the TPOT SLO for more requests than the attainment may miss
    (a request with one output token has no TPOT)."""
    d = min(deployments, key=lambda x: x.tpot_floor_s)
    if d.tpot_floor_s <= request.slo.tpot_s:
        return None
    n = lengths.num_requests
    # the lowest percentile with 2+ output tokens: every request from its rank up has a TPOT
    outputs = zip(_PERCENTILES, _values(lengths.output_tokens), strict=True)
    q = next((q for (q, _), v in outputs if v >= 2), None)
    if q is None or (_rank(q, n) - 1) / n >= request.attainment:
        return None
    k = d.max_tokens_per_step - 1
    floor = _ms(d.tpot_floor_s, request.slo_tpot_ms)
    speculation = ""
    if k:
        speculation = (
            f", speculating up to {k} tokens (a step emits at most {k + 1}: "
            f"{_ms(d.step_floor_s)} ms per step / {k + 1})"
        )
    return FloorViolation(
        "slo_tpot_ms",
        f"slo_tpot_ms: TPOT SLO {request.slo_tpot_ms:g} ms is below the decode floor of "
        f"{request.model} on {d.accelerator.name}: {floor} ms per token at "
        f"{_deployment(d)}{_read_text(d)}{speculation}; {_share(q)} have a TPOT (2 or more "
        f"output tokens), {_allowed(request)}",
    )


def ttft_violation(
    request: TuneRequest, lengths: WorkloadLengths, deployments: Sequence[FloorDeployment]
) -> FloorViolation | None:
    """The lone-prefill floor above the TTFT SLO for more requests than the attainment may
    miss (module docstring: a percentile's rank proves the share)."""
    n, slo_s = lengths.num_requests, request.slo.ttft_s
    for (q, name), tokens in zip(_PERCENTILES, _values(lengths.input_tokens), strict=True):
        d = min(deployments, key=lambda x: x.prefill_floor_s(tokens))
        floor_s = d.prefill_floor_s(tokens)
        if floor_s <= slo_s:
            continue
        rank = 1 if d.prefix_caching else _rank(q, n)  # cached, every prompt has one floor
        if (rank - 1) / n >= request.attainment:
            return None  # so few requests are longer that the attainment may miss them all
        floor = _ms(floor_s, request.slo_ttft_ms)
        if d.prefix_caching:
            who = (
                "every request (prefix caching is searched: all but one token of a prompt may "
                f"come from cache): one token's prefill takes at least {floor} ms at "
            )
        else:
            who = (
                f"{_share(q)}, {_allowed(request)}: {name} prompt "
                f"({tokens:,} tokens) alone takes at least {floor} ms to prefill at "
            )
        if d.compute_floor_s(tokens) >= d.step_floor_s:
            flops, fmt = d.peak_flops
            why = (
                f"2 x {d.params_per_token / 1e9:,.3g} B active parameters x "
                f"{d.prefill_tokens(tokens):,} tokens at {d.num_gpus} x {flops / 1e12:,.0f} "
                f"TFLOP/s, the {fmt} peak)"
            )
        else:
            why = _read_text(d)
        return FloorViolation(
            "slo_ttft_ms",
            f"slo_ttft_ms: TTFT SLO {request.slo_ttft_ms:g} ms is below the lone-prefill floor "
            f"of {request.model} for {who}{_deployment(d)}{why}",
        )
    return None


def _values(stats: TokenStats) -> tuple[int, int, int, int]:
    return stats.p50, stats.p90, stats.p99, stats.max


def request_lengths(request: TuneRequest, trace: Workload | None) -> WorkloadLengths:
    """What `request` runs on: its loaded trace, cut to `max_requests` as its evaluator cuts
    it, else (`trace` None) its closed-loop benchmark."""
    if trace is None:
        return WorkloadLengths.of_spec(request.bench_spec(), request.max_requests)
    n = request.max_requests or len(trace)
    return WorkloadLengths.of_arrays(
        trace.input_tokens[:n],
        trace.output_tokens[:n],
        prefix_hashes=trace.prefix_hashes is not None,
    )


def floor_violations(request: TuneRequest, lengths: WorkloadLengths) -> list[FloorViolation]:
    """Every SLO of `request` below its physical floor on `lengths` (empty: none)."""
    if lengths.num_requests == 0:
        return []
    deployments = floor_deployments(request, prefix_hashes=lengths.prefix_hashes)
    found = (
        tpot_violation(request, lengths, deployments),
        ttft_violation(request, lengths, deployments),
    )
    return [v for v in found if v is not None]


def check_floors(request: TuneRequest, lengths: WorkloadLengths) -> None:
    """Raise `FloorError` when an SLO of `request` lies below a physical floor."""
    violations = floor_violations(request, lengths)
    if violations:
        raise FloorError(violations)
