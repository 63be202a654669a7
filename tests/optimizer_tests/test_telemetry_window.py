"""Two vLLM scrapes read into a window: the counter-delta arithmetic, label selection,
and each error a user meets (reset, missing series, other engines, no traffic, ...)."""

from __future__ import annotations

import numpy as np
import pytest

from optimizer.telemetry import (
    BucketMismatchError,
    CounterResetError,
    EmptyWindowError,
    ForeignEngineError,
    MissingMetricError,
    TelemetryError,
    WindowError,
    observed_window,
    parse_exposition,
    read_vllm,
)
from optimizer.telemetry import vllm as names
from optimizer.telemetry.synthetic import VllmTraffic, render_vllm_page, token_buckets


def _traffic(n: int, *, ttft_s: float = 0.05, preemptions: int = 0) -> VllmTraffic:
    ones = np.ones(n)
    return VllmTraffic(
        ttft_s=ttft_s * ones, e2e_s=2.0 * ones, queue_s=0.01 * ones,
        prompt_tokens=np.full(n, 300), output_tokens=np.full(n, 40),
        itl_gaps_s=np.array([0.02]), itl_gap_weights=np.array([39.0 * n]),
        num_preemptions=preemptions,
    )  # fmt: skip


def _without_types(page: str) -> str:
    """A page's series only, to append to another page (a family has one # TYPE line)."""
    return "\n".join(line for line in page.splitlines() if not line.startswith("#")) + "\n"


def _read(text: str, source: str, model_name: str | None = None):
    return read_vllm(parse_exposition(text, source=source), source=source, model_name=model_name)


def test_counter_deltas_golden() -> None:
    first = _traffic(12, preemptions=2)
    both = first.plus(_traffic(40, ttft_s=0.3, preemptions=5))
    before = _read(render_vllm_page(first, kv_cache_usage=0.1), "BEFORE")
    after = _read(render_vllm_page(both, kv_cache_usage=0.6, num_waiting=4), "AFTER")
    w = observed_window(before, after, 600.0)
    assert w.num_requests == 40  # 52 - 12 finished, summed over finished_reason
    assert w.request_rate == pytest.approx(40 / 600)
    assert w.num_preemptions == 5  # 7 - 2
    assert w.num_prompt_tokens == 40 * 300 and w.num_generation_tokens == 40 * 40
    assert w.ttft.count == 40 and w.ttft.sum == pytest.approx(40 * 0.3)
    # All 40 window TTFTs are 0.3 s: in vLLM's (0.25, 0.5] bucket, ranks 0..40 of the window.
    assert w.ttft.quantile(0.5) == pytest.approx(0.25 + 0.25 * 0.5)
    assert w.itl.count == 39 * 40 and w.itl_name == names.ITL
    assert w.queue is not None and w.queue.mean == pytest.approx(0.01)
    assert w.kv_cache_usage == 0.6 and w.num_requests_waiting == 4  # gauges read at AFTER
    assert w.prompt_tokens.upper_bounds[:-1] == token_buckets(8192)


def test_older_vllm_itl_name_is_read() -> None:
    t = _traffic(5)
    before = _read(render_vllm_page(t, itl_name=names.ITL_OLD), "BEFORE")
    after = _read(render_vllm_page(t.plus(t), itl_name=names.ITL_OLD), "AFTER")
    assert observed_window(before, after, 60.0).itl_name == names.ITL_OLD


def test_counter_reset_is_an_error() -> None:
    before = _read(render_vllm_page(_traffic(30)), "BEFORE")
    after = _read(render_vllm_page(_traffic(10)), "AFTER")
    with pytest.raises(CounterResetError) as info:
        observed_window(before, after, 600.0)
    assert str(info.value) == (
        "counter reset between the scrapes: vllm:request_success_total fell from 30 to 10; "
        "take both scrapes from one server process"
    )


def test_a_histogram_reset_is_an_error_too() -> None:
    before = _read(render_vllm_page(_traffic(10, ttft_s=0.05)), "BEFORE")
    after = _read(render_vllm_page(_traffic(20, ttft_s=0.3)), "AFTER")  # le=0.06: 10 -> 0
    with pytest.raises(CounterResetError, match=r'time_to_first_token_seconds_bucket\{le="0.06"\}'):
        observed_window(before, after, 600.0)


def test_missing_series_says_which_and_where() -> None:
    page = render_vllm_page(_traffic(3))
    kept = "\n".join(line for line in page.splitlines() if names.TTFT not in line)
    with pytest.raises(MissingMetricError) as info:
        _read(kept, "AFTER")
    assert str(info.value) == (
        "no vllm:time_to_first_token_seconds histogram in AFTER: is this a vLLM /metrics page?"
    )
    with pytest.raises(MissingMetricError, match=r"no vllm:\.\.\. series in BEFORE"):
        _read("process_cpu_seconds_total 3.5\n", "BEFORE")


@pytest.mark.parametrize(
    ("line", "engine"),
    [
        ('sglang:num_running_reqs{model_name="m"} 2', "SGLang"),
        ("tgi_request_count 10", "Hugging Face TGI"),
    ],
)
def test_other_engines_pages_are_named(line: str, engine: str) -> None:
    with pytest.raises(ForeignEngineError) as info:
        _read(f"# TYPE x gauge\n{line}\n", "BEFORE")
    assert f"BEFORE looks like {engine}'s /metrics" in str(info.value)
    assert "only vLLM's vllm: names are read" in str(info.value)


def test_a_window_without_traffic_is_an_error() -> None:
    page = _read(render_vllm_page(_traffic(7)), "BEFORE")
    with pytest.raises(EmptyWindowError, match="no request finished in the window"):
        observed_window(page, page, 600.0)


def test_bucket_boundaries_that_change_are_an_error() -> None:
    t = _traffic(5)
    before = _read(render_vllm_page(t, max_model_len=4096), "BEFORE")
    after = _read(render_vllm_page(t.plus(t), max_model_len=8192), "AFTER")
    with pytest.raises(BucketMismatchError, match="vllm:request_prompt_tokens: the bucket"):
        observed_window(before, after, 600.0)


@pytest.mark.parametrize("window_s", [0.0, -5.0, float("nan"), float("inf")])
def test_window_must_be_positive(window_s: float) -> None:
    page = _read(render_vllm_page(_traffic(3)), "BEFORE")
    with pytest.raises(WindowError, match="--window-s must be a positive number of seconds"):
        observed_window(page, page, window_s)


def test_two_models_need_a_choice() -> None:
    a = render_vllm_page(_traffic(3), model_name="a")
    b = render_vllm_page(_traffic(9), model_name="b")
    both = a + _without_types(b)
    with pytest.raises(WindowError, match=r"2 models \(a, b\); choose one with --model-name"):
        _read(both, "AFTER")
    assert _read(both, "AFTER", model_name="b").num_requests_success == 9
    with pytest.raises(WindowError, match="no series with model_name='c'"):
        _read(both, "AFTER", model_name="c")


def test_engines_are_summed() -> None:
    one = render_vllm_page(_traffic(4))
    two = one + _without_types(one.replace('engine="0"', 'engine="1"'))
    read = _read(two, "AFTER")
    assert read.num_requests_success == 8 and read.ttft.count == 8
    assert read.kv_cache_usage == 0.25  # a fraction: the mean over engines, not the sum


def test_a_bucket_bound_that_is_not_a_number_is_an_error() -> None:
    page = render_vllm_page(_traffic(3)).replace('le="0.001"', 'le="fast"')
    with pytest.raises(TelemetryError, match=r'_bucket\{le="fast"\}: expected a number or \+Inf'):
        _read(page, "AFTER")


def test_the_itl_name_must_not_change_between_scrapes() -> None:
    t = _traffic(5)
    before = _read(render_vllm_page(t, itl_name=names.ITL_OLD), "BEFORE")
    after = _read(render_vllm_page(t.plus(t)), "AFTER")
    with pytest.raises(MissingMetricError, match="BEFORE has vllm:time_per_output_token_seconds"):
        observed_window(before, after, 60.0)
