"""`CompiledStepLatency.pricer`, the function the simulator prices each step with, gives
the very floats of `step_time_s` and `idle_step_time_s` on every branch: token counts in
and beyond the tables, prefill chunks, decodes in and beyond the grids, verification
beyond the tabulated K, the host floor and async scheduling's CPU bound; decode-only steps
(whose parts that depend on the batch alone it keeps per batch size) again and again."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from optimizer.engines import NO_OVERHEAD, EngineOverhead
from optimizer.hardware import get_accelerator
from optimizer.latency import StepLoad, compile_roofline
from optimizer.latency.base import step_pricer
from optimizer.latency.launches import NO_HOST_FLOOR, HostFloor
from optimizer.latency.table import TableGrid
from optimizer.shapes import get_shape

GRID = TableGrid(max_tokens=1024, max_log2_q=10, max_log2_kv=12, max_log2_batch=5)


def _loads(rng: np.random.Generator) -> list[StepLoad]:
    loads = [
        StepLoad(1, 1, (), (), 1, 1),  # one decode of one token: the grids' first points
        StepLoad(5, 5, (), (), 5, 5 * 3),  # below 8 tokens: tabulated exactly
        StepLoad(3000, 1, (3000,), (3000,)),  # a chunk beyond the token and q tables
        StepLoad(40, 40, (), (), 40, 40 * 9000),  # batch and KV beyond the grids
        StepLoad(64 * 11, 64 * 11, (), (), 64, 64 * 700, 11),  # K + 1 beyond the tables
        StepLoad(64, 0, (32, 32), (32, 4000)),  # two chunks, no logits
        StepLoad(600, 3, (300, 298), (300, 900), 2, 2 * 50),  # above the CUDA-graph bound
        StepLoad(600, 600, (), (), 600, 600 * 90),  # decodes only, above it too
        StepLoad(7, 7, (), (), 4, 4 * 90),  # decodes only, but not one token each
    ]
    for _ in range(300):
        decodes = int(rng.integers(0, 60))
        q = int(rng.integers(1, 1500)) if decodes == 0 or rng.random() < 0.4 else 0
        dq = int(rng.choice([1, 1, 2, 4, 9]))
        kv = decodes * int(rng.integers(1, 6000))
        chunk_kv = (q + int(rng.integers(0, 5000)),) if q else ()
        tokens = decodes * dq
        loads.append(
            StepLoad(q + tokens, tokens + (q > 0), (q,) if q else (), chunk_kv, decodes, kv, dq)
        )
    return loads


@pytest.mark.parametrize(
    ("host", "hidden"),
    [
        (NO_HOST_FLOOR, NO_OVERHEAD),
        (
            HostFloor(512, 8e-3, 30e-3),
            EngineOverhead(base_s=3e-3, per_seq_s=2e-5, per_token_s=1e-7),
        ),
    ],
)
def test_the_pricer_gives_the_methods_floats(host, hidden):
    table = compile_roofline(get_shape("llama-3.1-8b"), get_accelerator("h100"), 1, grid=GRID)
    overhead = EngineOverhead(base_s=1e-3, per_seq_s=2e-5, per_token_s=1e-7)
    table = replace(table, host=host, hidden=hidden, overhead=overhead)
    steady, idle = table.pricer(), table.pricer(idle=True)
    loads = _loads(np.random.default_rng(0))
    assert [steady(ld) for ld in loads] == [table.step_time_s(ld) for ld in loads]
    assert [idle(ld) for ld in loads] == [table.idle_step_time_s(ld) for ld in loads]
    if host.graph_tokens:  # the floor binds somewhere, so its branch is exercised
        assert any(table.kernel_time_s(ld) in (host.piecewise_s, host.eager_s) for ld in loads)


def test_a_model_without_a_pricer_is_priced_by_its_methods():
    class Constant:
        def step_time_s(self, load):
            return 0.25

        def idle_step_time_s(self, load):
            return 0.5

    model = Constant()
    load = StepLoad(1, 1, (), (), 1, 1)
    assert step_pricer(model)(load) == 0.25 and step_pricer(model, idle=True)(load) == 0.5
