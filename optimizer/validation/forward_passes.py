"""Measured engine steps ("forward pass metrics") and how well a latency model prices them.

NVIDIA Dynamo's vLLM worker publishes one record per engine step with the step's batch
makeup and its wall time; AIConfigurator's collector writes them as
`fpm_metrics_detail.csv` (`observations/aic-fpm-b300` in the shared data). Columns read:
`phase` (context / decode / mixed), `workload_segment`, `counter_id` (step number; a gap
is an idle heartbeat), `sum_prefill_tokens`, `num_prefill_requests`,
`sum_prefill_kv_tokens` (KV already present for those chunks), `num_decode_requests`,
`sum_decode_kv_tokens` and `latency_ms`.

What `latency_ms` is (the collector's vLLM patch): in steady state the time between two
consecutive `update_from_output()` calls, i.e. the step *period*, which with async
scheduling is max(GPU, CPU) plus what the overlap does not hide; for the first step
after an idle gap, `schedule()` to `update_from_output()`, the whole step with its CPU
work in line. So a step after idle is priced as a synchronous one
(`MeasuredStep.after_idle`).

The records hold sums per step, not each prefill chunk: a step with n chunks is priced
as n equal chunks of the mean length over the mean cached prefix (a step of one chunk,
every context step and most mixed ones, is exact). A decode step's attention is priced
at its mean KV length, as the simulator prices it.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np

from optimizer.engines import EngineOverhead
from optimizer.latency.base import StepLoad
from optimizer.latency.table import CompiledStepLatency
from optimizer.validation.compare import ValidationError


class StepPhase(StrEnum):
    PREFILL = "prefill"  # prefill chunks only ("context")
    DECODE = "decode"
    MIXED = "mixed"


_PHASES = {"context": StepPhase.PREFILL, "decode": StepPhase.DECODE, "mixed": StepPhase.MIXED}
_COLUMNS = (
    "phase",
    "workload_segment",
    "counter_id",
    "sum_prefill_tokens",
    "num_prefill_requests",
    "sum_prefill_kv_tokens",
    "num_decode_requests",
    "sum_decode_kv_tokens",
    "latency_ms",
)


@dataclass(frozen=True, slots=True)
class MeasuredStep:
    """One engine step as measured: what it computed and how long it took."""

    phase: StepPhase
    segment: str
    load: StepLoad
    latency_s: float
    after_idle: bool  # the first step after an idle gap (its CPU work was not overlapped)


def _load(prefill: int, chunks: int, prefix: int, decodes: int, decode_kv: int) -> StepLoad:
    q, kv = (), ()
    if chunks:
        base, extra = divmod(prefill, chunks)
        q = tuple(base + (1 if i < extra else 0) for i in range(chunks))
        cached = prefix // chunks
        kv = tuple(c + cached for c in q)
    return StepLoad(
        num_tokens=prefill + decodes,
        num_logits=decodes + chunks,
        prefill_q=q,
        prefill_kv=kv,
        num_decode_seqs=decodes,
        decode_kv_tokens=decode_kv,
    )


def read_forward_pass_metrics(path: str | Path) -> list[MeasuredStep]:
    """The steps of one `fpm_metrics_detail.csv` (ValidationError naming the row and the
    column when it is not one)."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = sorted(set(_COLUMNS) - set(reader.fieldnames or ()))
            if missing:
                raise ValidationError(f"{path}: missing columns {missing}")
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ValidationError(f"{path}: cannot read forward-pass metrics: {exc}") from exc
    steps: list[MeasuredStep] = []
    previous: int | None = None
    for line, row in enumerate(rows, start=2):
        try:
            phase = _PHASES[row["phase"]]
            counter = int(row["counter_id"])
            ints = [int(row[c]) for c in _COLUMNS[3:8]]
            latency_ms = float(row["latency_ms"])
        except (KeyError, ValueError) as exc:
            raise ValidationError(
                f"{path}:{line}: expected a phase in {sorted(_PHASES)} and numeric columns "
                f"{list(_COLUMNS[2:])}: {exc}"
            ) from None
        if not (math.isfinite(latency_ms) and latency_ms > 0) or min(ints) < 0:
            raise ValidationError(f"{path}:{line}: latencies must be > 0 and counts >= 0")
        after_idle = previous is None or counter != previous + 1
        previous = counter
        load = _load(*ints)
        if load.num_tokens == 0:
            continue
        steps.append(MeasuredStep(phase, row["workload_segment"], load, latency_ms / 1e3,
                                  after_idle))  # fmt: skip
    if not steps:
        raise ValidationError(f"{path}: no engine steps")
    return steps


def synchronous(step: MeasuredStep) -> bool:
    """Whether the engine ran `step` with nothing to overlap its CPU work with: the first
    step after an idle gap, or a step of fresh prompts only (no request was running; a
    chunk that continues a prompt was planned while the prompt's previous chunk ran, as
    the simulator prices it)."""
    load = step.load
    fresh = load.prefill_kv == load.prefill_q  # no chunk continues a prompt begun before
    return step.after_idle or (step.phase is StepPhase.PREFILL and fresh)


def price_step_s(table: CompiledStepLatency, step: MeasuredStep) -> float:
    """What `table` predicts `step` took: a steady step as the simulator prices it, a
    synchronous one with the engine's CPU work in line (kernels + both overheads)."""
    if not synchronous(step):
        return table.step_time_s(step.load)
    return table.idle_step_time_s(step.load)


@dataclass(frozen=True, slots=True)
class StepPricingFit:
    """An async-scheduling engine's step constants fitted on measured steps (see
    `fit_async_step_pricing`) and how many steps it used."""

    kernel_scale: float
    exposed: EngineOverhead
    cpu: EngineOverhead
    host_launch_s: float
    num_steps: int
    num_dropped: int


# One measured step for `fit_async_step_pricing`: (step, its kernels as tabulated, s; the
# host's kernel launches of its forward; the one-token forward outside MoE blocks, s).
FitStep = tuple[MeasuredStep, float, float, float]

# Where the host's time per launch is looked for (`fit_async_step_pricing`): 0-60 us.
HOST_LAUNCH_GRID_S = tuple(i * 0.5e-6 for i in range(121))


class _Steps:
    """The columns `fit_async_step_pricing` works on, one row a step."""

    def __init__(self, groups: dict[str, Sequence[FitStep]]) -> None:
        rows = [(g, s, k, n, f) for g, members in enumerate(groups.values())
                for s, k, n, f in members]  # fmt: skip
        if len(rows) < 3:
            raise ValidationError(f"fitting step pricing needs >= 3 steps, got {len(rows)}")
        self.group = np.array([r[0] for r in rows])
        self.latency = np.array([r[1].latency_s for r in rows])
        self.kernels = np.array([r[2] for r in rows])
        self.launches = np.array([r[3] for r in rows], dtype=np.float64)
        # sequences x the one-token forward: what the exposed share multiplies
        self.seq_forward_s = np.array([(r[1].load.num_decode_seqs + len(r[1].load.prefill_q)) * r[4]
                              for r in rows])  # fmt: skip
        self.sync = np.array([float(synchronous(r[1])) for r in rows])
        self.num_groups = len(np.bincount(self.group))

    def score(self, scale: float, share: float, cpu: float, host: float) -> float:
        """Mean over groups of the median |error| of the priced steps."""
        predicted = np.maximum(scale * self.kernels, self.launches * host)
        exposed = share * self.seq_forward_s + cpu * self.sync
        error = np.abs((predicted + exposed) / self.latency - 1)
        return float(np.mean([np.median(error[self.group == g])
                              for g in range(self.num_groups)]))  # fmt: skip


def fit_async_step_pricing(
    groups: dict[str, Sequence[FitStep]],
    host_grid_s: Sequence[float] = HOST_LAUNCH_GRID_S,
    judge: dict[str, Sequence[FitStep]] | None = None,
) -> StepPricingFit:
    """Fit `step = max(scale x kernels, launches x host) + share x forward x sequences` on
    steady steps, `+ cpu` on synchronous ones (`synchronous`). `groups` maps a name (e.g.
    a step type at one TP degree) to (step, its kernels' seconds as tabulated, the host's
    kernel launches of its forward: 0 in a full CUDA graph, `optimizer.latency.launches`,
    and the model's one-token forward outside MoE blocks in seconds: `forward_s`).

    For each host time per launch on `host_grid_s` the rest is a non-negative least
    squares on relative error, each group weighed alike, over the steps predicted within
    2x (with async scheduling a step's record can take in its neighbour's time); the
    host time kept is the one whose fit has the least mean, over groups, of the median
    |error| of all the group's steps, or of `judge`'s steps when given (other steps that
    fix the host time without moving the rest)."""
    from scipy.optimize import nnls

    steps = _Steps(groups)
    judged = steps if judge is None else _Steps(judge)
    group, latency, kernels = steps.group, steps.latency, steps.kernels
    launches, seq_forward, sync = steps.launches, steps.seq_forward_s, steps.sync
    best: tuple[float, StepPricingFit] | None = None
    for host in host_grid_s:
        floor = launches * host
        ratio = np.maximum(kernels, floor) / latency
        usable = (ratio > 0.5) & (ratio < 2.0)
        if usable.sum() < 3:
            continue
        counts = np.bincount(group[usable], minlength=steps.num_groups)[group]
        weight = np.where(usable, 1.0 / np.sqrt(np.maximum(counts, 1)), 0.0)
        scale = 1.0
        for _ in range(3):  # which steps the host bounds depends on the scale
            bound = floor > scale * kernels
            a = np.column_stack([np.where(bound, 0.0, kernels), seq_forward, sync])
            a = a / latency[:, None]
            b = 1.0 - np.where(bound, floor, 0.0) / latency
            w = weight[:, None]
            (scale, share, cpu), _ = nnls(a * w, b * w[:, 0])
        score = judged.score(float(scale), float(share), float(cpu), host)
        fit = StepPricingFit(float(scale), EngineOverhead(per_seq_forward=float(share)),
                             EngineOverhead(base_s=float(cpu)), float(host),
                             int(usable.sum()), int((~usable).sum()))  # fmt: skip
        if best is None or score < best[0]:
            best = (score, fit)
    if best is None:
        raise ValidationError("fitting step pricing found no host time with >= 3 usable steps")
    return best[1]


@dataclass(frozen=True, slots=True)
class PhaseError:
    """How one latency model prices the measured steps of one phase."""

    phase: StepPhase
    num_steps: int
    median_abs_error: float  # median |predicted / measured - 1|
    median_error: float  # signed: > 0 predicts slower than measured
    p90_abs_error: float


# A record shorter than this share of its price took no time of its own: see phase_errors.
SWALLOWED_BELOW = 0.2


def phase_errors(
    steps: Iterable[MeasuredStep], price_s: Callable[[MeasuredStep], float]
) -> list[PhaseError]:
    """Per phase, the errors of `price_s` (a step's predicted seconds) on `steps`.

    A record shorter than `SWALLOWED_BELOW` of its price, right after another, is read as
    swallowed by that one: vLLM 0.20 at TP 1 runs the engine in one process and logs two
    consecutive host-bound steps as one long record and one of under 1 ms (a 3,168 +
    928-token prompt of Qwen3.6-35B-A3B: 74 ms, then 0.4 ms). The pair is compared as one
    step, under the first's phase."""
    pairs: list[tuple[StepPhase, float, float]] = []  # (phase, measured, priced)
    for step in steps:
        price = price_s(step)
        if pairs and not step.after_idle and step.latency_s < SWALLOWED_BELOW * price:
            phase, measured, priced = pairs[-1]
            pairs[-1] = (phase, measured + step.latency_s, priced + price)
            continue
        pairs.append((step.phase, step.latency_s, price))
    errors: dict[StepPhase, list[float]] = {}
    for phase, measured, priced in pairs:
        errors.setdefault(phase, []).append(priced / measured - 1.0)
    out = []
    for phase in StepPhase:
        errs = errors.get(phase)
        if not errs:
            continue
        absolute = sorted(abs(e) for e in errs)
        p90 = absolute[min(len(absolute) - 1, math.ceil(0.9 * len(absolute)) - 1)]
        out.append(PhaseError(phase, len(errs), statistics.median(absolute),
                              statistics.median(errs), p90))  # fmt: skip
    return out


def summarize_phases(results: Sequence[PhaseError]) -> str:
    return ", ".join(
        f"{r.phase.value} {r.median_abs_error:.1%} ({r.median_error:+.1%}, n={r.num_steps})"
        for r in results
    )
