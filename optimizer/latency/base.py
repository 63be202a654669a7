"""The contract between the simulator and every latency model.

The simulator describes each engine iteration on one instance as a `StepLoad`
and asks a `StepLatency` what it costs. A latency model is fixed to one
(model shape, accelerator, tensor-parallel degree); a `LatencySource` hands out
the right one for each role of a `ServingConfig`.

Implementations must be cheap to call (microseconds: table lookups, never
scikit-learn `predict`) and pure, so `simulate` stays deterministic and safe in
a process pool (implementations must be picklable).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Protocol

import numpy as np

from optimizer.engines import DEFAULT_RELEASE, EngineRelease
from optimizer.parallel import DENSE_LAYOUT, ExpertLayout
from optimizer.shapes import DEFAULT_PRECISION, Precision


@dataclass(slots=True)
class StepLoad:
    """What one iteration of one instance computes.

    num_tokens: query tokens in the step (prefill chunk tokens + decode tokens,
        counting K+1 per sequence when verifying speculation).
    num_logits: rows that reach the LM head (one per sequence that samples,
        K+1 per verifying sequence).
    prefill_q / prefill_kv: per prefill chunk, its query length and the KV
        length it attends to (tokens already cached + the chunk itself).
    num_decode_seqs: sequences in their decode phase this step.
    decode_kv_tokens: sum of their KV lengths.
    decode_q: query positions per decoding sequence (1, or K+1 when verifying).
    """

    num_tokens: int
    num_logits: int
    prefill_q: tuple[int, ...] = ()
    prefill_kv: tuple[int, ...] = ()
    num_decode_seqs: int = 0
    decode_kv_tokens: int = 0
    decode_q: int = 1


class StepLatency(Protocol):
    """Prices iterations for one (model shape, accelerator, TP degree).

    A model may also price a step that starts on an idle engine differently, with
    `idle_step_time_s(load)` (optional; `idle_step_time` falls back to `step_time_s`):
    with async scheduling such a step has nothing to overlap its CPU work with."""

    @property
    def is_estimate(self) -> bool:
        """True when the figures come from a roofline, not from measurements."""
        ...

    def step_time_s(self, load: StepLoad) -> float:
        """Wall time of one iteration, in seconds (always > 0)."""
        ...


@dataclass(frozen=True, slots=True)
class TableReach:
    """The largest loads a run can put on a table (each >= 1)."""

    max_tokens: int  # query tokens in one step (the token budget bounds it)
    max_batch: int  # sequences decoding in one step (max_num_seqs bounds it)
    max_q: int  # tokens of one prefill chunk
    max_kv: int  # KV length of one sequence (its prompt + output, + speculative slots)

    def union(self, other: TableReach) -> TableReach:
        return TableReach(*(max(getattr(self, f.name), getattr(other, f.name))
                            for f in fields(self)))  # fmt: skip


class LatencySource(Protocol):
    """Hands out the latency model for one role's accelerator and TP degree."""

    def for_instance(
        self,
        accelerator: str,
        tp: int,
        reach: TableReach | None = None,
        precision: Precision = DEFAULT_PRECISION,
        engine: EngineRelease = DEFAULT_RELEASE,
        layout: ExpertLayout = DENSE_LAYOUT,
    ) -> StepLatency:
        """Raise `LookupError` with a clear message when none is available. `reach`
        bounds the loads the caller will price (a compiled source may tabulate only
        that much; loads beyond it are still priced, by extrapolation). `precision`:
        the deployment's weight and KV-cache formats (FP8 GEMMs, FP8 KV attention).
        `engine`: the release that runs the steps (`optimizer.engines`), whose rules and
        overhead a source prices them with (a measured source may ignore it). `layout`:
        how a MoE model's instance splits its experts (`optimizer.parallel`; the dense
        layout for a dense model)."""
        ...


def idle_step_time(latency: StepLatency) -> Callable[[StepLoad], float]:
    """`latency`'s price of a step that starts on an idle engine: its
    `idle_step_time_s` when it has one, else `step_time_s`."""
    return getattr(latency, "idle_step_time_s", latency.step_time_s)


def step_pricer(latency: StepLatency, idle: bool = False) -> Callable[[StepLoad], float]:
    """`latency.step_time_s` (with `idle`: `idle_step_time(latency)`) as the simulator calls
    it every step: the model's own `pricer(idle)` when it has one (a compiled table's
    function over its constants, the same figures), else the method itself."""
    pricer = getattr(latency, "pricer", None)
    if pricer is not None:
        return pricer(idle)
    return idle_step_time(latency) if idle else latency.step_time_s


def decode_run_pricer(latency: StepLatency) -> Callable[[int, int, int], np.ndarray]:
    """(b, kv0, k) -> `step_pricer(latency)`'s prices, in seconds, of k decode-only steps of
    b one-token decodes attending to kv0, kv0 + b, ..., kv0 + (k - 1) b KV tokens (a decode
    stretch the simulator advances at once): the model's own `run_pricer()` when it has
    one (a compiled table's lookups over arrays, the same figures), else one `step_pricer`
    call per step."""
    run_pricer = getattr(latency, "run_pricer", None)
    if run_pricer is not None:
        return run_pricer()
    step = step_pricer(latency)

    def price_run(b: int, kv0: int, k: int) -> np.ndarray:
        loads = (StepLoad(b, b, (), (), b, kv0 + b * i, 1) for i in range(k))
        return np.fromiter(map(step, loads), np.float64, k)

    return price_run
