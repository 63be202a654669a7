"""Streaming step figures (`StepStats`) and the columnar `RunLog`: hand-worked figures,
warm-up exclusion, bulk runs equal to single steps, bounded series, scattered parts."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from optimizer.sim.histogram import LogHistogram
from optimizer.sim.metrics import RunLog
from optimizer.sim.step_stats import CHUNK_STEPS, RUN_BUFFER_STEPS, SERIES_BINS, StepStats


def _price(n: int, kv: int) -> float:
    return 0.010  # every decode-only step: 10 ms


def test_a_hand_worked_mix_of_steps() -> None:
    """A 30 ms prefill-only step (2 prompts), a 10 ms decode-only step of 3, a 25 ms mixed
    step (2 decodes + 1 prompt: 15 ms of stall each, slower than 2 x 10 ms: 2 spike
    tokens) and a 15 ms mixed one (1 decode: 5 ms stall, no spike)."""
    itl = LogHistogram()
    stats = StepStats(itl, _price)
    stats.add(0.030, 0.030, 0, 2, 4, 0)
    stats.add(0.040, 0.010, 3, 3, 5, 100)
    stats.add(0.065, 0.025, 2, 3, 7, 80)
    stats.add(0.080, 0.015, 1, 2, 6, 40)
    s = stats.summary()
    assert s.num_steps == 4 == s.num_measured_steps
    assert (s.num_prefill_only_steps, s.num_decode_only_steps, s.num_mixed_steps) == (1, 1, 2)
    assert s.prefill_only_s == pytest.approx(0.030)
    assert s.decode_only_s == pytest.approx(0.010)
    assert s.mixed_s == pytest.approx(0.040)
    assert s.busy_s == pytest.approx(0.080)
    assert s.decode_tokens_in_mixed_steps == 3
    assert s.prefill_stall_token_s == pytest.approx(2 * 0.015 + 0.005)
    assert s.itl_spike_tokens == 2
    assert s.peak_kv_used_blocks == 7
    # ITL: 3 tokens waited 10 ms, 2 waited 25 ms, 1 waited 15 ms
    assert itl.total == 6.0
    assert itl.mean == pytest.approx((0.030 + 0.050 + 0.015) / 6)
    assert itl.percentile(0.5) == pytest.approx(0.010, rel=0.005)
    assert itl.max == 0.025
    assert pickle.loads(pickle.dumps(s)).busy_s == s.busy_s


def test_steps_before_measuring_count_only_in_steps_peak_and_series() -> None:
    itl = LogHistogram()
    stats = StepStats(itl, _price, from_s=math.inf)
    stats.add(1.0, 0.5, 4, 4, 9, 10)
    stats.measure_from(2.0)
    stats.add(2.0, 0.5, 4, 4, 3, 10)  # ends at the start: not measured
    stats.add(2.5, 0.5, 2, 2, 3, 10)
    s = stats.summary()
    assert s.num_steps == 3 and s.num_measured_steps == 1
    assert s.busy_s == 0.5 and itl.total == 2.0
    assert s.peak_kv_used_blocks == 9
    assert s.series_busy_s.sum() == pytest.approx(1.5)


@pytest.mark.parametrize("k", [CHUNK_STEPS + 77, RUN_BUFFER_STEPS + 77])
def test_a_run_of_decode_steps_equals_the_steps_one_by_one(k: int) -> None:
    """Past a flush of the single steps' buffer, and past the runs' buffer (absorbed at
    once); a short run buffered before it is flushed first."""
    rng = np.random.default_rng(0)
    durs = rng.uniform(0.005, 0.02, k + 5)
    ends = 3.0 + np.cumsum(durs)
    kv_used = np.arange(k + 5) // 16 + 10
    one, bulk = LogHistogram(), LogHistogram()
    a, b = StepStats(one, _price), StepStats(bulk, _price)
    for i in range(k + 5):
        a.add(float(ends[i]), float(durs[i]), 5, 5, int(kv_used[i]), 0)
    b.add_run(ends[:5], durs[:5], 5, 10, kv_used[1:5] - 10)
    b.add_run(ends[5:], durs[5:], 5, int(kv_used[5]), kv_used[6:] - kv_used[5])
    sa, sb = a.summary(), b.summary()
    assert (sa.num_steps, sa.num_decode_only_steps, sa.peak_kv_used_blocks) == (
        sb.num_steps, sb.num_decode_only_steps, sb.peak_kv_used_blocks)  # fmt: skip
    assert sa.busy_s == pytest.approx(sb.busy_s, rel=1e-12)
    assert np.array_equal(one.counts, bulk.counts) and one.total == bulk.total == 5.0 * (k + 5)
    np.testing.assert_allclose(sa.series_seqs_s, sb.series_seqs_s, rtol=1e-12)
    np.testing.assert_allclose(sa.series_kv_s, sb.series_kv_s, rtol=1e-12)
    with pytest.raises(ValueError, match="add_run"):
        b.add_run(ends, durs[:-1], 5, 10, kv_used)


def test_the_series_stays_bounded_and_keeps_its_mean() -> None:
    """A step of 1 s with 3 sequences every 10 s for 10,000 s: the bins widen (pairs merge)
    instead of growing, and the re-binned series still says 3 sequences while busy."""
    stats = StepStats(LogHistogram())
    for i in range(1000):
        stats.add(10.0 * i + 1.0, 1.0, 3, 3, 6, 0)
    s = stats.summary()
    assert s.series_busy_s.size == SERIES_BINS and s.bin_s * SERIES_BINS > 9991.0
    assert s.series_busy_s.sum() == pytest.approx(1000.0)
    t, batch, util = s.series(10_000.0, 12, 500)
    assert t.size == batch.size == 500 and t[1] == pytest.approx(20.0)
    # each output bin of 20 s holds ~2 steps of 1 s: duration-weighted mean of 3 sequences
    busy = batch > 0
    np.testing.assert_allclose(batch[busy], 3.0, rtol=1e-9)
    np.testing.assert_allclose(util[busy], 0.5, rtol=1e-9)


def test_scattered_parts_rebuild_the_whole_log() -> None:
    whole, even, odd = RunLog(6), RunLog(3), RunLog(3)
    for rid in range(6):
        whole.arrival_s[rid] = float(rid)
        whole.finish_s[rid] = rid + 0.5
        whole.num_preemptions[rid] = rid % 2
        part = even if rid % 2 == 0 else odd
        part.arrival_s[rid // 2] = float(rid)
        part.finish_s[rid // 2] = rid + 0.5
        part.num_preemptions[rid // 2] = rid % 2
    even.itl.add(0.01, 3.0)
    odd.itl.add(0.02)
    even.tokens_emitted, odd.tokens_emitted = 5, 7
    merged = RunLog(6)
    merged.scatter(even, np.array([0, 2, 4]))
    merged.scatter(odd, np.array([1, 3, 5]))
    for name in ("arrival_s", "finish_s", "num_preemptions", "first_token_s"):
        np.testing.assert_array_equal(merged.column(name), whole.column(name))
    assert merged.itl.total == 4.0 and merged.tokens_emitted == 12
    assert pickle.loads(pickle.dumps(merged)).column("finish_s")[5] == 5.5
    with pytest.raises(ValueError, match="3 request ids for a part of 2"):
        merged.scatter(RunLog(2), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="request ids must be in"):
        merged.scatter(RunLog(1), np.array([6]))


def test_a_result_is_plain_picklable_data_with_its_itl_histogram() -> None:
    from optimizer.config import InstanceConfig, ServingConfig
    from optimizer.latency.analytic import LinearLatency, SingleLatencySource
    from optimizer.sim import simulate
    from optimizer.workload import Workload

    n = 40
    wl = Workload(np.arange(n) * 0.05, np.full(n, 300), np.full(n, 20))
    cfg = ServingConfig.colocated("llama-3.1-8b", InstanceConfig(max_num_batched_tokens=256))
    res = simulate(wl, cfg, SingleLatencySource(LinearLatency(7e-3, 27e-6, 39e-9, 1e-9)))
    back = pickle.loads(pickle.dumps(res))
    assert back.itl_hist.total == n * 19  # every token after the first waited one gap
    assert back.itl.p99 == res.itl_hist.percentile(0.99) and back.itl.max == res.itl_hist.max
    values, weights = res.itl_hist.representatives()
    np.testing.assert_array_equal(res.itl_gaps_s, values)
    assert weights.sum() == n * 19
