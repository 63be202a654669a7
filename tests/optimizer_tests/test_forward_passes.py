"""Measured engine steps (forward-pass metrics): reading them, and how well the B300
tables price vLLM 0.20.1's steps (the per-step check, mandatory in CI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.engines import EngineRelease
from optimizer.validation.compare import ValidationError
from optimizer.validation.forward_passes import (
    StepPhase,
    phase_errors,
    read_forward_pass_metrics,
    synchronous,
)

HEADER = (
    "phase,workload_segment,counter_id,worker_id,dp_rank,sum_prefill_tokens,"
    "num_prefill_requests,sum_prefill_kv_tokens,var_prefill_length,num_decode_requests,"
    "sum_decode_kv_tokens,var_decode_kv_tokens,latency_ms\n"
)


def test_steps_are_read_with_their_loads_and_idle_gaps(tmp_path: Path) -> None:
    path = tmp_path / "fpm.csv"
    path.write_text(HEADER + "context,sweep,10,0,0,1000,1,0,0,0,0,0,50.0\n"
                    "mixed,real,11,0,0,4097,2,4095,0,2,8193,0.25,200.0\n"
                    "decode,real,12,0,0,0,0,0,0,3,300,1.0,10.0\n"
                    "decode,real,20,0,0,0,0,0,0,3,303,1.0,11.0\n", encoding="utf-8")  # fmt: skip
    pre, mix, dec, after_gap = read_forward_pass_metrics(path)
    assert pre.phase is StepPhase.PREFILL and pre.load.prefill_q == (1000,)
    assert pre.after_idle and synchronous(pre)  # the first step, and nothing ran beside it
    # two chunks share 4,097 tokens and a 4,095-token prefix evenly (only sums are recorded)
    assert mix.load.prefill_q == (2049, 2048) and mix.load.prefill_kv == (4096, 4095)
    assert mix.load.num_decode_seqs == 2 and mix.load.num_logits == 4
    assert not synchronous(mix) and dec.latency_s == pytest.approx(0.010)
    assert after_gap.after_idle and not dec.after_idle
    errs = phase_errors([pre, mix, dec], lambda s: 2 * s.latency_s)
    assert [e.median_error for e in errs] == [1.0, 1.0, 1.0]


def test_a_malformed_file_names_the_line_and_columns(tmp_path: Path) -> None:
    path = tmp_path / "fpm.csv"
    path.write_text("phase,latency_ms\ndecode,1\n", encoding="utf-8")
    with pytest.raises(ValidationError, match="missing columns"):
        read_forward_pass_metrics(path)
    path.write_text(HEADER + "decode,real,1,0,0,0,0,0,0,x,0,0,1.0\n", encoding="utf-8")
    with pytest.raises(ValidationError, match=r"fpm\.csv:2: expected a phase"):
        read_forward_pass_metrics(path)
    path.write_text(HEADER + "decode,real,1,0,0,0,0,0,0,1,10,0,-1\n", encoding="utf-8")
    with pytest.raises(ValidationError, match=r"fpm\.csv:2: latencies must be > 0"):
        read_forward_pass_metrics(path)


@pytest.mark.shared_data
def test_the_b300_tables_price_vllm_0_20_steps_within_5_percent(shared_data, tmp_path) -> None:
    """The per-step check of the engine-generation issue (benchmarks/bench_devset.py prints
    it per TP degree): over TP 1/2/4/8, each step type's median |error| within 5% when
    priced as vLLM 0.20.1 runs a step on B300."""
    from optimizer.latency import TableReach, build_catalog, fit_latency_model
    from optimizer.latency.model import FitOptions
    from optimizer.shapes import DEFAULT_PRECISION, get_shape
    from optimizer.validation.forward_passes import price_step_s
    from profiler.importers import ImportFormat, import_profile

    folder = shared_data / "profiles" / "aiconfigurator" / "b300_sxm"
    samples = import_profile(folder, ImportFormat.AICONFIGURATOR).samples
    model = fit_latency_model(samples, accelerator="b300", options=FitOptions(max_iter=100))
    shape = get_shape("qwen3-32b")
    catalog = build_catalog(shape, [model])
    run = shared_data / "observations" / "aic-fpm-b300"
    run = run / "fpm_upfront_qwen32_full_once_20260613_194007"
    steps, prices = [], []
    for tp in (1, 2, 4, 8):
        table = catalog.for_instance(
            "b300", tp, TableReach(8192, 256, 8192, 32768), DEFAULT_PRECISION,
            engine=EngineRelease("vllm", "0.20.1"),
        )  # fmt: skip
        mine = read_forward_pass_metrics(run / f"tp{tp}_ep1_past4096" / "fpm_metrics_detail.csv")
        steps += mine
        prices += [price_step_s(table, s) for s in mine]
    price_of = {id(s): p for s, p in zip(steps, prices, strict=True)}
    errors = {e.phase: e for e in phase_errors(steps, lambda s: price_of[id(s)])}
    assert set(errors) == set(StepPhase)
    for phase, e in errors.items():
        assert e.median_abs_error <= 0.05, (phase, e)


def test_a_record_swallowed_by_the_one_before_is_compared_with_it() -> None:
    """vLLM at TP 1 logs two consecutive host-bound prefill steps as 74 ms and 0.4 ms.
    Priced 38 ms each, the pair is one comparison: 76 / 74.4 - 1 = +2.2%, not -49% and
    +9,400%. A short record after an idle gap is a step of its own."""
    from optimizer.latency import StepLoad
    from optimizer.validation.forward_passes import MeasuredStep

    load = StepLoad(928, 1, (928,), (4096,))
    long_ = MeasuredStep(StepPhase.PREFILL, "sweep", load, 0.074, True)
    short = MeasuredStep(StepPhase.PREFILL, "sweep", load, 0.0004, False)
    (e,) = phase_errors([long_, short], lambda s: 0.038)
    assert e.num_steps == 1 and e.median_error == pytest.approx(0.076 / 0.0744 - 1.0)
    after_idle = MeasuredStep(StepPhase.PREFILL, "sweep", load, 0.0004, True)
    (e,) = phase_errors([long_, after_idle], lambda s: 0.038)
    assert e.num_steps == 2


def test_a_chunk_that_continues_a_prompt_is_a_steady_step() -> None:
    """A prefill-only step of a fresh prompt ran with nothing beside it (its CPU work in
    line); one that continues a prompt (KV before its tokens) was planned while the
    prompt's previous chunk ran, as async scheduling does and the simulator prices it."""
    from optimizer.latency import StepLoad
    from optimizer.validation.forward_passes import MeasuredStep

    fresh = MeasuredStep(StepPhase.PREFILL, "sweep", StepLoad(3168, 1, (3168,), (3168,)),
                         0.04, False)  # fmt: skip
    tail = MeasuredStep(StepPhase.PREFILL, "sweep", StepLoad(928, 1, (928,), (4096,)),
                        0.04, False)  # fmt: skip
    assert synchronous(fresh) and not synchronous(tail)
